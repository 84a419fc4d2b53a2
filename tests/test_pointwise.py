"""The pointwise op set (ops/pointwise.py and the arithmetic of ops/elementwise.py): PyTorch type promotion over
every dtype pair, hand-computed edge cases (NaN, infinities, signed zeros, integer division and remainders of
negative numbers, division by zero), the CPU backend over every dtype, broadcasting and rank 0-6, bad inputs, the
scalar C++ rules evaluated on the host against the references, and on the GPU the faces against the references."""
from __future__ import annotations

import ctypes
import math
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import dtypes
from graph_executor_v2.dtypes import ALL_DTYPES, FLOAT_DTYPES, INT_DTYPES, compute_ctype, promote_types, result_type
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, pointwise
from graph_executor_v2.ops.elementwise import reduce_to_shape
from graph_executor_v2.testing import assert_close, tolerance

ARITHMETIC = ("add", "sub", "mul", "div")
UNARY = pointwise.UNARY_OPS + ("relu", "gelu", "gelu_erf", "silu", "sigmoid", "tanh", "exp", "neg")
BINARY = ARITHMETIC + pointwise.BINARY_OPS
# Attribute sets each op runs with (the defaults for the rest).
ATTRS = {"clip": ({"min": -1.0, "max": 2.0}, {"min": 0.0}, {"max": 3.0}), "mod": ({}, {"fmod": True}),
         "leaky_relu": ({}, {"alpha": 0.2}), "elu": ({"alpha": 0.5},), "softplus": ({}, {"beta": 2.0, "threshold": 3.0}),
         "hardsigmoid": ({}, {"alpha": 0.2, "beta": 0.5})}


def _accepted_dtypes(op: str) -> list[str]:
    """The dtypes whose tensors the op takes (every input of that dtype, conditions bool)."""
    accepted = []
    for dtype in ALL_DTYPES:
        types = [TensorType((2,), "bool" if i.name == "cond" else dtype) for i in OPS[op].inputs]
        try:
            OPS[op].infer(types, OPS[op].validate_attrs(ATTRS.get(op, ({},))[0], op))
        except (TypeError, ValueError):
            continue
        accepted.append(dtype)
    return accepted


def _values(rng, shape, dtype: str, op: str = "") -> np.ndarray:
    """Fresh values of ``dtype``: normal floats (positive for logarithms and roots, at least 0.1 from the pole for
    reciprocal, whose float16 gradient -dy / x^2 overflows float16's range near 0; for pow, bases and exponents
    between 0.5 and about 4.5, since a base near 0 with a negative exponent gives partials past float16's range, and
    their broadcast sums give inf - inf; its edge cases are in EDGE_CASES), small integers, random bools."""
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype in INT_DTYPES:
        low = 0 if dtype == "uint8" else -20
        return np.asarray(rng.integers(low, 21, shape)).astype(dtypes.to_numpy(dtype))
    x = np.asarray(rng.standard_normal(shape) * 2)
    if op in ("log", "log2", "sqrt", "rsqrt", "log1p"):
        x = np.abs(x) + 0.1
    if op == "reciprocal":
        x = np.where(x < 0, x - 0.1, x + 0.1)
    if op == "pow":
        x = np.abs(x) / 2 + 0.5
    return np.asarray(x.astype(dtypes.to_numpy(dtype)))


def _check(got: np.ndarray, expected: np.ndarray, dtype: str, what: str) -> None:
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    if dtype in FLOAT_DTYPES:
        assert_close(got, expected.astype(np.float64), dtype, what=what)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)


# ---------------------------------------------------------------------------------------------------------------
# Type promotion
# ---------------------------------------------------------------------------------------------------------------
# torch.promote_types over GE2's dtypes (rows and columns in PROMOTED_DTYPES order:
# float32 float16 bfloat16 int32 int64 uint8 bool).
PROMOTION_TABLE = [
    ["float32", "float32", "float32", "float32", "float32", "float32", "float32"],
    ["float32", "float16", "float32", "float16", "float16", "float16", "float16"],
    ["float32", "float32", "bfloat16", "bfloat16", "bfloat16", "bfloat16", "bfloat16"],
    ["float32", "float16", "bfloat16", "int32", "int64", "int32", "int32"],
    ["float32", "float16", "bfloat16", "int64", "int64", "int64", "int64"],
    ["float32", "float16", "bfloat16", "int32", "int64", "uint8", "uint8"],
    ["float32", "float16", "bfloat16", "int32", "int64", "uint8", "bool"],
]


PROMOTED_DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)  # the FP8 dtypes are storage: they do not promote


