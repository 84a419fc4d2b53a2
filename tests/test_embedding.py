"""embedding: closed-form references and validation (CPU); every kernel x dtype x id dtype on the GPU (the gather
is exact), the deterministic scatter-add backward (runs crossing tile boundaries, one id repeated thousands of
times, bitwise reproducibility), bad ids on the device, plan-style launches and torch interop."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2 import _native
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, Problem
from graph_executor_v2.ops import embedding as emb
from graph_executor_v2.testing import assert_close, random_array

DTYPES = ("float32", "float16", "bfloat16")
ID_DTYPES = ("int32", "int64")
native_built = pytest.mark.skipif(not _native.is_built("_ops_embedding"), reason="_ops_embedding not built")


def max_repeat(ids) -> int:
    ids = np.asarray(ids).reshape(-1)
    return int(np.bincount(ids).max()) if ids.size else 1


# ---------------------------------------------------------------------------------------------------------------
# CPU: references, inference, validation
# ---------------------------------------------------------------------------------------------------------------
def test_reference_closed_form():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    ids = np.array([[2, 0], [3, 2]])
    np.testing.assert_array_equal(emb.reference(table, ids), [[[6, 7, 8], [0, 1, 2]], [[9, 10, 11], [6, 7, 8]]])
    assert emb.reference(table, np.array(1)).tolist() == [3, 4, 5]  # 0-d ids: one row
    dy = np.arange(12, dtype=np.float64).reshape(2, 2, 3)
    expected = np.array([[3, 4, 5], [0, 0, 0], [0 + 9, 1 + 10, 2 + 11], [6, 7, 8]])
    np.testing.assert_array_equal(emb.reference_backward(dy, ids, 4), expected)


def test_reference_backward_is_the_adjoint(rng):
    """<dy, forward(table)> = <backward(dy), table> for every table: the scatter-add is the gather's transpose."""
    table = rng.standard_normal((9, 5))
    ids = rng.integers(0, 9, (4, 6))
    dy = rng.standard_normal((4, 6, 5))
    lhs = float(np.sum(dy * emb.reference(table, ids)))
    rhs = float(np.sum(emb.reference_backward(dy, ids, 9) * table))
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs))


def test_registered_opdef_and_infer():
    op = OPS["embedding"]
    assert [i.name for i in op.inputs] == ["table", "ids"] and op.attrs == ()
    assert [c.name for c in op.candidates] == ["vec16", "scalar"]
    assert [c.always_works for c in selection.candidates(op)] == [False, True]
    (out,) = op.infer([TensorType((100, 16), "float16"), TensorType((2, 7), "int32")], {})
    assert out == TensorType((2, 7, 16), "float16")
    (out,) = op.infer([TensorType(("vocab", 8), "bfloat16"), TensorType(("batch", "seq"), "int64")], {})
    assert out == TensorType(("batch", "seq", 8), "bfloat16")
    (out,) = op.infer([TensorType((5, 3), "float32"), TensorType((), "int64")], {})
    assert out == TensorType((3,), "float32")


def test_infer_errors():
    op = OPS["embedding"]
    with pytest.raises(ValueError, match=r"table: expected a 2-d array \(vocab, dim\)"):
        op.infer([TensorType((100,), "float32"), TensorType((3,), "int64")], {})
    with pytest.raises(TypeError, match="table: expected dtype float32, float16 or bfloat16, got int64"):
        op.infer([TensorType((100, 4), "int64"), TensorType((3,), "int64")], {})
    with pytest.raises(TypeError, match="ids: expected dtype int32 or int64, got float32"):
        op.infer([TensorType((100, 4), "float32"), TensorType((3,), "float32")], {})
    with pytest.raises(ValueError, match="table: expected dim >= 1"):
        op.infer([TensorType((100, 0), "float32"), TensorType((3,), "int64")], {})
    with pytest.raises(ValueError, match="ids: expected rank <= 7"):
        op.infer([TensorType((100, 4), "float32"), TensorType((1,) * 8, "int64")], {})


def test_run_reference_and_executor_cpu(rng):
    table = random_array(rng, (20, 6), "bfloat16")
    ids = rng.integers(0, 20, (3, 5)).astype(np.int32)
    (out,) = OPS["embedding"].run_reference([table, ids], {})
    assert out.dtype == table.dtype and out.shape == (3, 5, 6)
    np.testing.assert_array_equal(out.astype(np.float32), table.astype(np.float32)[ids])
    g = ge2.ir.Graph("lookup")
    x = g.input("ids", ("batch", 5), "int32")
    g.output(g.embedding(g.param("table", table), x), "y")
    result = ge2.ExecutorV2(g, device="cpu").run({"ids": ids})["y"]
    np.testing.assert_array_equal(result.astype(np.float32), table.astype(np.float32)[ids])


