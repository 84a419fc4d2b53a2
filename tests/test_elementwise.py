"""elementwise ops: broadcasting shapes, references against closed forms and finite differences (CPU), every op x
dtype x kernel against the float64 reference on the GPU, backward with broadcast reduction, validation errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2 import _native
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, Problem
from graph_executor_v2.ops import elementwise as ew
from graph_executor_v2.testing import assert_close, random_array

DTYPES = ("float32", "float16", "bfloat16")
# (a shape, b shape): same shape, row vector, column vector, scalar, leading dims, both broadcast, 3-d patterns.
BROADCASTS = [
    ((37, 45), (37, 45)),
    ((8, 64), (64,)),
    ((8, 64), (1, 64)),
    ((13, 24), (13, 1)),
    ((5, 7), ()),
    ((1,), (5, 7)),
    ((6, 1), (1, 40)),
    ((3, 4, 5), (4, 1)),
    ((2, 3, 4, 8), (3, 1, 8)),
    ((4, 1, 6), (1, 5, 1)),
    ((2, 1, 3, 1, 5), (1, 4, 1, 6, 1)),
    ((31,), (31,)),
    ((1000, 33), (33,)),
]


def _inputs(rng, op, shapes, dtype):
    arrays = [np.asarray(random_array(rng, shape, dtype)) for shape in shapes]
    if op == "div":  # keep the divisor away from 0
        b = arrays[1].astype(np.float64)
        arrays[1] = np.asarray(np.sign(b) + (b == 0) + 0.5 * b).astype(arrays[1].dtype)
    return arrays


# ---------------------------------------------------------------------------------------------------------------
# CPU: shapes, inference, references
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("a, b", BROADCASTS)
def test_broadcast_shapes_match_numpy(a, b):
    assert ew.broadcast_shapes(a, b) == np.broadcast_shapes(a, b)


def test_broadcast_shapes_symbolic():
    assert ew.broadcast_shapes(("n", 1, 8), (4, 1)) == ("n", 4, 8)
    assert ew.broadcast_shapes(("n", 8), ("n", 1)) == ("n", 8)
    assert ew.broadcast_shapes(("n",), (8,)) == (8,)
    with pytest.raises(ValueError, match="a, b: .*do not broadcast"):
        ew.broadcast_shapes(("n",), ("m",))


def test_broadcast_shapes_mismatch_names_both():
    with pytest.raises(ValueError, match=r"a, b: shapes \(3, 4\) and \(5,\) do not broadcast \(axis -1: 4 vs 5\)"):
        ew.broadcast_shapes((3, 4), (5,))


def test_collapse_merges_dims_that_broadcast_alike():
    assert ew.collapse((8, 1, 16, 32), (16, 32)) == ((8, 512), (8, 512), (1, 512))
    assert ew.collapse((6, 1), (1, 40)) == ((6, 40), (6, 1), (1, 40))
    assert ew.collapse((4, 5), (4, 5)) == ((20,), (20,), (20,))


def test_every_op_is_registered():
    for op in ew.ELEMENTWISE_OPS:
        assert OPS[op].name == op
    assert [i.name for i in OPS["add"].inputs] == ["a", "b"]
    assert [i.name for i in OPS["relu"].inputs] == ["x"]
    assert [i.name for i in OPS["bias_add"].inputs] == ["x", "bias"]
    assert [c.name for c in OPS["add"].candidates] == ["vec16", "rowcol", "strided", "generated"]
    assert [c.name for c in OPS["bias_add"].candidates] == ["rowcol", "strided", "generated"]
    assert all(any(c.always_works for c in selection.candidates(OPS[op])) for op in ew.ELEMENTWISE_OPS)


def test_infer_binary_and_errors():
    t = lambda shape, dtype="float16": TensorType(shape, dtype)  # noqa: E731
    assert OPS["mul"].infer([t((4, 1, 3)), t((5, 1))], {}) == [t((4, 5, 3))]
    # mixed dtypes promote as in PyTorch; integers stay integers
    assert OPS["add"].infer([t((4,)), t((4,), "float32")], {}) == [t((4,), "float32")]
    assert OPS["div"].infer([t((4,), "int32"), t((4,), "uint8")], {}) == [t((4,), "int32")]
    with pytest.raises(TypeError, match="a, b: expected numeric dtypes .*got bool and bool"):
        OPS["add"].infer([t((4,), "bool"), t((4,), "bool")], {})
    with pytest.raises(ValueError, match="do not broadcast"):
        OPS["sub"].infer([t((4, 3)), t((4,))], {})
    with pytest.raises(ValueError, match="input 'b' is required"):
        OPS["div"].infer([t((4,)), None], {})


def test_infer_unary_and_bias_add():
    t = lambda shape, dtype="bfloat16": TensorType(shape, dtype)  # noqa: E731
    assert OPS["gelu"].infer([t(("n", 7))], {}) == [t(("n", 7))]
    assert OPS["bias_add"].infer([t(("n", 3, 7)), t((7,))], {}) == [t(("n", 3, 7))]
    with pytest.raises(ValueError, match=r"bias: expected shape \(7,\)"):
        OPS["bias_add"].infer([t((3, 7)), t((6,))], {})
    with pytest.raises(ValueError, match="bias: expected a 1-d array"):
        OPS["bias_add"].infer([t((3, 7)), t((1, 7))], {})
    with pytest.raises(TypeError, match="bias: expected dtype bfloat16"):
        OPS["bias_add"].infer([t((3, 7)), t((7,), "float32")], {})
    with pytest.raises(TypeError, match="x: expected dtype"):
        OPS["exp"].infer([t((3,), "uint8")], {})


def test_unary_references_closed_form():
    x = np.array([-3.0, -0.5, 0.0, 0.25, 2.0])
    expected = {
        "relu": np.maximum(x, 0),
        "gelu": 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        "gelu_erf": np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]),
        "silu": x / (1 + np.exp(-x)),
        "sigmoid": 1 / (1 + np.exp(-x)),
        "tanh": np.tanh(x),
        "exp": np.exp(x),
        "neg": -x,
    }
    for op, value in expected.items():
        np.testing.assert_allclose(ew.reference(op, x), value, rtol=1e-12, atol=1e-12, err_msg=op)


def test_binary_and_bias_add_references():
    a, b = np.arange(6.0).reshape(2, 3) + 1, np.array([1.0, 2.0, 4.0])
    np.testing.assert_array_equal(ew.reference("add", a, b), a + b)
    np.testing.assert_array_equal(ew.reference("sub", a, b), a - b)
    np.testing.assert_array_equal(ew.reference("mul", a, b), a * b)
    np.testing.assert_array_equal(ew.reference("div", a, b), a / b)
    np.testing.assert_array_equal(ew.reference("bias_add", a, b), a + b)


def _numeric_grad(f, x, dy, eps=1e-6):
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[index] += eps
        minus[index] -= eps
        grad[index] = np.sum((f(plus) - f(minus)) * dy) / (2 * eps)
    return grad


@pytest.mark.parametrize("op", ew.BINARY_OPS)
@pytest.mark.parametrize("a_shape, b_shape", [((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), ()), ((3,), (2, 3))])
def test_binary_reference_backward_matches_finite_differences(rng, op, a_shape, b_shape):
    a = rng.standard_normal(a_shape)
    b = np.asarray(rng.standard_normal(b_shape) + 3.0)
    dy = rng.standard_normal(np.broadcast_shapes(a_shape, b_shape))
    da, db = OPS[op].reference_backward([a, b], None, [dy], {})
    np.testing.assert_allclose(da, _numeric_grad(lambda v: ew.reference(op, v, b), a, dy), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(db, _numeric_grad(lambda v: ew.reference(op, a, v), b, dy), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("op", ew.UNARY_OPS)
def test_unary_reference_backward_matches_finite_differences(rng, op):
    x = rng.standard_normal((4, 5)) * 2
    x[np.abs(x) < 1e-3] = 0.5  # relu's kink
    dy = rng.standard_normal(x.shape)
    (dx,) = OPS[op].reference_backward([x], None, [dy], {})
    np.testing.assert_allclose(dx, _numeric_grad(lambda v: ew.reference(op, v), x, dy), rtol=1e-6, atol=1e-8)


def test_bias_add_reference_backward(rng):
    x, bias, dy = rng.standard_normal((2, 3, 5)), rng.standard_normal(5), rng.standard_normal((2, 3, 5))
    dx, dbias = OPS["bias_add"].reference_backward([x, bias], None, [dy], {})
    np.testing.assert_array_equal(dx, dy)
    np.testing.assert_allclose(dbias, _numeric_grad(lambda v: x + v, bias, dy), rtol=1e-6, atol=1e-8)


def test_run_reference_casts_to_input_dtype(rng):
    a = random_array(rng, (3, 4), "float16")
    (y,) = OPS["silu"].run_reference([a], {})
    assert y.dtype == np.float16


def test_validation_happens_before_device_work():
    a = np.zeros((3, 4), np.float32)
    assert not hasattr(ge2.ops, "no_such_op")
    with pytest.raises(ValueError, match="kernel: expected one of"):
        ge2.ops.add.forward_numpy(a, a, kernel="fast")
    with pytest.raises(TypeError, match="b: expected a NumPy array, got list"):
        ge2.ops.add.forward_numpy(a, [1.0])
    with pytest.raises(TypeError, match="missing required input 'b'"):
        ge2.ops.add.forward_numpy(a)
    with pytest.raises(ValueError, match="kernel: expected one of auto, vec16, rowcol, strided, got ndarray"):
        ge2.ops.add.forward_numpy(a, a, a)
    with pytest.raises(TypeError, match=r"takes at most 3 positional argument\(s\) \(a, b, kernel\)"):
        ge2.ops.add.forward_numpy(a, a, "auto", a)
    with pytest.raises(ValueError, match="do not broadcast"):
        ge2.ops.mul.forward_numpy(a, np.zeros((5,), np.float32))
    with pytest.raises(TypeError, match="a, b: expected numeric dtypes"):
        ge2.ops.add.forward_numpy(a > 0, a > 0)
    with pytest.raises(TypeError, match="x: expected dtype float32, float16 or bfloat16, got int32"):
        ge2.ops.gelu.forward_numpy(a.astype(np.int32))
    with pytest.raises(TypeError, match="dy: expected a NumPy array"):
        ge2.ops.relu.backward_numpy(None, a)
    with pytest.raises(ValueError, match=r"dy: expected shape \(3, 4\)"):
        ge2.ops.add.backward_numpy(np.zeros((4,), np.float32), a, a)


# ---------------------------------------------------------------------------------------------------------------
# Native layout (needs the module built, not a GPU)
# ---------------------------------------------------------------------------------------------------------------
needs_native = pytest.mark.skipif(not _native.is_built("_ops_elementwise"), reason="_ops_elementwise is not built")


@needs_native
@pytest.mark.parametrize("a, b", BROADCASTS)
def test_native_collapse_matches_python(a, b):
    layout = ew._native_module().broadcast_layout(list(a), list(b))
    out, ca, cb = ew.collapse(a, b)
    assert tuple(layout["shape"]) == out
    for shape, strides in ((ca, layout["stride_a"]), (cb, layout["stride_b"])):
        running = 1
        for extent, stride in zip(reversed(shape), reversed(strides)):
            assert stride == (running if extent > 1 else 0)
            running *= extent if extent > 1 else 1


@needs_native
def test_native_reasons_and_table():
    native = ew._native_module()
    assert native.unsupported_reason("vec16", "add", [4, 8], [4, 8], "float16") == ""
    assert "one shape" in native.unsupported_reason("vec16", "add", [4, 8], [8], "float16")
    assert native.unsupported_reason("rowcol", "add", [4, 8], [8], "float16") == ""
    assert "multiple of 8" in native.unsupported_reason("rowcol", "add", [4, 7], [7], "float16")
    assert "at most 2 dims" in native.unsupported_reason("rowcol", "add", [4, 1, 6], [1, 5, 1], "float32")
    assert native.unsupported_reason("strided", "relu", [3, 5], "float32") == ""
    assert [k["name"] for k in ge2.ops.mul.kernels()] == ["vec16", "rowcol", "strided", "generated"]
    assert [k["name"] for k in ge2.ops.relu.kernels()] == ["vec16", "strided", "generated"]
    assert [k["name"] for k in ge2.ops.bias_add.kernels()] == ["rowcol", "strided", "generated"]
    with pytest.raises(ValueError, match="a, b: shapes"):
        native.broadcast_layout([3, 4], [5])


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _check(actual, expected, dtype, what):
    assert_close(actual, expected, dtype, what=what)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ew.BINARY_OPS)
@pytest.mark.parametrize("a_shape, b_shape", BROADCASTS)
def test_binary_forward(rng, to_device, poisoned, op, dtype, a_shape, b_shape):
    a, b = _inputs(rng, op, (a_shape, b_shape), dtype)
    expected = OPS[op].run_reference([a, b], {})[0]
    out = poisoned(expected.shape, dtype)
    getattr(ge2.ops, op).forward(to_device(a), to_device(b), out=out)
    _check(out.numpy(), ew.reference(op, a, b), dtype, f"{op} {a_shape} {b_shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ("vec16", "rowcol", "strided"))
@pytest.mark.parametrize("a_shape, b_shape", [((64, 48), (64, 48)), ((64, 48), (48,)), ((64, 48), (64, 1)),
                                              ((3, 5, 8), (5, 1))])
def test_binary_each_kernel(rng, to_device, poisoned, kernel, a_shape, b_shape):
    dtype = "float16"
    a, b = _inputs(rng, "mul", (a_shape, b_shape), dtype)
    reason = ew._native_module().unsupported_reason(kernel, "mul", list(a_shape), list(b_shape), dtype)
    out = poisoned(np.broadcast_shapes(a_shape, b_shape), dtype)
    if reason:
        with pytest.raises(ValueError, match="kernel: "):
            ge2.ops.mul.forward(to_device(a), to_device(b), out=out, kernel=kernel)
        return
    ge2.ops.mul.forward(to_device(a), to_device(b), out=out, kernel=kernel)
    _check(out.numpy(), a.astype(np.float64) * b, dtype, kernel)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ew.UNARY_OPS)
@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (33, 17), (4096 + 5,)])
def test_unary_forward(rng, to_device, poisoned, op, dtype, shape):
    x = random_array(rng, shape, dtype, scale=2.0)
    out = poisoned(shape, dtype)
    getattr(ge2.ops, op).forward(to_device(x), out=out)
    _check(out.numpy(), ew.reference(op, x), dtype, f"{op} {shape}")
    out = poisoned(shape, dtype)
    getattr(ge2.ops, op).forward(to_device(x), out=out, kernel="strided")
    _check(out.numpy(), ew.reference(op, x), dtype, f"{op} {shape} strided")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_add_forward_and_numpy_face(rng, dtype):
    x, bias = random_array(rng, (4, 3, 40), dtype), random_array(rng, (40,), dtype)
    _check(ge2.ops.bias_add.forward_numpy(x, bias), ew.reference("bias_add", x, bias), dtype, "bias_add")
    dy = random_array(rng, x.shape, dtype)
    dx, dbias = ge2.ops.bias_add.backward_numpy(dy, x, bias)
    ref_dx, ref_dbias = ew.reference_backward("bias_add", dy, x, bias)
    _check(dx, ref_dx, dtype, "bias_add dx")
    assert_close(dbias, ref_dbias, dtype, reduction_length=12, what="bias_add dbias")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ew.UNARY_OPS)
def test_unary_backward(rng, op, dtype):
    x = random_array(rng, (37, 29), dtype, scale=2.0)
    dy = random_array(rng, x.shape, dtype)
    (dx,) = getattr(ge2.ops, op).backward_numpy(dy, x)
    _check(dx, ew.reference_backward(op, dy, x), dtype, f"{op} backward")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ew.BINARY_OPS)
@pytest.mark.parametrize("a_shape, b_shape", BROADCASTS + [((3000, 24), (24,)), ((2, 70000), (1,)),
                                                           ((5, 3000), (5, 1)), ((64, 40, 32), (40, 1))])
def test_binary_backward(rng, op, dtype, a_shape, b_shape):
    a, b = _inputs(rng, op, (a_shape, b_shape), dtype)
    dy = random_array(rng, np.broadcast_shapes(a_shape, b_shape), dtype)
    da, db = getattr(ge2.ops, op).backward_numpy(dy, a, b)
    ref_da, ref_db = ew.reference_backward(op, dy, a, b)
    for grad, ref, shape, name in ((da, ref_da, a_shape, "da"), (db, ref_db, b_shape, "db")):
        assert grad.shape == shape
        length = max(1, dy.size // max(1, int(np.prod(shape))))
        # Sums of length n of unit normals grow like sqrt(n): tolerance scaled like GEMM's K.
        assert_close(grad, ref, dtype, reduction_length=length, what=f"{op} {name} {a_shape} {b_shape}")


@pytest.mark.gpu
def test_empty_and_scalar_shapes(rng):
    a = np.zeros((0, 4), np.float32)
    b = random_array(rng, (4,), "float32")
    assert ge2.ops.add.forward_numpy(a, b).shape == (0, 4)
    da, db = ge2.ops.mul.backward_numpy(np.zeros((0, 4), np.float32), a, b)
    assert da.shape == (0, 4)
    np.testing.assert_array_equal(db, np.zeros(4, np.float32))  # an empty sum is zero
    s = np.array(2.5, np.float32)
    np.testing.assert_allclose(ge2.ops.mul.forward_numpy(s, s), 6.25)


@pytest.mark.gpu
def test_candidates_launch_plan_style(rng, to_device, poisoned):
    for op, shapes in (("add", ((16, 32), (32,))), ("relu", ((16, 32),)), ("bias_add", ((4, 8, 32), (32,)))):
        arrays = [random_array(rng, s, "float16") for s in shapes]
        in_types = tuple(TensorType(x.shape, "float16") for x in arrays)
        out_types = tuple(OPS[op].infer(list(in_types), {}))
        problem = Problem(op, in_types, out_types, {})
        for candidate in OPS[op].candidates:
            if candidate.supports(problem) is not None:
                continue
            launch = candidate.prepare(problem)
            out = poisoned(out_types[0].shape, "float16")
            inputs = [to_device(x) for x in arrays]
            launch([x.ptr for x in inputs], [out.ptr], 0)
            _check(out.numpy(), ew.reference(op, *arrays), "float16", f"{op} {candidate.name}")


@pytest.mark.gpu
def test_torch_interop_and_misaligned_views(rng):
    torch = pytest.importorskip("torch")
    base = torch.randn(4 * 64 + 1, device="cuda", dtype=torch.float16)
    a = base[1:].view(4, 64)  # 2-byte offset: not 16-byte aligned
    b = torch.randn(64, device="cuda", dtype=torch.float16)
    y = ge2.ops.mul.forward(a, b)
    assert isinstance(y, torch.Tensor)
    expected = a.double().cpu().numpy() * b.double().cpu().numpy()
    _check(y.cpu().numpy(), expected, "float16", "misaligned mul")
    with pytest.raises(ValueError, match="16-byte aligned"):
        ge2.ops.mul.forward(a, b, kernel="rowcol")
    r = ge2.ops.gelu.forward(a)
    _check(r.cpu().numpy(), ew.reference("gelu", a.cpu().numpy()), "float16", "misaligned gelu")
    dy = torch.randn(4, 64, device="cuda", dtype=torch.float16)
    da, db = ge2.ops.mul.backward(dy, a, b)
    ref_da, ref_db = ew.reference_backward("mul", dy.cpu().numpy(), a.cpu().numpy(), b.cpu().numpy())
    _check(da.cpu().numpy(), ref_da, "float16", "misaligned da")
    assert_close(db.cpu().numpy(), ref_db, "float16", reduction_length=4, what="misaligned db")


@pytest.mark.gpu
def test_shape_errors_on_device(to_device):
    a = to_device(np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="out: expected shape"):
        ge2.ops.add.forward(a, a, out=to_device(np.zeros((4, 3), np.float32)))
    with pytest.raises(ValueError, match="dy: expected shape"):
        ge2.ops.add.backward(to_device(np.zeros((4,), np.float32)), a, a)