def test_promotion_table_over_every_dtype_pair():
    for row, a in enumerate(PROMOTED_DTYPES):
        for column, b in enumerate(PROMOTED_DTYPES):
            expected = PROMOTION_TABLE[row][column]
            assert promote_types(a, b) == expected, (a, b)
            assert result_type(a, b) == expected, (a, b)
            a_type, b_type = TensorType((3,), a), TensorType((2, 3), b)
            if expected != "bool":  # arithmetic on two masks is refused
                assert OPS["add"].infer([a_type, b_type], {}) == [TensorType((2, 3), expected)]
            assert OPS["less"].infer([a_type, b_type], {}) == [TensorType((2, 3), "bool")]
            assert OPS["where"].infer([TensorType((1,), "bool"), a_type, b_type], {})[0].dtype == expected
            assert compute_ctype([a_type, b_type]) == {"bool": "bool", "int32": "int", "int64": "long long",
                                                       "uint8": "unsigned char"}.get(expected, "float")


def test_promotion_matches_torch_where_torch_is_installed():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the GPU machine has it)")
    for a in PROMOTED_DTYPES:
        for b in PROMOTED_DTYPES:
            assert promote_types(a, b) == str(torch.promote_types(getattr(torch, a), getattr(torch, b))).removeprefix(
                "torch."), (a, b)
            for scalar in (True, 3, 2.5):
                tensor = torch.zeros(2, dtype=getattr(torch, a))
                expected = str(torch.result_type(tensor, scalar)).removeprefix("torch.")
                assert result_type(a, scalar) == expected, (a, scalar)
                zero_dim = torch.zeros((), dtype=getattr(torch, b))
                expected = str(torch.result_type(tensor, zero_dim)).removeprefix("torch.")
                assert result_type(TensorType((2,), a), TensorType((), b)) == expected, (a, b)


@pytest.mark.parametrize("operands, expected", [
    (("int32", 2.5), "float32"),  # a float scalar makes an integer tensor float32, the default float dtype
    (("float16", 2.5), "float16"),  # ... but does not widen a float tensor
    (("bfloat16", 7), "bfloat16"),
    (("uint8", -1), "uint8"),  # an int scalar keeps the tensor's integer type
    (("bool", 1), "int64"),  # a bool tensor and an int scalar: int64, the default int dtype
    (("bool", True), "bool"),
    ((True, 2), "int64"),
    ((1, 2.0), "float32"),
    ((TensorType((4,), "float16"), TensorType((), "float32")), "float16"),  # 0-d tensors: only their category
    ((TensorType((4,), "int32"), TensorType((), "float16")), "float16"),
    ((TensorType((4,), "int32"), TensorType((), "int64")), "int32"),
    ((TensorType((), "int32"), TensorType((), "int64")), "int64"),  # 0-d with 0-d: ordinary promotion
    ((TensorType((), "uint8"), 2.5), "float32"),
    ((TensorType((4,), "bool"), TensorType((), "uint8"), 2), "uint8"),
])
def test_result_type_ranks_scalars_and_zero_dim_tensors_below_tensors(operands, expected):
    assert result_type(*operands) == expected


def test_result_type_rejects_what_is_not_an_operand():
    with pytest.raises(TypeError, match=r"operands\[1\]: expected a dtype name"):
        result_type("float32", [1, 2])
    with pytest.raises(TypeError, match=r"operands\[0\]: expected one of .*got 'float64'"):
        result_type("float64")
    with pytest.raises(ValueError, match="at least one operand"):
        result_type()