def table_for(vocab: int, dy: np.ndarray) -> np.ndarray:
    """A table whose shape (vocab, dim) the backward reads; its values play no part in the gradient."""
    return np.zeros((vocab, dy.shape[-1]), dy.dtype)


def test_validation_errors_name_the_argument(rng):
    table = random_array(rng, (5, 4), "float32")
    ids = np.array([[0, 4], [2, 3]])
    dy = random_array(rng, (2, 2, 4), "float32")
    calls = [
        (lambda: emb.forward_numpy(table[0], ids), ValueError, r"table: expected a 2-d array"),
        (lambda: emb.forward_numpy(table.astype(np.int32), ids), TypeError, "table: expected dtype float32"),
        (lambda: emb.forward_numpy(table, ids.astype(np.float32)), TypeError, "ids: expected dtype int32 or int64"),
        (lambda: emb.forward_numpy(table, ids.astype(np.uint8)), TypeError, "ids: expected dtype int32 or int64"),
        (lambda: emb.forward_numpy(table[:0], ids), ValueError, "table: expected vocab >= 1"),
        (lambda: emb.forward_numpy(table, ids.tolist()), TypeError, "ids: expected a NumPy array"),
        (lambda: emb.forward_numpy(table, np.array([[0, 5], [1, 1]])), ValueError,
         r"ids: id 5 at position 1 is outside \[0, 5\)"),
        (lambda: emb.forward_numpy(table, np.array([0, 1, -2])), ValueError, "ids: id -2 at position 2"),
        (lambda: emb.forward_numpy(table, ids, kernel="fast"), ValueError, "kernel: expected one of auto, vec16"),
        (lambda: emb.forward_numpy(table, np.zeros((1,) * 8, np.int64)), ValueError, "ids: expected rank <= 7"),
        (lambda: emb.backward_numpy(dy, table[:0], ids), ValueError, "table: expected vocab >= 1"),
        (lambda: emb.backward_numpy(dy, table, ids.astype(np.float32)), TypeError, "ids: expected dtype int32"),
        (lambda: emb.backward_numpy(dy[0], table, ids), ValueError, r"dy: expected shape \(2, 2, 4\)"),
        (lambda: emb.backward_numpy(dy.astype(np.int64), table, ids), TypeError, "dy: expected dtype float32"),
        (lambda: emb.backward_numpy(dy, table[:4], ids), ValueError, r"ids: id 4 at position 1 is outside \[0, 4\)"),
        (lambda: emb.reference(table, np.array([9])), ValueError, "ids: id 9 at position 0"),
    ]
    for call, error, message in calls:
        with pytest.raises(error, match=message):
            call()


@native_built
def test_native_reasons_and_table():
    native = _native.load("_ops_embedding")
    assert [k["name"] for k in native.kernels()] == ["vec16", "scalar"]
    assert native.unsupported_reason("vec16", 64, "float16", True) == ""
    assert "multiple of 8" in native.unsupported_reason("vec16", 12, "bfloat16", True)
    assert "multiple of 4" in native.unsupported_reason("vec16", 6, "float32", True)
    assert "aligned" in native.unsupported_reason("vec16", 64, "float32", False)
    assert native.unsupported_reason("scalar", 3, "float32", False) == ""


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
# (vocab, dim, ids shape): dim 1, odd dims (scalar path), a lane group smaller than a warp, several packs per lane,
# 0-d ids, more ids than resident groups.
SHAPES = [(10, 1, (5,)), (7, 3, (2, 3)), (50, 64, (100,)), (30, 24, (9, 4)), (1000, 1024, (4, 33)), (5, 8, ()),
          (100, 1001, (17,)), (3, 4096, (9,)), (64, 16, (20000,))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("id_dtype", ID_DTYPES)
@pytest.mark.parametrize("vocab, dim, ids_shape", SHAPES)
def test_forward_every_kernel(rng, to_device, poisoned, dtype, id_dtype, vocab, dim, ids_shape):
    table = random_array(rng, (vocab, dim), dtype)
    ids = rng.integers(0, vocab, ids_shape).astype(id_dtype)
    expected = table[ids]
    native = _native.load("_ops_embedding")
    for kernel in ("vec16", "scalar", "auto"):
        if kernel == "vec16" and native.unsupported_reason("vec16", dim, dtype, True):
            continue
        out = poisoned(tuple(ids_shape) + (dim,), dtype)
        assert emb.forward(to_device(table), to_device(ids), kernel, out) is out
        np.testing.assert_array_equal(out.numpy(), expected, err_msg=f"{kernel} {dtype} {dim}")
    np.testing.assert_array_equal(emb.forward_numpy(table, ids), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("id_dtype", ID_DTYPES)
@pytest.mark.parametrize("vocab, dim, ids_shape", SHAPES)
def test_backward(rng, to_device, poisoned, dtype, id_dtype, vocab, dim, ids_shape):
    ids = rng.integers(0, vocab, ids_shape).astype(id_dtype)
    dy = random_array(rng, tuple(ids_shape) + (dim,), dtype)
    out = poisoned((vocab, dim), dtype)
    table = table_for(vocab, dy)
    assert emb.backward(to_device(dy), to_device(table), to_device(ids), out=(out, None)) == (out, None)
    expected = emb.reference_backward(dy, ids, vocab)
    assert_close(out.numpy(), expected, dtype, max_repeat(ids))
    assert_close(emb.backward_numpy(dy, table, ids)[0], expected, dtype, max_repeat(ids))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 8, 136, 1000])
