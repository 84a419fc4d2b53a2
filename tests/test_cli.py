"""The command line as a new user meets it: every flag's help with its default, run-onnx on models with symbolic
dims, NaN outputs and files that are not ONNX, and onnx-conformance --gpu on a machine without a GPU."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import __main__ as cli

onnx = pytest.importorskip("onnx", reason="the onnx extra: pip install graph_executor_v2[onnx]")
from onnx import TensorProto, helper  # noqa: E402


def _subcommands():
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_every_flag_has_help_with_its_default():
    from graph_executor_v2.distributed import run

    launcher = {}

    def keep_parser(self, args=None, namespace=None):
        launcher["parser"] = self
        raise SystemExit(0)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", keep_parser)
        with pytest.raises(SystemExit):
            run.parse([])
    for name, sub in {**_subcommands(), "distributed.run": launcher["parser"]}.items():
        text = sub.format_help()
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest}: no help text"
            needs_default = action.option_strings and not action.required and not isinstance(action.default, bool)
            if needs_default:
                help_text = sub._get_formatter()._get_help_string(action)
                assert "default" in help_text, f"{name} {action.option_strings}: help does not say its default"
        assert "default: None" not in text, name
    digits_help = " ".join(_subcommands()["train-digits"].format_help().split())
    assert "examples per step (default: 64)" in digits_help and "(default: 0.003)" in digits_help
    gpt_help = " ".join(_subcommands()["train-gpt"].format_help().split())
    from graph_executor_v2.apps.gpt import CPU_DEFAULTS as cpu, GPU_DEFAULTS as gpu
    assert f"blocks (default: {gpu.layers} on the GPU, {cpu.layers} on the CPU)" in gpt_help
    assert f"training steps (default: {gpu.steps} on the GPU, {cpu.steps} on the CPU)" in gpt_help
    assert "the device's config" not in gpt_help


def test_the_demo_says_where_fusion_pays(capsys):
    assert cli.main(["demo", "--cpu", "--sizes", "16,32,8", "--batch", "4", "--repetitions", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fused plan (" in out and "unfused plan (" in out
    assert "fusion pays on the GPU, not here: the CPU backend runs every node as its float64 NumPy reference" in out


def _relu_model(path, shape):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return str(path)


def test_run_onnx_binds_a_symbolic_batch_dim_to_1_and_says_so(tmp_path, capsys):
    pytest.importorskip("onnxruntime", reason="the onnx extra: pip install graph_executor_v2[onnx]")
    model = _relu_model(tmp_path / "relu.onnx", ["batch", 4])
    assert cli.main(["run-onnx", model, "--cpu"]) == 0
    out = capsys.readouterr().out
    assert "dim 'batch' (axis 0 of input 'x') is symbolic: taken as a batch of 1 (--dim batch=SIZE sets it)" in out
    assert "output 'y': float32[1, 4]" in out and "matches onnxruntime" in out
    assert cli.main(["run-onnx", model, "--cpu", "--dim", "batch=3"]) == 0
    out = capsys.readouterr().out
    assert "output 'y': float32[3, 4]" in out and "taken as a batch of 1" not in out


def test_run_onnx_asks_for_the_other_symbolic_dims(tmp_path, capsys):
    model = _relu_model(tmp_path / "seq.onnx", ["batch", "seq", None])
    assert cli.main(["run-onnx", model, "--cpu"]) == 2
    error = capsys.readouterr().err
    assert ("axis 1 of input 'x' is the symbolic dim 'seq'; axis 2 of input 'x' is the symbolic dim 'x:2': give "
            "each a size with --dim NAME=SIZE") in error
    assert cli.main(["run-onnx", model, "--cpu", "--dim", "sequence=4"]) == 2
    assert "--dim: the model has no symbolic dim 'sequence'; its symbolic dims: batch, seq, x:2" in \
        capsys.readouterr().err
    assert cli.main(["run-onnx", model, "--cpu", "--dim", "seq=5", "--dim", "x:2=2", "--dim", "batch=2"]) in (0, 1)
    assert "output 'y': float32[2, 5, 2]" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["run-onnx", model, "--dim", "seq"])
    assert "expected NAME=SIZE with SIZE an int >= 1, got 'seq'" in capsys.readouterr().err


def test_run_onnx_counts_a_nan_as_a_mismatch(tmp_path, capsys, monkeypatch):
    pytest.importorskip("onnxruntime", reason="the onnx extra: pip install graph_executor_v2[onnx]")
    model = _relu_model(tmp_path / "relu.onnx", [2, 3])
    real_run = ge2.ExecutorV2.run

    def run_with_a_nan(self, feeds, *args, **kwargs):
        outputs = real_run(self, feeds, *args, **kwargs)
        outputs["y"][1, 2] = np.nan
        return outputs

    monkeypatch.setattr(ge2.ExecutorV2, "run", run_with_a_nan)
    assert cli.main(["run-onnx", model, "--cpu"]) == 1
    out = capsys.readouterr().out
    assert "1 element(s) NaN in one and not the other" in out and "DIFFERS from onnxruntime" in out


def test_difference_treats_nan_and_infinity_as_values():
    finite = np.array([1.0, -2.0, 3.0], np.float32)
    assert cli._difference(finite, finite + np.float32(0.5)) == (0.5, 3.5, 0)  # scale: the reference's
    assert cli._difference(np.array([1.0, np.nan, np.inf]), np.array([1.0, np.nan, np.inf])) == (0.0, 1.0, 0)
    error, scale, nans = cli._difference(np.array([np.nan, 1.0]), np.array([2.0, 1.0]))
    assert (error, scale, nans) == (np.inf, 2.0, 1)
    assert cli._difference(np.array([np.inf]), np.array([5.0]))[0] == np.inf


def test_a_file_that_is_not_onnx_is_named(tmp_path, capsys):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07not an onnx model at all\xff\xff")
    from graph_executor_v2.frontend import onnx as onnx_frontend

    with pytest.raises(ValueError, match=f"model: '{garbage}' is not an ONNX model: it does not parse"):
        onnx_frontend.load(garbage)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=f"model: '{empty}' is not an ONNX model: it holds no graph"):
        onnx_frontend.load(str(empty))
    with pytest.raises(IsADirectoryError, match=f"'{tmp_path}' is a directory"):
        onnx_frontend.load(tmp_path)
    assert cli.main(["run-onnx", str(garbage), "--cpu"]) == 2
    assert f"run-onnx: model: '{garbage}' is not an ONNX model" in capsys.readouterr().err
    assert cli.main(["run-onnx", str(tmp_path / "missing.onnx"), "--cpu"]) == 2
    assert "missing.onnx" in capsys.readouterr().err


def test_onnx_conformance_gpu_without_a_gpu_is_one_line_and_fails(capsys):
    if ge2.device.device_count() > 0:
        pytest.skip("a GPU is present: --gpu runs")
    assert cli.main(["onnx-conformance", "--gpu"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines() == ["onnx-conformance: --gpu needs an NVIDIA GPU and this machine has "
                                                 "none (leave --gpu out to run the CPU backend)"]