# ---------------------------------------------------------------------------------------------------------------
# Edge cases, computed by hand
# ---------------------------------------------------------------------------------------------------------------
NAN, INF = float("nan"), float("inf")
EDGE_CASES = [
    # (op, attrs, inputs (lists with their dtypes), expected)
    ("div", {}, [([7, -7, 7, -7, 5, 0], "int32"), ([2, 2, -2, -2, 0, 3], "int32")], [3, -3, -3, 3, 0, 0]),
    ("div", {}, [([200, 7], "uint8"), ([3, 0], "uint8")], [66, 0]),
    ("div", {}, [([1.0, -1.0, 0.0], "float32"), ([0.0, 0.0, 0.0], "float32")], [INF, -INF, NAN]),
    ("mod", {}, [([7, -7, 7, -7, 6, 5], "int64"), ([3, 3, -3, -3, 3, 0], "int64")], [1, 2, -2, -1, 0, 0]),
    ("mod", {"fmod": True}, [([7, -7, 7, -7, 5], "int32"), ([3, 3, -3, -3, 0], "int32")], [1, -1, 1, -1, 0]),
    ("mod", {}, [([5.5, -5.5, 5.5, -5.5, 1.0, INF], "float32"), ([2.0, 2.0, -2.0, -2.0, 0.0, 2.0], "float32")],
     [1.5, 0.5, -0.5, -1.5, NAN, NAN]),
    ("mod", {"fmod": True}, [([5.5, -5.5, 5.5, -5.5], "float32"), ([2.0, 2.0, -2.0, -2.0], "float32")],
     [1.5, -1.5, 1.5, -1.5]),
    ("add", {}, [([250, 3], "uint8"), ([10, 4], "uint8")], [4, 7]),  # wraps
    ("sub", {}, [([2**31 - 1], "int32"), ([-1], "int32")], [-(2**31)]),
    ("mul", {}, [([3, -4], "int64"), ([True, False], "bool")], [3, 0]),
    ("pow", {}, [([2, -3, 5, 1, -1, -1, 0, 2], "int32"), ([10, 3, 0, -4, -3, -2, -1, -1], "int32")],
     [1024, -27, 1, 1, -1, 1, 0, 0]),
    ("pow", {}, [([2.0, -8.0, 0.0, -2.0, NAN, 1.0], "float32"), ([0.5, 1.0 / 3.0, -1.0, 2.0, 0.0, NAN], "float32")],
     [math.sqrt(2.0), NAN, INF, 4.0, 1.0, 1.0]),
    ("minimum", {}, [([1.0, NAN, 3.0, -0.0], "float32"), ([2.0, 1.0, NAN, 0.0], "float32")], [1.0, NAN, NAN, 0.0]),
    ("maximum", {}, [([1.0, NAN, 3.0], "float16"), ([2.0, 1.0, NAN], "float16")], [2.0, NAN, NAN]),
    ("maximum", {}, [([True, False], "bool"), ([False, False], "bool")], [True, False]),
    ("minimum", {}, [([200, 3], "uint8"), ([-5, 7], "int32")], [-5, 3]),
    ("clip", {"min": -1.0, "max": 1.0}, [([-2.0, 0.5, 3.0, NAN, -INF], "float32")], [-1.0, 0.5, 1.0, NAN, -1.0]),
    ("clip", {"min": 2.0, "max": 1.0}, [([0.0, 1.5, 3.0], "float32")], [1.0, 1.0, 1.0]),  # min > max: max wins
    ("clip", {"min": 0.0, "max": 6.0}, [([-3, 4, 9], "int32")], [0, 4, 6]),
    ("clip", {"max": 100.0}, [([3, 250], "uint8")], [3, 100]),
    ("sign", {}, [([-2.5, 0.0, 3.0, NAN, -INF], "float32")], [-1.0, 0.0, 1.0, NAN, -1.0]),
    ("sign", {}, [([-7, 0, 9], "int64")], [-1, 0, 1]),
    ("abs", {}, [([-3, 4], "int32")], [3, 4]),
    ("abs", {}, [([-0.0, -INF, NAN], "float32")], [0.0, INF, NAN]),
    ("round", {}, [([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999], "float32")], [0.0, 2.0, 2.0, -0.0, -2.0, 2.0]),
    ("round", {}, [([7, -3], "int32")], [7, -3]),
    ("floor", {}, [([-1.5, 1.5, INF], "float32")], [-2.0, 1.0, INF]),
    ("ceil", {}, [([-1.5, 1.5], "bfloat16")], [-1.0, 2.0]),
    ("trunc", {}, [([-1.7, 1.7], "float16")], [-1.0, 1.0]),
    ("sqrt", {}, [([4.0, -1.0, INF, 0.0], "float32")], [2.0, NAN, INF, 0.0]),
    ("rsqrt", {}, [([4.0, 0.0, INF], "float32")], [0.5, INF, 0.0]),
    ("log", {}, [([1.0, 0.0, -1.0], "float32")], [0.0, -INF, NAN]),
    ("log2", {}, [([8.0, 0.5], "float32")], [3.0, -1.0]),
    ("log1p", {}, [([0.0, -1.0, 1e-10], "float32")], [0.0, -INF, 1e-10]),
    ("exp2", {}, [([3.0, -1.0, -INF], "float32")], [8.0, 0.5, 0.0]),
    ("expm1", {}, [([0.0, 1e-10], "float32")], [0.0, 1e-10]),
    ("reciprocal", {}, [([4.0, 0.0, -0.0], "float32")], [0.25, INF, -INF]),
    ("erf", {}, [([0.0, 1.0, -INF, 10.0], "float32")], [0.0, math.erf(1.0), -1.0, 1.0]),
    ("softplus", {}, [([0.0, 30.0, -30.0], "float32")], [math.log(2.0), 30.0, math.log1p(math.exp(-30.0))]),
    ("mish", {}, [([0.0, 1.0], "float32")], [0.0, math.tanh(math.log1p(math.e))]),
    ("hardswish", {}, [([-4.0, -1.0, 4.0, NAN], "float32")], [-0.0, -1.0 / 3.0, 4.0, NAN]),
    ("hardsigmoid", {}, [([-4.0, 0.0, 4.0, NAN], "float32")], [0.0, 0.5, 1.0, NAN]),
    ("hardsigmoid", {"alpha": 0.2, "beta": 0.5}, [([1.0, 3.0], "float32")], [0.7, 1.0]),
    ("leaky_relu", {"alpha": 0.1}, [([-2.0, 3.0, NAN], "float32")], [-0.2, 3.0, NAN]),
    ("elu", {"alpha": 2.0}, [([-INF, 1.0, 0.0], "float32")], [-2.0, 1.0, 0.0]),
    ("relu", {}, [([-2.0, 3.0, NAN], "float32")], [0.0, 3.0, NAN]),
    ("relu", {}, [([-2, 3], "int64")], [0, 3]),
    ("neg", {}, [([2, 0, 255], "uint8")], [254, 0, 1]),
    ("neg", {}, [([-(2**31), 5], "int32")], [-(2**31), -5]),
    ("isnan", {}, [([NAN, INF, 0.0], "float32")], [True, False, False]),
    ("isnan", {}, [([3, 0], "int32")], [False, False]),
    ("isinf", {}, [([NAN, INF, -INF, 65504.0], "float16")], [False, True, True, False]),
    ("logical_not", {}, [([0.0, NAN, -0.0, 2.0], "float32")], [True, False, True, False]),
    ("logical_and", {}, [([0, 1, 2, 0], "int32"), ([NAN, 0.0, 3.0, 0.0], "float32")], [False, False, True, False]),
    ("logical_or", {}, [([True, False, False], "bool"), ([0, 0, 5], "uint8")], [True, False, True]),
    ("logical_xor", {}, [([True, True, False], "bool"), ([True, False, False], "bool")], [False, True, False]),
    ("equal", {}, [([NAN, 1.0, 2.0], "float32"), ([NAN, 1.0, 3.0], "float16")], [False, True, False]),
    ("not_equal", {}, [([NAN, 1.0], "float32"), ([NAN, 1.0], "float32")], [True, False]),
    ("less", {}, [([-1, 200], "int32"), ([200, 200], "uint8")], [True, False]),
    ("less_equal", {}, [([2**40, 5], "int64"), ([2**40, 4], "int64")], [True, False]),
    ("greater", {}, [([1.5, NAN], "float32"), ([1, 0], "int32")], [True, False]),
    ("greater_equal", {}, [([True, False], "bool"), ([False, False], "bool")], [True, True]),
    ("where", {}, [([True, False, True], "bool"), ([1, 2, 3], "int32"), ([0.5, 0.25, NAN], "float16")],
     [1.0, 0.25, 3.0]),
]