def test_backward_runs_across_tiles(rng, to_device, poisoned, dtype, dim):
    """Runs that end exactly on tile boundaries (32 sorted positions), span several tiles, or sit inside one."""
    counts = {3: 32, 5: 32, 7: 1, 9: 64, 2: 33, 11: 31, 4: 95, 0: 2, 6: 130}
    ids = np.concatenate([np.full(n, i) for i, n in counts.items()])
    ids = ids[rng.permutation(ids.size)]
    dy = random_array(rng, (ids.size, dim), dtype)
    out = poisoned((12, dim), dtype)
    emb.backward(to_device(dy), to_device(table_for(12, dy)), to_device(ids), out=(out, None))
    expected = emb.reference_backward(dy, ids, 12)
    assert_close(out.numpy(), expected, dtype, max_repeat(ids))
    assert not out.numpy()[[1, 8, 10]].astype(np.float64).any()  # ids that never occur


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_one_hot_id_is_deterministic(rng, to_device, dtype):
    """An id repeated 10000 times among others (like padding): correct, and bitwise identical run to run."""
    ids = rng.integers(0, 500, 20000)
    ids[rng.random(20000) < 0.5] = 17
    dy = random_array(rng, (20000, 96), dtype)
    table = to_device(table_for(500, dy))
    first = emb.backward(to_device(dy), table, to_device(ids))[0].numpy()
    assert_close(first, emb.reference_backward(dy, ids, 500), dtype, max_repeat(ids))
    for _ in range(3):
        assert emb.backward(to_device(dy), table, to_device(ids))[0].numpy().tobytes() == first.tobytes()


@pytest.mark.gpu
def test_backward_edge_counts(rng, to_device, poisoned):
    for count in (0, 1, 31, 32, 33, 64):
        ids = rng.integers(0, 4, count)
        dy = random_array(rng, (count, 40), "float32")
        out = poisoned((4, 40), "float32")
        emb.backward(to_device(dy), to_device(table_for(4, dy)), to_device(ids), out=(out, None))
        assert_close(out.numpy(), emb.reference_backward(dy, ids, 4), "float32", max(1, max_repeat(ids)))
    ids = np.full(1000, 2)  # a single run over every tile
    dy = random_array(rng, (1000, 16), "float32")
    assert_close(emb.backward_numpy(dy, table_for(3, dy), ids)[0], emb.reference_backward(dy, ids, 3), "float32", 1000)


@pytest.mark.gpu
def test_gradient_matches_finite_differences(rng, to_device):
    table = rng.standard_normal((6, 5)).astype(np.float32)
    ids = np.array([[1, 4, 1], [5, 1, 0]])
    dy = rng.standard_normal((2, 3, 5)).astype(np.float32)
    grad, no_grad = emb.backward_numpy(dy, table, ids)
    assert no_grad is None  # integer ids have no gradient
    step, numeric = 1e-3, np.zeros((6, 5))
    for index in np.ndindex(table.shape):
        plus, minus = table.astype(np.float64), table.astype(np.float64)
        plus[index] += step
        minus[index] -= step
        numeric[index] = (np.sum(dy * emb.reference(plus, ids)) - np.sum(dy * emb.reference(minus, ids))) / (2 * step)
    np.testing.assert_allclose(grad, numeric, atol=1e-4)


