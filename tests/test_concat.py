"""concat: references against closed forms, validation (mismatches name the input and the dims), inference,
builders and the CPU executor (CPU); every dtype x kernel x layout bit-exact forward and backward, poisoned
outputs, many inputs (several launches), empty inputs, misaligned and odd widths, plan candidates, torch interop
(GPU)."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ir import Graph
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, Problem
from graph_executor_v2.ops import concat as cc

from data_movement import ALL_DTYPES, assert_same_bits, device, random_values

KERNELS = ("fused", "copy2d")

# (input shapes, axis): 16-byte widths, odd widths, a single input, zero-extent inputs, rank 1 and 5, negative
# axes, axis 0 (one row), size-1 axes, and more inputs than one launch takes.
CASES = [
    ([(4, 64), (4, 64)], 1),
    ([(3, 5), (3, 7), (3, 1)], 1),
    ([(2, 8), (5, 8), (1, 8)], 0),
    ([(6, 10)], 1),
    ([(4, 0), (4, 3), (4, 0)], -1),
    ([(7,), (9,), (16,)], 0),
    ([(2, 3, 1, 4, 5), (2, 3, 2, 4, 5), (2, 3, 3, 4, 5)], 2),
    ([(1, 8, 1), (1, 8, 1)], -3),
    ([(5, 2, 24), (5, 1, 24)], 1),
    ([(3, 2 * (i % 3) + 1) for i in range(40)], 1),
    ([(2, 8)] * 33, 0),
    ([(0, 4), (0, 4)], 0),
]


def _layouts(shapes, axis):
    return cc.layout(shapes, axis % len(shapes[0]))


# ---------------------------------------------------------------------------------------------------------------
# CPU: references against closed forms
# ---------------------------------------------------------------------------------------------------------------
def test_reference_closed_form():
    a, b = np.array([[1, 2], [3, 4]]), np.array([[5], [6]])
    np.testing.assert_array_equal(cc.reference([a, b], 1), [[1, 2, 5], [3, 4, 6]])
    np.testing.assert_array_equal(cc.reference([a, a.T], -2), [[1, 2], [3, 4], [1, 3], [2, 4]])
    np.testing.assert_array_equal(cc.reference([np.arange(3.0)], 0), [0.0, 1.0, 2.0])
    dx = cc.reference_backward(np.arange(12.0).reshape(2, 6), (1, 0, 5), -1)
    np.testing.assert_array_equal(dx[0], [[0.0], [6.0]])
    assert dx[1].shape == (2, 0)
    np.testing.assert_array_equal(dx[2], [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11]])


def test_layout_closed_form():
    assert cc.layout([(2, 3, 4), (2, 5, 4)], 1) == (2, [12, 20])
    assert cc.layout([(2, 3), (4, 3)], 0) == (1, [6, 12])
    assert cc.layout([(2, 3), (2, 1)], 1) == (2, [3, 1])


def test_reference_is_exact_for_every_dtype(rng):
    for dtype in ALL_DTYPES:
        xs = [random_values(rng, (3, n), dtype) for n in (1, 4, 2)]
        y = OPS["concat"].run_reference(xs, {"axis": 1})[0]
        assert_same_bits(y, np.concatenate(xs, axis=1), dtype)


@pytest.mark.parametrize("shapes, axis", [c for c in CASES if any(np.prod(s) for s in c[0])])
def test_reference_backward_is_the_adjoint(rng, shapes, axis):
    xs = [rng.standard_normal(shape) for shape in shapes]
    y = OPS["concat"].reference(xs, {"axis": axis})[0]
    dy = rng.standard_normal(y.shape)
    dxs = OPS["concat"].reference_backward(xs, [y], [dy], {"axis": axis})
    assert [dx.shape for dx in dxs] == [x.shape for x in xs]
    # <dy, y> == sum <dx_i, x_i>; the sums can cancel, so the tolerance scales with the magnitudes summed.
    np.testing.assert_allclose(np.sum(dy * y), sum(np.sum(dx * x) for dx, x in zip(dxs, xs)), rtol=0,
                               atol=1e-12 * np.sum(np.abs(dy * y)))
    np.testing.assert_array_equal(np.concatenate(dxs, axis=axis), dy)


# ---------------------------------------------------------------------------------------------------------------
# CPU: validation, inference, builders, the CPU executor
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shapes, dtypes, axis, error, match",
    [
        ([(4, 3, 8), (4, 5, 8), (4, 2, 9)], ["float32"] * 3, 1, ValueError,
         r"xs\[2\]: expected dims \(4, \*, 8\) \(those of xs\[0\] except on axis 1\), got shape \(4, 2, 9\)"),
        ([(4, 3), (5, 3)], ["float16"] * 2, -1, ValueError,
         r"xs\[1\]: expected dims \(4, \*\) \(those of xs\[0\] except on axis 1\), got shape \(5, 3\)"),
        ([(4, 3), (4, 3, 1)], ["float16"] * 2, 0, ValueError, r"xs\[1\]: expected rank 2 \(the rank of xs\[0\]\)"),
        ([(4, 3), (4, 3)], ["float16", "float32"], 0, TypeError,
         r"xs\[1\]: expected dtype float16 \(the dtype of xs\[0\]\), got float32"),
        ([(), ()], ["float32"] * 2, 0, ValueError, r"xs\[0\]: expected rank >= 1"),
        ([], [], 0, ValueError, r"xs: expected at least one input"),
        ([(4, 3)], ["float32"], 2, ValueError, r"axis: axis 2 is out of range for rank 2"),
        ([(4, 3)], ["float32"], 1.0, TypeError, r"axis: expected an int, got float"),
        ([(4, 3)], ["float64"], 0, TypeError, r"xs\[0\]: expected one of float32"),
    ],
)
def test_check_inputs_errors(shapes, dtypes, axis, error, match):
    with pytest.raises(error, match=match):
        cc.check_inputs(shapes, dtypes, axis)


def test_numpy_face_validates_before_device_work():
    a = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"xs\[1\]: expected dims \(2, \*\)"):
        cc.forward_numpy([a, np.ones((3, 3), np.float32)], 1)
    with pytest.raises(TypeError, match=r"xs\[1\]: expected a NumPy array, got list"):
        cc.forward_numpy([a, [[1.0]]], 0)
    with pytest.raises(TypeError, match=r"xs: expected a non-empty list or tuple of arrays, got ndarray"):
        cc.forward_numpy(a, 0)
    with pytest.raises(ValueError, match=r"kernel: expected one of auto, fused, copy2d"):
        cc.forward_numpy([a, a], 0, kernel="memcpy")
    with pytest.raises(ValueError, match=r"dy: expected shape \(2, 6\)"):
        cc.backward_numpy(a, [a, a], 1)
    with pytest.raises(TypeError, match=r"xs: expected a non-empty list or tuple of arrays"):
        cc.backward_numpy(a, [], 1)
    with pytest.raises(ValueError, match=r"axis: axis -3 is out of range for rank 2"):
        cc.backward_numpy(a, [a], -3)
    with pytest.raises(TypeError, match=r"xs\[0\]: expected a CUDA device array"):
        cc.forward([a], 0)


def test_no_gpu_is_a_clear_error():
    if ge2.device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        cc.forward_numpy([np.ones((2, 3), np.float32)], 0)


def test_opdef_infers_and_validates():
    t = TensorType
    infer = OPS["concat"].infer
    assert infer([t((2, 3), "int64"), t((2, 5), "int64")], {"axis": -1}) == [t((2, 8), "int64")]
    assert infer([t(("n", 3), "float16"), t(("n", 5), "float16")], {"axis": 1}) == [t(("n", 8), "float16")]
    assert infer([t(("n", 3), "float16"), t((4, 5), "float16")], {"axis": 1}) == [t((4, 8), "float16")]
    assert infer([t(("n", 3), "float16")], {"axis": 0}) == [t(("n", 3), "float16")]
    # along the joined axis symbolic extents add up (ir/dims.py)
    assert infer([t(("n", 3), "float16"), t((2, 3), "float16")], {"axis": 0}) == [t(("n+2", 3), "float16")]
    assert infer([t((1, "n"), "int64"), t((1, "n"), "int64"), t((1, 1), "int64")], {"axis": 1}) == \
        [t((1, "2*n+1"), "int64")]
    with pytest.raises(ValueError, match=r"xs\[1\]: expected dims \(\*, 3\)"):
        infer([t(("n", 3), "float16"), t((2, 4), "float16")], {"axis": 0})
    with pytest.raises(TypeError, match=r"xs\[1\]: expected dtype float16"):
        infer([t(("n", 3), "float16"), t(("n", 3), "bfloat16")], {"axis": 1})
    assert [c.name for c in OPS["concat"].candidates] == list(KERNELS)
    assert [c.always_works for c in selection.candidates(OPS["concat"])] == [True, False]
    assert OPS["concat"].inputs[0].variadic


def test_graph_builder_and_cpu_executor(rng):
    g = Graph("joins")
    a, b = g.input("a", (3, 4), "float16"), g.input("b", (3, 2), "float16")
    c = g.input("c", (1, 6), "float16")
    ab = g.concat(a, b, axis=1)
    abc = g.concat(xs=[ab, c], axis=0)
    assert ab.type == TensorType((3, 6), "float16") and abc.type == TensorType((4, 6), "float16")
    with pytest.raises(ValueError, match=r"node 'bad' \(concat\): xs\[1\]: expected dims \(3, \*\) .*got shape "
                                         r"\(1, 6\)"):
        g.concat(a, c, axis=1, name="bad")
    with pytest.raises(ValueError, match=r"requires attribute 'axis'"):
        g.concat(a, b)
    g.output(abc, "y")
    values = {name: random_values(rng, shape, "float16") for name, shape in (("a", (3, 4)), ("b", (3, 2)),
                                                                              ("c", (1, 6)))}
    out = ge2.ExecutorV2(g, device="cpu").run(values)
    expected = np.concatenate([np.concatenate([values["a"], values["b"]], axis=1), values["c"]], axis=0)
    assert_same_bits(out["y"], expected, "float16")


def test_kernels_report_constraints():
    if not ge2._native.is_built("_ops_concat"):
        pytest.skip("_ops_concat is not built")
    assert [k["name"] for k in cc.kernels()] == list(KERNELS)
    native = cc._native_module()
    assert native.unsupported_reason("copy2d", 4, [2**29, 2**29], "float32").startswith("rows of 4294967296 bytes")
    assert native.unsupported_reason("copy2d", 1, [2**29, 2**29], "float32") == ""  # one row: plain copies
    assert native.unsupported_reason("fused", 4, [2**29, 2**29], "float32") == ""


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _check(rng, poisoned, shapes, axis, dtype, kernel, what):
    xs = [random_values(rng, shape, dtype) for shape in shapes]
    expected = cc.reference(xs, axis)
    out = poisoned(expected.shape, dtype)
    assert cc.forward([device(x) for x in xs], axis, kernel=kernel, out=out) is out
    assert_same_bits(out.numpy(), expected, dtype, f"forward {kernel} {what}")
    dy = random_values(rng, expected.shape, dtype)
    sections = [shape[axis] for shape in shapes]
    grads = [poisoned(shape, dtype) for shape in shapes]
    result = cc.backward(device(dy), [device(x) for x in xs], axis, kernel=kernel, out=grads)
    assert all(r is g for r, g in zip(result, grads))
    for index, (grad, reference) in enumerate(zip(grads, cc.reference_backward(dy, sections, axis))):
        assert_same_bits(grad.numpy(), reference, dtype, f"backward {kernel} {what} grad {index}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shapes, axis", CASES)
def test_every_dtype_kernel_and_layout(rng, poisoned, dtype, shapes, axis):
    for kernel in ("auto",) + KERNELS:
        _check(rng, poisoned, shapes, axis, dtype, kernel, f"{shapes} axis {axis}")


@pytest.mark.gpu
def test_random_layouts(rng, poisoned):
    for _ in range(60):
        rank = int(rng.integers(1, 5))
        shape = [int(e) for e in rng.integers(1, 7, size=rank)]
        axis = int(rng.integers(-rank, rank))
        count = int(rng.integers(1, 6)) if rng.random() < 0.8 else int(rng.integers(30, 70))
        shapes = []
        for _ in range(count):
            shape[axis] = int(rng.integers(0, 9)) * (8 if rng.random() < 0.5 else 1)
            shapes.append(tuple(shape))
        dtype = str(rng.choice(ALL_DTYPES))
        for kernel in KERNELS:
            _check(rng, poisoned, shapes, axis, dtype, kernel, f"{dtype} {shapes} axis {axis}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_large_concat(rng, dtype):
    xs = [random_values(rng, (1024, width), dtype) for width in (4096, 2048, 8, 1000)]
    for kernel in KERNELS:
        assert_same_bits(cc.forward_numpy(xs, 1, kernel=kernel), np.concatenate(xs, axis=1), dtype, kernel)
        dy = random_values(rng, (1024, 4096 + 2048 + 8 + 1000), dtype)
        for grad, expected in zip(cc.backward_numpy(dy, xs, -1, kernel=kernel),
                                  cc.reference_backward(dy, (4096, 2048, 8, 1000), -1)):
            assert_same_bits(grad, expected, dtype, f"backward {kernel}")


@pytest.mark.gpu
def test_plan_candidates_and_cuda_executor(rng, poisoned):
    shapes = [(6, 40), (6, 24), (6, 3)]
    xs = [random_values(rng, shape, "bfloat16") for shape in shapes]
    expected = cc.reference(xs, 1)
    problem = Problem("concat", tuple(TensorType(s, "bfloat16") for s in shapes),
                      (TensorType(expected.shape, "bfloat16"),), {"axis": 1})
    for candidate in OPS["concat"].candidates:
        assert candidate.supports(problem) is None
        out, inputs = poisoned(expected.shape, "bfloat16"), [device(x) for x in xs]
        candidate.prepare(problem)([x.ptr for x in inputs], [out.ptr], 0)
        assert_same_bits(out.numpy(), expected, "bfloat16", f"candidate {candidate.name}")
    g = Graph("concat")
    values = [g.input(f"x{i}", s, "bfloat16") for i, s in enumerate(shapes)]
    g.output(g.concat(*values, axis=1), "y")
    run = ge2.ExecutorV2(g, device="cuda").run({f"x{i}": x for i, x in enumerate(xs)})
    assert_same_bits(run["y"], expected, "bfloat16", "executor")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "int64"])
def test_torch_interop_and_misaligned_inputs(rng, dtype):
    torch = pytest.importorskip("torch")
    host = random_values(rng, (8 * 64 + 3,), dtype)
    base = torch.from_numpy(host.view(f"i{host.itemsize}")).cuda().view(getattr(torch, dtype))
    as_int = getattr(torch, f"int{8 * host.itemsize}")
    pieces = [base[1:1 + 4 * 32].view(4, 32), base[130:130 + 4 * 16].view(4, 16), base[200:200 + 4 * 8].view(4, 8)]
    pieces_host = [host[1:129].reshape(4, 32), host[130:194].reshape(4, 16), host[200:232].reshape(4, 8)]
    for kernel in KERNELS:
        y = cc.forward(pieces, 1, kernel=kernel)
        assert isinstance(y, torch.Tensor) and y.shape == (4, 56)
        assert_same_bits(y.cpu().view(as_int).numpy().view(host.dtype), np.concatenate(pieces_host, axis=1), dtype,
                         f"misaligned inputs, {kernel}")
        grads = cc.backward(y, pieces, 1, kernel=kernel)
        for grad, piece in zip(grads, pieces_host):
            assert isinstance(grad, torch.Tensor)
            assert_same_bits(grad.cpu().view(as_int).numpy().view(host.dtype), piece, dtype, f"split, {kernel}")
    with pytest.raises(ValueError, match=r"xs\[1\]: expected a contiguous"):
        cc.forward([pieces[0], base[:64].view(32, 2).t()], 0)
    with pytest.raises(ValueError, match=r"out: must not overlap xs\[0\]"):
        cc.forward([pieces[0], pieces[0]], 0, out=base[:256].view(8, 32))