@pytest.mark.parametrize("op, attrs, inputs, expected", EDGE_CASES,
                         ids=[f"{case[0]}-{i}" for i, case in enumerate(EDGE_CASES)])
def test_edge_cases_on_the_cpu_backend(op, attrs, inputs, expected):
    arrays = [np.array(values).astype(dtypes.to_numpy(dtype)) for values, dtype in inputs]
    g = ge2.ir.Graph(op)
    values = [g.input(f"in{i}", a.shape, dtypes.normalize(a.dtype)) for i, a in enumerate(arrays)]
    y = getattr(g, op)(*values, **attrs)
    g.output(y, "y")
    got = ge2.ExecutorV2(g).run({f"in{i}": a for i, a in enumerate(arrays)})["y"]
    want = np.array(expected).astype(dtypes.to_numpy(y.type.dtype))
    if y.type.dtype in FLOAT_DTYPES:
        assert_close(got, np.array(expected, np.float64), y.type.dtype, what=op)
        np.testing.assert_array_equal(np.signbit(got[got == 0]), np.signbit(want[got == 0]))  # signed zeros
    else:
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------------------------
# The CPU backend over every dtype, broadcasting and rank 0-6
# ---------------------------------------------------------------------------------------------------------------
SHAPES = [((), ()), ((5,), ()), ((), (1, 4)), ((3, 1), (4,)), ((2, 1, 4), (3, 1)), ((2, 3, 1, 2), (1, 3, 4, 1)),
          ((1, 2, 1, 3, 1), (2, 1, 2, 1, 2)), ((2, 1, 2, 1, 2, 1), (1, 2, 1, 2, 1, 2))]


def _run_graph(op, arrays, attrs, device="cpu"):
    g = ge2.ir.Graph(op)
    values = [g.input(f"in{i}", a.shape, dtypes.normalize(a.dtype)) for i, a in enumerate(arrays)]
    y = getattr(g, op)(*values, **attrs)
    g.output(y, "y")
    return ge2.ExecutorV2(g, device=device).run({f"in{i}": a for i, a in enumerate(arrays)})["y"], y.type