@pytest.mark.gpu
def test_bad_ids_on_device(rng, to_device, poisoned):
    table = random_array(rng, (10, 24), "float32")
    ids = np.array([1, 10, 3, -1, 9])
    device_table, device_ids = to_device(table), to_device(ids)
    with pytest.raises(ValueError, match=r"ids: id 10 at position 1 is outside \[0, 10\)"):
        emb.forward(device_table, device_ids)
    out = poisoned((5, 24), "float32")
    emb.forward(device_table, device_ids, out=out, check_ids=False)
    result = out.numpy()
    assert np.isnan(result[[1, 3]]).all()
    np.testing.assert_array_equal(result[[0, 2, 4]], table[[1, 3, 9]])
    dy = random_array(rng, (5, 24), "float32")
    with pytest.raises(ValueError, match=r"ids: id 10 at position 1"):
        emb.backward(to_device(dy), device_table, device_ids)
    grad = emb.backward(to_device(dy), device_table, device_ids, check_ids=False)[0].numpy()
    keep = np.array([0, 2, 4])
    assert_close(grad, emb.reference_backward(dy[keep], ids[keep], 10), "float32")
    # the error slot is reset per checked call
    np.testing.assert_array_equal(emb.forward(device_table, to_device(ids[keep])).numpy(), table[ids[keep]])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_candidates_launch_plan_style(rng, to_device, poisoned, dtype):
    op = OPS["embedding"]
    for dim in (7, 64):
        table = random_array(rng, (40, dim), dtype)
        ids = rng.integers(0, 40, (3, 11))
        in_types = (TensorType(table.shape, dtype), TensorType(ids.shape, "int64"))
        problem = Problem("embedding", in_types, tuple(op.infer(in_types, {})), {})
        ran = 0
        for candidate in op.candidates:
            if candidate.supports(problem) is not None:
                continue
            out = poisoned((3, 11, dim), dtype)
            x, y = to_device(table), to_device(ids)
            candidate.prepare(problem)([x.ptr, y.ptr], [out.ptr], 0)
            np.testing.assert_array_equal(out.numpy(), table[ids])
            ran += 1
        assert ran == (2 if dim == 64 else 1)


@pytest.mark.gpu
def test_large_gpt2_shape(rng, to_device):
    """The benchmark's shape: a 50257 x 1024 float16 table, 8192 ids."""
    table = random_array(rng, (50257, 1024), "float16")
    ids = rng.integers(0, 50257, (8, 1024))
    np.testing.assert_array_equal(emb.forward(to_device(table), to_device(ids)).numpy(), table[ids])
    dy = random_array(rng, (8, 1024, 1024), "float16")
    grad = emb.backward(to_device(dy), to_device(table), to_device(ids))[0].numpy()
    assert_close(grad, emb.reference_backward(dy, ids, 50257), "float16", max_repeat(ids))


@pytest.mark.gpu
def test_torch_interop_and_misaligned_views(rng):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for dtype in DTYPES:
        torch_dtype = getattr(torch, dtype)
        table = torch.randn(300, 64, device="cuda").to(torch_dtype)
        ids = torch.randint(0, 300, (4, 50), device="cuda")
        out = emb.forward(table, ids)
        assert isinstance(out, torch.Tensor) and out.dtype == torch_dtype and out.shape == (4, 50, 64)
        assert torch.equal(out, F.embedding(ids, table))
        weight = table.float().requires_grad_()
        dy = torch.randn(4, 50, 64, device="cuda")
        F.embedding(ids, weight).backward(dy)
        grad, _ = emb.backward(dy.to(torch_dtype), table, ids.int())
        assert_close(grad.float().cpu().numpy(), weight.grad.cpu().numpy(), dtype, 8)
        # misaligned (one element off a 16-byte boundary): the scalar gather and unvectorized reduction
        storage = torch.empty(300 * 64 + 1, dtype=torch_dtype, device="cuda")
        shifted = storage[1:].view(300, 64)
        shifted.copy_(table)
        assert torch.equal(emb.forward(shifted, ids), F.embedding(ids, table))
        dy_storage = torch.empty(4 * 50 * 64 + 1, dtype=torch_dtype, device="cuda")
        shifted_dy = dy_storage[1:].view(4, 50, 64)
        shifted_dy.copy_(dy.to(torch_dtype))
        assert_close(emb.backward(shifted_dy, table, ids)[0].float().cpu().numpy(), weight.grad.cpu().numpy(), dtype,
                     8)


@pytest.mark.gpu
def test_device_errors(rng, to_device):
    table = to_device(random_array(rng, (10, 8), "float32"))
    ids = to_device(np.array([1, 2]))
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 8\)"):
        emb.forward(table, ids, out=to_device(np.zeros((2, 9), np.float32)))
    with pytest.raises(ValueError, match="kernel: expected one of auto, vec16, scalar"):
        emb.forward(table, ids, kernel="fast")
    with pytest.raises(TypeError, match="ids: expected a CUDA device array"):
        emb.forward(table, np.array([1, 2]))
    torch = pytest.importorskip("torch")
    weights = torch.zeros(10, 8, device="cuda")
    with pytest.raises(ValueError, match="out: must not overlap table"):
        emb.forward(weights, torch.tensor([1, 2], device="cuda"), out=weights[:2])
    with pytest.raises(ValueError, match="table: expected a contiguous"):
        emb.forward(weights.t(), torch.tensor([1, 2], device="cuda"))
