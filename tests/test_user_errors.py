"""Errors a new user meets in the first hour, each asserted on its content: checkpoints that cannot be read or
written name the path and the cause, ONNX files that do not parse name the file, CPU executors say they take NumPy
arrays, unknown ops and attributes suggest the closest names, and a missing optional dependency names its extra."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import _optional


def _trainer(rng):
    g = ge2.ir.Graph("tiny")
    x = g.input("x", ("B", 3), "float32")
    g.output(g.sum(g.matmul(x, g.param("w", rng.standard_normal((3, 2)).astype(np.float32)))), "loss")
    return ge2.train.Trainer(g, loss="loss", optimizer=ge2.train.SGD(lr=0.1))


# --- checkpoints ---------------------------------------------------------------------------------------------------
def test_loading_a_bad_checkpoint_names_the_path_and_the_cause(rng, tmp_path):
    trainer = _trainer(rng)
    good = tmp_path / "good.safetensors"
    trainer.save(good)
    data = good.read_bytes()
    cases = {"empty.safetensors": (b"", "the file is empty"),
             "truncated.safetensors": (data[:-10], f"the file ({len(data) - 10} bytes) is corrupt or truncated"),
             "garbage.safetensors": (bytes(range(256)) * 4, "the file (1024 bytes) is corrupt or truncated")}
    for name, (content, cause) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(ValueError) as caught:
            trainer.load(path)
        assert f"'{path}' is not a readable safetensors checkpoint: {cause}" in str(caught.value)
    with pytest.raises(IsADirectoryError, match=f"path: '{tmp_path}' is a directory, not a checkpoint file"):
        trainer.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint at '.*missing.safetensors' \\(no such file\\)"):
        trainer.load(tmp_path / "missing.safetensors")
    trainer.load(good)  # and a good one still loads


def test_a_failed_save_names_the_path_and_leaves_no_temporary_file(rng, tmp_path):
    trainer = _trainer(rng)
    (tmp_path / "sub").mkdir()
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(OSError, match=f"cannot save the checkpoint to '{tmp_path}': it is a directory"):
        trainer.save(tmp_path)
    missing = tmp_path / "no" / "such" / "dir" / "ckpt.safetensors"
    with pytest.raises(OSError) as caught:
        trainer.save(missing)
    message = str(caught.value)
    assert f"cannot save the checkpoint to '{missing}': the directory {missing.parent} does not exist" in message
    assert ".tmp" not in message
    (tmp_path / "sub" / "taken.safetensors").mkdir()  # a non-empty directory where the file should go
    (tmp_path / "sub" / "taken.safetensors" / "x").write_text("x")
    with pytest.raises(OSError, match="it is a directory"):
        trainer.save(tmp_path / "sub" / "taken.safetensors")
    assert sorted(os.listdir(tmp_path)) == before
    assert sorted(os.listdir(tmp_path / "sub")) == ["taken.safetensors"]


# --- executors and graphs ------------------------------------------------------------------------------------------
def test_a_cpu_executor_says_it_takes_numpy_arrays():
    g = ge2.ir.Graph("t")
    g.output(g.relu(g.input("x", (2, 3), "float32")), "y")
    executor = ge2.ExecutorV2(g, device="cpu")
    with pytest.raises(TypeError) as caught:
        executor.run({"x": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]})
    message = str(caught.value)
    assert "input 'x': a device='cpu' executor takes NumPy arrays, got list" in message
    assert "np.asarray" in message and "CUDA" not in message


def test_unknown_ops_and_attributes_suggest_the_closest_names():
    g = ge2.ir.Graph("t")
    x = g.input("x", (2, 3), "float32")
    with pytest.raises(AttributeError) as caught:
        g.rleu(x)
    message = str(caught.value)
    assert "Graph has no attribute or op 'rleu'; did you mean 'relu'" in message  # closest first
    assert len(message) < 300  # a suggestion, not the list of every op
    with pytest.raises(ValueError, match=r"unknown attribute\(s\) \['axs'\] for op 'softmax'; did you mean 'axis'\?"):
        g.softmax(x, axs=1)


# --- optional dependencies -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("module", sorted(_optional.EXTRAS))
def test_a_missing_optional_dependency_names_its_extra(module, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # import then raises ImportError, as when it is not installed
    extra, distribution = _optional.EXTRAS[module]
    with pytest.raises(ImportError, match=rf"the thing needs {distribution}, which is not installed: pip install "
                                          rf"graph_executor_v2\[{extra}\]"):
        _optional.require(module, "the thing")


def test_library_entry_points_name_the_extra(rng, tmp_path, monkeypatch):
    trainer = _trainer(rng)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(ImportError, match=r"Trainer.save needs safetensors.*graph_executor_v2\[train\]"):
        trainer.save(tmp_path / "x.safetensors")
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError, match=r"progress bar \(progress=False goes without\) needs tqdm.*\[train\]"):
        trainer.fit({"x": np.ones((4, 3), np.float32)})
    monkeypatch.setitem(sys.modules, "onnx", None)
    from graph_executor_v2.frontend import onnx as onnx_frontend

    with pytest.raises(ImportError, match=r"ge2.frontend.onnx needs onnx.*graph_executor_v2\[onnx\]"):
        onnx_frontend.load(str(tmp_path / "model.onnx"))


def test_print_plan_is_a_short_summary_and_describe_has_the_arena():
    g = ge2.ir.Graph("mlp")
    x = g.input("x", ("B", 128), "float32")
    w = g.param("w", np.full((128, 256), 0.5, np.float32))
    g.output(g.relu(g.add(g.matmul(x, w), g.param("b", np.zeros(256, np.float32)))), "y")
    plan = ge2.ExecutorV2(g, device="cpu").plan({"x": (64, 128)})
    summary = repr(plan)
    assert summary == str(plan) and "\n" not in summary and len(summary) < 250
    assert summary.startswith("<Plan of 'mlp' for (x: float32[64, 128]): 1 kernel(s), memory reduced from")
    assert "0.5" not in summary and "arena=" not in summary  # neither the weights nor the arena object
    described = plan.describe()
    assert "gemm" in described and "-> numpy_reference [stream 0]" in described
    assert f"arena ({plan.memory.arena_bytes} bytes):" in described
    for name, offset in plan.memory.offsets.items():
        assert f"[{offset:>10}] {name}: float32[" in described
    assert "x: float32[64, 128], 32768 bytes" in described
    assert "parameters: 2 (132096 bytes, outside the arena)" in described