def _independent(op, arrays, attrs):
    """The result as NumPy computes it directly (float64 for float results, the integer dtype for integers)."""
    out_type = OPS[op].infer([TensorType(a.shape, dtypes.normalize(a.dtype)) for a in arrays], attrs)[0]
    promoted = result_type(*[TensorType(a.shape, dtypes.normalize(a.dtype))
                             for a in (arrays[1:] if op == "where" else arrays)])
    wide = np.float64 if promoted in FLOAT_DTYPES else dtypes.to_numpy(promoted)
    operands = [a.astype(dtypes.to_numpy(promoted)).astype(wide) for a in (arrays[1:] if op == "where" else arrays)]
    with np.errstate(all="ignore"):
        if op == "where":
            result = np.where(arrays[0], *operands)
        elif op in ("add", "sub", "mul"):
            result = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](*operands)
        elif op == "div":
            a, b = operands
            result = a / b if wide == np.float64 else np.where(b == 0, 0, np.trunc(a.astype(np.float64) / np.where(
                b == 0, 1, b)).astype(wide))
        elif op == "mod":
            a, b = operands
            function = np.fmod if attrs.get("fmod") else np.mod
            result = function(a, b) if wide == np.float64 else np.where(b == 0, 0, function(a, np.where(b == 0, 1, b)))
        elif op in ("minimum", "maximum", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
                    "logical_and", "logical_or", "logical_xor"):
            result = getattr(np, op)(*operands)
        elif op == "pow":
            result = np.power(*operands)
        else:
            raise AssertionError(op)
    return np.asarray(result).astype(dtypes.to_numpy(out_type.dtype))


@pytest.mark.parametrize("op", BINARY + ("where",))
def test_binary_ops_over_every_dtype_broadcast_and_rank(rng, op):
    for dtype in _accepted_dtypes(op):
        if op == "pow" and dtype in INT_DTYPES + ("bool",):
            continue  # integer powers overflow NumPy's float64 check; the edge cases and host rules cover them
        for a_shape, b_shape in SHAPES:
            arrays = [_values(rng, a_shape, dtype), _values(rng, b_shape, dtype)]
            if op in ("div", "mod") and dtype in FLOAT_DTYPES:
                arrays[1] = np.asarray(np.where(np.abs(arrays[1]) < 0.1, 0.5, arrays[1]).astype(arrays[1].dtype))
            if op == "pow":
                arrays[0] = np.asarray(np.abs(arrays[0]) + arrays[0].dtype.type(0.5))
            if op == "where":
                arrays.insert(0, np.asarray(rng.random(np.broadcast_shapes(a_shape, b_shape)[1:]) < 0.5))
            got, out_type = _run_graph(op, arrays, {})
            assert got.shape == np.broadcast_shapes(*(a.shape for a in arrays))
            _check(got, _independent(op, arrays, {}), out_type.dtype, f"{op} {dtype} {a_shape} {b_shape}")


@pytest.mark.parametrize("op", UNARY)
def test_unary_ops_over_every_dtype_and_rank(rng, op):
    for dtype in _accepted_dtypes(op):
        for attrs in ATTRS.get(op, ({},)):
            for rank in range(7):
                shape = tuple(int(d) for d in rng.integers(1, 4, rank))
                x = _values(rng, shape, dtype, op)
                got, out_type = _run_graph(op, [x], attrs)
                (expected,) = OPS[op].run_reference([x], OPS[op].validate_attrs(attrs, op))
                assert got.shape == shape and got.dtype == expected.dtype
                _check(got, expected, out_type.dtype, f"{op} {dtype} rank {rank}")


def test_mixed_dtypes_promote_in_a_graph(rng):
    g = ge2.ir.Graph("mixed")
    h = g.input("h", (3, 4), "float16")
    i = g.input("i", (4,), "int32")
    m = g.input("m", (3, 1), "bool")
    s = g.input("s", (), "float32")
    assert g.maximum(i, s).type == TensorType((4,), "float32")  # a 0-d float makes integers float32
    y = g.where(m, g.mul(h, i), g.mul(h, s))  # ... but leaves float16 float16
    assert y.type == TensorType((3, 4), "float16")
    g.output(y, "y")
    feeds = {"h": _values(rng, (3, 4), "float16"), "i": _values(rng, (4,), "int32"),
             "m": rng.random((3, 1)) < 0.5, "s": np.array(1.5, np.float32)}
    got = ge2.ExecutorV2(g).run(feeds)["y"]
    h64, i64 = feeds["h"].astype(np.float64), feeds["i"].astype(np.float64)
    expected = np.where(feeds["m"], h64 * i64, h64 * 1.5)
    assert_close(got, expected, "float16")


# ---------------------------------------------------------------------------------------------------------------
# Bad inputs: errors name the argument
# ---------------------------------------------------------------------------------------------------------------
def test_bad_inputs_name_the_argument():
    t = TensorType
    with pytest.raises(TypeError, match=r"^x: expected float32, float16 or bfloat16, got int32"):
        OPS["sqrt"].infer([t((3,), "int32")], {})
    with pytest.raises(TypeError, match=r"^x: expected a numeric dtype \(float or integer\), got bool"):
        OPS["abs"].infer([t((3,), "bool")], {})
    with pytest.raises(TypeError, match=r"^a, b \(dtypes bool and bool promote to bool\): expected a numeric"):
        OPS["mod"].infer([t((3,), "bool"), t((3,), "bool")], {})
    with pytest.raises(TypeError, match=r"^cond: expected dtype bool .* got float32"):
        OPS["where"].infer([t((3,), "float32"), t((3,), "float32"), t((3,), "float32")], {})
    with pytest.raises(ValueError, match=r"^cond, a: shapes \(3,\) and \(4,\) do not broadcast"):
        OPS["where"].infer([t((3,), "bool"), t((4,), "float32"), t((1,), "float32")], {})
    with pytest.raises(ValueError, match=r"^a, b: shapes \(2, 3\) and \(4,\) do not broadcast"):
        OPS["less"].infer([t((2, 3), "int32"), t((4,), "int32")], {})
    with pytest.raises(ValueError, match=r"^input 'b' is required"):
        OPS["pow"].infer([t((3,), "float32"), None], {})
    with pytest.raises(TypeError, match=r"^x: expected a float, integer or bool dtype \(FP8 is storage"):
        OPS["isnan"].infer([t((3,), "float8_e4m3fn")], {})
    with pytest.raises(TypeError, match=r"float8_e5m2 is a storage dtype"):
        OPS["less"].infer([t((3,), "float8_e5m2"), t((3,), "float32")], {})
    with pytest.raises(ValueError, match=r"^min: expected an integer in \[0, 255\] for uint8 x, got 0.5"):
        OPS["clip"].infer([t((3,), "uint8")], {"min": 0.5, "max": None})
    with pytest.raises(ValueError, match=r"^max: expected an integer in \[0, 255\] for uint8 x, got 300.0"):
        OPS["clip"].infer([t((3,), "uint8")], {"min": None, "max": 300.0})
    g = ge2.ir.Graph("bad")
    x = g.input("x", (3,), "float32")
    with pytest.raises(ValueError, match="attribute 'beta' must be > 0"):
        g.softplus(x, beta=0.0)
    with pytest.raises(TypeError, match="attribute 'fmod' expected bool"):
        g.mod(x, x, fmod=1)
    with pytest.raises(TypeError, match=r"node 'root' \(sqrt\): x: expected float32"):
        g.sqrt(g.input("i", (3,), "int64"), name="root")
    with pytest.raises(TypeError, match=r"^x: expected a NumPy array"):
        ge2.ops.abs.forward_numpy([1.0, 2.0])
    with pytest.raises(TypeError, match=r"x: expected float32, float16 or bfloat16, got uint8"):
        ge2.ops.erf.forward_numpy(np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match=r"^dy: expected shape \(3,\)"):
        ge2.ops.sin.backward_numpy(np.zeros(4, np.float32), np.zeros(3, np.float32))


# ---------------------------------------------------------------------------------------------------------------
# The scalar rules (OpDef.scalar) compiled for the host and run against the references
# ---------------------------------------------------------------------------------------------------------------
_HOST_PRELUDE = """
#include <math.h>
#include <string.h>
// What generated kernels get from CUDA without a header: the bit casts, and the fast division (within 2 ulp on
// the device; exact here: the rule's formula is what this test checks).
static inline float __int_as_float(int bits) { float f; memcpy(&f, &bits, sizeof f); return f; }
static inline float __fdividef(float a, float b) { return a / b; }
"""
_C_TYPES = {"float": np.float32, "int": np.int32, "long long": np.int64, "unsigned char": np.uint8, "bool": np.bool_}
_SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, 3.0, -3.0, 1e-30, 80.0, -80.0, float("inf"), float("-inf"),
             float("nan")]


def _host_cases():
    for name in sorted(OPS):
        opdef = OPS[name]
        if opdef.scalar is None or name == "cast":
            continue
        for attrs in ATTRS.get(name, ({},)):
            full = opdef.validate_attrs(attrs, name)
            for dtype in ALL_DTYPES:
                in_types = [TensorType((2,), "bool" if i.name == "cond" else dtype) for i in opdef.inputs]
                try:
                    (out_type,) = opdef.infer(in_types, full)
                except (TypeError, ValueError):
                    continue
                yield name, full, dtype, in_types, out_type


def _host_inputs(rng, name, in_types, count):
    """Random values with the special ones mixed in (not in a backward op's dy: an infinite derivative times a dy of
    0 is NaN in float32 and 0 in float64, both right), of each input's dtype."""
    arrays = []
    for t, schema in zip(in_types, OPS[name].inputs):
        if t.dtype in FLOAT_DTYPES:
            x = rng.standard_normal(count) * 3
            if schema.name != "dy":
                x[: len(_SPECIALS)] = rng.permutation(_SPECIALS)
            if name.startswith(("pow", "mod")) and len(arrays) == 1:
                x[len(_SPECIALS):][::2] = np.round(x[len(_SPECIALS):][::2])  # integral exponents, exact quotients
        elif t.dtype == "bool":
            x = rng.random(count) < 0.5
        else:
            low = 0 if t.dtype == "uint8" else -9
            x = rng.integers(low, 10, count)
            if name.startswith("pow") and len(arrays) == 1:
                x = np.clip(x, -2 if t.dtype != "uint8" else 0, 6)
        arrays.append(np.asarray(x).astype(dtypes.to_numpy(t.dtype)))
    return arrays


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler (g++)")
def test_scalar_rules_on_the_host_match_the_references(rng, tmp_path):
    """Each rule compiled as host C++ (the CUDA math functions it may use are C's too): its results over random and
    special values of every dtype the op takes, converted to the compute type and back as a generated kernel does,
    against the op's reference."""
    cases = list(_host_cases())
    source = [_HOST_PRELUDE]
    for index, (name, attrs, dtype, in_types, out_type) in enumerate(cases):
        ctype, out_ctype = compute_ctype(in_types), compute_ctype([out_type])
        params = [f"in{i}" for i in range(len(in_types))]
        body = OPS[name].scalar(params, attrs, ctype)
        pointers = ", ".join(f"const {ctype}* p{i}" for i in range(len(in_types)))
        loads = " ".join(f"{ctype} in{i} = p{i}[k];" for i in range(len(in_types)))
        source.append(f'extern "C" void k{index}({pointers}, {out_ctype}* out, long n) {{\n'
                      f"  for (long k = 0; k < n; ++k) {{ {loads} out[k] = ({out_ctype})({body}); }}\n}}\n")
    (tmp_path / "rules.cpp").write_text("".join(source))
    library = tmp_path / "rules.so"
    build = subprocess.run(["g++", "-O1", "-std=c++17", "-shared", "-fPIC", "-o", str(library),
                            str(tmp_path / "rules.cpp")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[:4000]
    host = ctypes.CDLL(str(library))
    count = 64
    failures = []
    for index, (name, attrs, dtype, in_types, out_type) in enumerate(cases):
        ctype, out_ctype = compute_ctype(in_types), compute_ctype([out_type])
        arrays = _host_inputs(rng, name, in_types, count)
        converted = [np.ascontiguousarray(a.astype(_C_TYPES[ctype])) for a in arrays]  # the kernel's loads
        out = np.empty(count, _C_TYPES[out_ctype])
        with np.errstate(all="ignore"):
            getattr(host, f"k{index}")(*[a.ctypes.data_as(ctypes.c_void_p) for a in converted],
                                       out.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(count))
            got = out.astype(dtypes.to_numpy(out_type.dtype))  # the kernel's store
            (expected,) = OPS[name].run_reference(arrays, attrs)
        if name == "pow_grad_a":  # dy * (b * a^(b-1)): the float32 partial overflows for a tiny base (1e-30) and a
            # negative b although dy times it is finite in float64; PyTorch's float32 backward overflows the same way
            dy, a, b = (x.astype(np.float64) for x in arrays)
            with np.errstate(all="ignore"):
                power = np.abs(np.power(a, b - 1.0))
                partial_overflows = np.maximum(power, np.abs(b) * power) > np.finfo(np.float32).max
            overflowed = partial_overflows & np.isinf(got.astype(np.float64))
            got, expected = got[~overflowed], expected[~overflowed]
        try:
            _check_host(got, expected, out_type.dtype, name)
        except AssertionError as error:
            failures.append(f"{name} {attrs} {dtype}: {error}")
    assert not failures, "\n".join(failures[:20])


def _check_host(got, expected, dtype, name):
    if dtype not in FLOAT_DTYPES:
        np.testing.assert_array_equal(got, expected)
        return
    got64, expected64 = got.astype(np.float64), expected.astype(np.float64)
    atol, rtol = tolerance(dtype)
    if name in ("pow", "pow_grad_a", "pow_grad_b", "mish_backward", "softplus_backward", "elu", "expm1", "exp2",
                "exp", "exp_backward", "exp2_backward", "sigmoid", "silu", "gelu", "gelu_erf"):
        rtol *= 4  # float32 exponentials of arguments up to 80
    with np.errstate(invalid="ignore"):
        close = np.abs(got64 - expected64) <= atol + rtol * np.abs(expected64)
    bad = ~(close | (got64 == expected64) | (np.isnan(got64) & np.isnan(expected64)))
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} differ: got {got64[bad][:4]}, expected "
                           f"{expected64[bad][:4]}")


# ---------------------------------------------------------------------------------------------------------------
# GPU: the faces (generated kernels once the generated candidate is registered; else no kernel runs them)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(set(UNARY + BINARY + ("where",)) - set(ARITHMETIC) - {"relu", "gelu", "gelu_erf",
                                                                                            "silu", "sigmoid",
                                                                                            "tanh", "exp", "neg"}))
def test_faces_match_the_reference_on_every_dtype(rng, to_device, poisoned, op):
    face, opdef = getattr(ge2.ops, op), OPS[op]
    for dtype in _accepted_dtypes(op):
        for attrs in ATTRS.get(op, ({},)):
            shapes = [(37, 5)] if len(opdef.inputs) == 1 else [(3, 1, 5), (4, 1)] + ([(1, 5)] if op == "where" else [])
            arrays = [_values(rng, s, "bool" if i.name == "cond" else dtype, op) for s, i in zip(shapes, opdef.inputs)]
            full = opdef.validate_attrs(attrs, op)
            (expected,) = opdef.run_reference(arrays, full)
            got = face.forward_numpy(*arrays, **attrs)
            _check(got, expected, dtypes.normalize(expected.dtype), f"{op} {dtype} forward_numpy")
            out = poisoned(expected.shape, dtypes.normalize(expected.dtype))
            assert face.forward(*[to_device(a) for a in arrays], **attrs, out=out) is out
            _check(out.numpy(), expected, dtypes.normalize(expected.dtype), f"{op} {dtype} forward into poison")
            if opdef.reference_backward is None or dtype not in FLOAT_DTYPES:
                continue
            dy = (_values(rng, expected.shape, "float32") * 0.5).astype(dtypes.to_numpy(dtype))
            grads = face.backward_numpy(dy, *arrays, **attrs)
            references = opdef.reference_backward(arrays, [expected], [dy.astype(np.float64)], full)
            # The kernel rounds each output-sized partial to dtype, then sums those over the broadcast axes: each
            # rounding is off by up to half an ulp of its partial, which can far exceed the sum (pow's partials reach
            # hundreds and cancel to a few units).
            partials = opdef.reference_backward([np.broadcast_to(a, expected.shape) for a in arrays], [expected],
                                                [dy.astype(np.float64)], full)
            half_ulp = float(ml_dtypes.finfo(dtypes.to_numpy(dtype)).eps) / 2
            for index, (grad, reference) in enumerate(zip(grads, references)):
                if reference is None:
                    assert grad is None, f"{op}: input {index} has no gradient"
                    continue
                assert grad.shape == arrays[index].shape
                summed = expected.size // arrays[index].size
                rounding = half_ulp * reduce_to_shape(np.abs(partials[index]), arrays[index].shape)
                assert_close(grad, reference, dtype, reduction_length=max(summed, 4), slack=rounding,
                             what=f"{op} {dtype} gradient {index}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", ARITHMETIC)
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_arithmetic_on_the_gpu(rng, to_device, poisoned, op, dtype):
    a, b = _values(rng, (33, 7), dtype), _values(rng, (7,), dtype)
    b[0] = 0  # division by zero gives 0
    (expected,) = OPS[op].run_reference([a, b], {})
    out = poisoned(expected.shape, dtype)
    getattr(ge2.ops, op).forward(to_device(a), to_device(b), out=out)
    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.gpu
def test_bool_arrays_cross_dlpack_and_the_cuda_array_interface(rng):
    torch = pytest.importorskip("torch")
    mask = rng.random((5, 3)) < 0.5
    array = ge2.device.runtime().DeviceArray.from_numpy(mask)
    assert array.dtype == "bool" and array.itemsize == 1
    tensor = torch.from_dlpack(array)
    assert tensor.dtype == torch.bool
    np.testing.assert_array_equal(tensor.cpu().numpy(), mask)
    back = ge2.device.as_device_array(torch.from_numpy(~mask).cuda())
    assert back.dtype == "bool"
    np.testing.assert_array_equal(back.numpy(), ~mask)
    assert array.__cuda_array_interface__["typestr"] == "|b1"


@pytest.mark.gpu
def test_pointwise_graph_on_cuda_matches_the_cpu_backend(rng):
    g = ge2.ir.Graph("chain")
    x = g.input("x", (64, 48), "float16")
    k = g.input("k", (48,), "int32")
    # no discontinuity that a float32 intermediate and a float16 one could fall on either side of
    y = g.where(g.greater(x, g.clip(x, min=-0.5, max=0.5)), g.erf(x), g.mul(g.abs(x), k))
    g.output(g.hardswish(y), "y")
    feeds = {"x": _values(rng, (64, 48), "float16"), "k": _values(rng, (48,), "int32")}
    on_gpu = ge2.ExecutorV2(g, device="cuda").run(feeds)["y"]
    on_cpu = ge2.ExecutorV2(g, device="cpu").run(feeds)["y"]
    assert_close(on_gpu, on_cpu.astype(np.float64), "float16")
