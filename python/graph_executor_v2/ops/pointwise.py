"""pointwise: the elementwise math, comparison and logical ops beyond ``ops/elementwise.py`` (whose add, sub, mul,
div, relu, gelu, gelu_erf, silu, sigmoid, tanh, exp and neg keep their hand-written kernels). Names follow NumPy.

- unary math (float32/float16/bfloat16): ``exp2 expm1 log log2 log1p sqrt rsqrt reciprocal sin cos erf softplus
  mish hardswish hardsigmoid leaky_relu elu``; on integers too: ``abs sign floor ceil round trunc clip`` (the
  rounding ops are the identity on integers; ``round`` rounds half to even, as NumPy);
- ``clip(x, min=None, max=None)`` (hardtanh, relu6), NaN passes through;
- binary with NumPy broadcasting and PyTorch type promotion (``dtypes.result_type``): ``pow mod minimum maximum``
  (``mod``: ``fmod=False`` takes the divisor's sign as Python and ONNX's ``fmod=0``, ``fmod=True`` the dividend's
  as C's fmod; integer ``mod`` by zero gives 0; ``minimum``/``maximum`` propagate NaN);
- comparisons ``equal not_equal less less_equal greater greater_equal`` and ``logical_and logical_or
  logical_xor logical_not isnan isinf``: bool results, any dtypes;
- ``where(cond, a, b)``: cond a bool tensor, all three broadcast, ``a``/``b`` promote.

Every op is one OpDef with a float64 NumPy reference (exact integer math for integer dtypes) and a scalar rule
(``OpDef.scalar``) for generated kernels, which are its GPU candidates. Gradients: a unary op's
``<op>_backward(dy, x)``, a binary op's ``<op>_grad_a``/``<op>_grad_b(dy, a, b)`` (each pointwise, so the backward
fuses too), summed over the broadcast dims in the grad rule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import device as _device
from .. import selection
from ..dtypes import FLOAT_DTYPES, INT_DTYPES, is_float, result_type, to_numpy
from ..ir.types import TensorType
from . import _grad, _layout
from .activations import sigmoid
from ._base import Attr, Input, OPS, OpDef, Problem, Sample, attach_grad, register, require_inputs, sample_array
from ._face import FACES, Face
from ._scalar import expression, is_float_ctype, literal
from .elementwise import broadcast_shapes, integer_result, reduce_to_shape

FLOAT, NUMERIC, ANY = "float", "numeric", "any"  # the dtypes an op takes
_ACCEPTED = {FLOAT: FLOAT_DTYPES, NUMERIC: FLOAT_DTYPES + INT_DTYPES, ANY: FLOAT_DTYPES + INT_DTYPES + ("bool",)}
_EXPECTED = {FLOAT: "float32, float16 or bfloat16", NUMERIC: "a numeric dtype (float or integer)",
             ANY: "a float, integer or bool dtype (FP8 is storage: cast it first)"}
_FLT_MAX = "3.4028234663852886e38f"  # no float is above it but infinity
_LN2 = 0.6931471805599453


def _accepts(kind: str, dtype: str) -> bool:
    return dtype in _ACCEPTED[kind]


def _operands(inputs):
    """The operands as the op computes them: converted to their promoted dtype (as the generated kernel does),
    then float64 for floating types; integers and bools stay exact."""
    arrays = [np.asarray(x) for x in inputs]
    exact = integer_result(arrays)
    if exact is not None:
        return [a.astype(exact) for a in arrays]
    if any(a.dtype == np.float64 for a in arrays):  # a test's float64 operands: nothing to round
        return [a.astype(np.float64) for a in arrays]
    promoted = to_numpy(result_type(*arrays))
    return [a.astype(promoted).astype(np.float64) for a in arrays]


def _is_float_array(x) -> bool:
    dtype = np.asarray(x).dtype
    return dtype.kind == "f" or dtype == to_numpy("bfloat16")


# ---------------------------------------------------------------------------------------------------------------
# The op table: NumPy reference, C++ scalar rule and derivative of each op
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Unary:
    name: str
    accepts: str
    reference: Callable  # (x, attrs) -> array: x float64, or exact integers / bools
    body: Callable  # (ctype, attrs) -> C++ over "x"
    derivative: Callable | None = None  # (x float64, attrs) -> d y / d x, float64; None: no gradient
    derivative_body: Callable | None = None  # attrs -> C++ over "x" in float
    predicate: bool = False  # the result is bool
    attrs: tuple = ()
    doc: str = ""


@dataclass(frozen=True)
class Binary:
    name: str
    accepts: str
    reference: Callable  # (a, b, attrs) -> array, operands as _operands gives them
    body: Callable  # (ctype, attrs) -> C++ over "a", "b"
    # d y / d a and d y / d b: (a, b, attrs) -> float64 array, with their C++ bodies over "a", "b" (float);
    # None: that operand has no gradient
    partials: tuple = (None, None)
    partial_bodies: tuple = (None, None)
    predicate: bool = False
    attrs: tuple = ()
    doc: str = ""


def _float_only(c_function: str) -> Callable:
    return lambda ctype, attrs: f"{c_function}(x)"


def _on_floats(function) -> Callable:
    """A rounding op: ``function`` on floats, the identity on integers."""
    return lambda x, attrs: function(x) if x.dtype.kind == "f" else x


def _zero(x, attrs):
    return np.zeros_like(x, dtype=np.float64)


def _softplus(x, beta, threshold):
    with np.errstate(over="ignore"):
        return np.where(x * beta > threshold, x, np.logaddexp(0.0, beta * x) / beta)


def _softplus_body(beta: float, threshold: float) -> str:
    b, t = literal(beta, "float"), literal(threshold, "float")
    return f"x * {b} > {t} ? x : log1pf(expf({b} * x)) / {b}"


def _clamp_body(value: str, low: str, high: str) -> str:
    """``value`` clamped to [low, high] with NaN passing through (fminf/fmaxf would drop it)."""
    return f"({value} < {low} ? {low} : ({value} > {high} ? {high} : {value}))"


def _hardsigmoid(x, alpha, beta):
    return np.clip(alpha * x + beta, 0.0, 1.0)


def _sign_body(ctype, attrs):
    one, zero = literal(1, ctype), literal(0, ctype)
    if ctype == "unsigned char":
        return f"x > {zero} ? {one} : {zero}"
    rest = "x" if is_float_ctype(ctype) else zero  # floats keep NaN and the zero's sign
    return f"x > {zero} ? {one} : (x < {zero} ? {literal(-1, ctype)} : {rest})"


def _abs_body(ctype, attrs):
    if is_float_ctype(ctype):
        return "fabsf(x)"
    return "x" if ctype == "unsigned char" else f"x < {literal(0, ctype)} ? -x : x"


def _rounding(c_function):
    return lambda ctype, attrs: f"{c_function}(x)" if is_float_ctype(ctype) else "x"


def _bounds(attrs, ctype):
    low = None if attrs["min"] is None else literal(attrs["min"], ctype)
    high = None if attrs["max"] is None else literal(attrs["max"], ctype)
    return low, high


def _clip_body(ctype, attrs):
    low, high = _bounds(attrs, ctype)
    value = "x" if low is None else f"(x < {low} ? {low} : x)"
    return value if high is None else f"{value} > {high} ? {high} : {value}"


def _clip_reference(x, attrs):
    if attrs["min"] is not None:
        x = np.where(x < attrs["min"], np.asarray(attrs["min"]).astype(x.dtype), x)
    if attrs["max"] is not None:
        x = np.where(x > attrs["max"], np.asarray(attrs["max"]).astype(x.dtype), x)
    return x


def _clip_derivative(x, attrs):
    inside = np.ones(x.shape, bool)
    if attrs["min"] is not None:
        inside &= x >= attrs["min"]
    if attrs["max"] is not None:
        inside &= x <= attrs["max"]
    return inside.astype(np.float64)


def _clip_derivative_body(attrs):
    low, high = _bounds(attrs, "float")
    tests = [t for t in (low and f"x >= {low}", high and f"x <= {high}") if t]
    return f"({' && '.join(tests)}) ? 1.0f : 0.0f" if tests else "1.0f"


def _mish(x):
    return x * np.tanh(_softplus(x, 1.0, 20.0))


def _mish_derivative(x, attrs):
    t = np.tanh(_softplus(x, 1.0, 20.0))
    return t + x * (1.0 - t * t) * sigmoid(x)


_MISH_TANH = f"tanhf({_softplus_body(1.0, 20.0)})"
_SIGMOID_BODY = "1.0f / (1.0f + expf(-x))"


def _nonzero(ctype: str, name: str) -> str:
    return name if ctype == "bool" else f"{name} != {literal(0, ctype)}"


def _number(name: str) -> Attr:
    return Attr(name, float, None, doc=f"the {name} bound; None for none")


def _slope_attr(default: float, doc: str) -> Attr:
    return Attr("alpha", float, default, doc=doc)


def _positive(value):
    return None if value > 0 else "must be > 0"


UNARY = (
    Unary("abs", NUMERIC, lambda x, a: np.abs(x), _abs_body, lambda x, a: np.sign(x),
          lambda a: "x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x * 0.0f)", doc="|x|; its gradient sign(x), NaN at NaN"),
    Unary("sign", NUMERIC, lambda x, a: np.sign(x), _sign_body, _zero, lambda a: "0.0f",
          doc="-1, 0 or 1 (NaN stays NaN); zero gradient"),
    Unary("exp2", FLOAT, lambda x, a: np.exp2(x), _float_only("exp2f"), lambda x, a: np.exp2(x) * _LN2,
          lambda a: f"exp2f(x) * {literal(_LN2, 'float')}", doc="2^x"),
    Unary("expm1", FLOAT, lambda x, a: np.expm1(x), _float_only("expm1f"), lambda x, a: np.exp(x),
          lambda a: "expf(x)", doc="e^x - 1"),
    Unary("log", FLOAT, lambda x, a: np.log(x), _float_only("logf"), lambda x, a: 1.0 / x, lambda a: "1.0f / x",
          doc="natural logarithm"),
    Unary("log2", FLOAT, lambda x, a: np.log2(x), _float_only("log2f"), lambda x, a: 1.0 / (x * _LN2),
          lambda a: f"1.0f / (x * {literal(_LN2, 'float')})", doc="base-2 logarithm"),
    Unary("log1p", FLOAT, lambda x, a: np.log1p(x), _float_only("log1pf"), lambda x, a: 1.0 / (1.0 + x),
          lambda a: "1.0f / (1.0f + x)", doc="log(1 + x)"),
    Unary("sqrt", FLOAT, lambda x, a: np.sqrt(x), _float_only("sqrtf"), lambda x, a: 0.5 / np.sqrt(x),
          lambda a: "0.5f / sqrtf(x)", doc="square root"),
    # 1 / sqrtf, not rsqrtf (2 ulp): exact where the reference is
    Unary("rsqrt", FLOAT, lambda x, a: 1.0 / np.sqrt(x), lambda c, a: "1.0f / sqrtf(x)",
          lambda x, a: -0.5 / (x * np.sqrt(x)), lambda a: "-0.5f / (x * sqrtf(x))", doc="1 / sqrt(x)"),
    Unary("reciprocal", FLOAT, lambda x, a: 1.0 / x, lambda c, a: "1.0f / x", lambda x, a: -1.0 / (x * x),
          lambda a: "-1.0f / (x * x)", doc="1 / x"),
    Unary("sin", FLOAT, lambda x, a: np.sin(x), _float_only("sinf"), lambda x, a: np.cos(x), lambda a: "cosf(x)",
          doc="sine"),
    Unary("cos", FLOAT, lambda x, a: np.cos(x), _float_only("cosf"), lambda x, a: -np.sin(x), lambda a: "-sinf(x)",
          doc="cosine"),
    Unary("erf", FLOAT, lambda x, a: np.vectorize(math.erf, otypes=[np.float64])(x), _float_only("erff"),
          lambda x, a: 2.0 / math.sqrt(math.pi) * np.exp(-x * x),
          lambda a: f"{literal(2.0 / math.sqrt(math.pi), 'float')} * expf(-x * x)", doc="the error function"),
    Unary("floor", NUMERIC, _on_floats(np.floor), _rounding("floorf"), _zero, lambda a: "0.0f",
          doc="round down (the identity on integers); zero gradient"),
    Unary("ceil", NUMERIC, _on_floats(np.ceil), _rounding("ceilf"), _zero, lambda a: "0.0f",
          doc="round up (the identity on integers); zero gradient"),
    Unary("round", NUMERIC, _on_floats(np.round), _rounding("rintf"), _zero, lambda a: "0.0f",
          doc="round to nearest, half to even (the identity on integers); zero gradient"),
    Unary("trunc", NUMERIC, _on_floats(np.trunc), _rounding("truncf"), _zero, lambda a: "0.0f",
          doc="round toward zero (the identity on integers); zero gradient"),
    Unary("softplus", FLOAT, lambda x, a: _softplus(x, a["beta"], a["threshold"]),
          lambda c, a: _softplus_body(a["beta"], a["threshold"]),
          lambda x, a: np.where(x * a["beta"] > a["threshold"], 1.0, sigmoid(a["beta"] * x)),
          lambda a: f"x * {literal(a['beta'], 'float')} > {literal(a['threshold'], 'float')} ? 1.0f : 1.0f / "
                    f"(1.0f + expf(-{literal(a['beta'], 'float')} * x))",
          attrs=(Attr("beta", float, 1.0, check=_positive, doc="log(1 + exp(beta x)) / beta"),
                 Attr("threshold", float, 20.0, doc="above it (beta x > threshold) the result is x")),
          doc="log(1 + exp(beta x)) / beta, x where beta x > threshold (PyTorch's Softplus)"),
    Unary("mish", FLOAT, lambda x, a: _mish(x), lambda c, a: f"x * {_MISH_TANH}", _mish_derivative,
          lambda a: f"{_MISH_TANH} + x * (1.0f - {_MISH_TANH} * {_MISH_TANH}) * ({_SIGMOID_BODY})",
          doc="x tanh(softplus(x))"),
    Unary("hardswish", FLOAT, lambda x, a: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
          lambda c, a: f"x * {_clamp_body('x + 3.0f', '0.0f', '6.0f')} / 6.0f",
          lambda x, a: np.where(x < -3.0, 0.0, np.where(x > 3.0, 1.0, x / 3.0 + 0.5)),
          lambda a: "x < -3.0f ? 0.0f : (x > 3.0f ? 1.0f : x / 3.0f + 0.5f)", doc="x relu6(x + 3) / 6"),
    Unary("hardsigmoid", FLOAT, lambda x, a: _hardsigmoid(x, a["alpha"], a["beta"]),
          lambda c, a: _clamp_body(f"{literal(a['alpha'], c)} * x + {literal(a['beta'], c)}", "0.0f", "1.0f"),
          lambda x, a: np.where((a["alpha"] * x + a["beta"] > 0.0) & (a["alpha"] * x + a["beta"] < 1.0),
                                a["alpha"], 0.0),
          lambda a: f"{literal(a['alpha'], 'float')} * x + {literal(a['beta'], 'float')} > 0.0f && "
                    f"{literal(a['alpha'], 'float')} * x + {literal(a['beta'], 'float')} < 1.0f ? "
                    f"{literal(a['alpha'], 'float')} : 0.0f",
          attrs=(Attr("alpha", float, 1.0 / 6.0, doc="slope (ONNX's default is 0.2)"),
                 Attr("beta", float, 0.5, doc="offset")),
          doc="clip(alpha x + beta, 0, 1); PyTorch's defaults alpha=1/6, beta=0.5"),
    Unary("leaky_relu", FLOAT, lambda x, a: np.where(x > 0, x, a["alpha"] * x),
          lambda c, a: f"x > 0.0f ? x : {literal(a['alpha'], c)} * x",
          lambda x, a: np.where(x > 0, 1.0, a["alpha"]), lambda a: f"x > 0.0f ? 1.0f : {literal(a['alpha'], 'float')}",
          attrs=(_slope_attr(0.01, "slope for x <= 0"),), doc="x for x > 0, else alpha x"),
    Unary("elu", FLOAT, lambda x, a: np.where(x > 0, x, a["alpha"] * np.expm1(np.minimum(x, 0.0))),
          lambda c, a: f"x > 0.0f ? x : {literal(a['alpha'], c)} * expm1f(x)",
          lambda x, a: np.where(x > 0, 1.0, a["alpha"] * np.exp(np.minimum(x, 0.0))),
          lambda a: f"x > 0.0f ? 1.0f : {literal(a['alpha'], 'float')} * expf(x)",
          attrs=(_slope_attr(1.0, "scale of exp(x) - 1 for x <= 0"),), doc="x for x > 0, else alpha (e^x - 1)"),
    Unary("clip", NUMERIC, _clip_reference, _clip_body, _clip_derivative, _clip_derivative_body,
          attrs=(_number("min"), _number("max")),
          doc="min(max(x, min), max) with NaN passing through (hardtanh, relu6); the gradient flows where "
              "min <= x <= max"),
    Unary("logical_not", ANY, lambda x, a: np.logical_not(x), lambda c, a: f"!({_nonzero(c, 'x')})", predicate=True,
          doc="x == 0 (NaN is true, so its logical_not is false)"),
    Unary("isnan", ANY, lambda x, a: np.isnan(x) if x.dtype.kind == "f" else np.zeros(x.shape, bool),
          lambda c, a: "x != x" if is_float_ctype(c) else "false", predicate=True, doc="x is NaN"),
    Unary("isinf", ANY, lambda x, a: np.isinf(x) if x.dtype.kind == "f" else np.zeros(x.shape, bool),
          lambda c, a: f"fabsf(x) > {_FLT_MAX}" if is_float_ctype(c) else "false", predicate=True,
          doc="x is +inf or -inf"),
)


def _minimum_body(ctype, attrs):  # NaN wins, as np.minimum
    return "(a < b || a != a) ? a : b"


def _maximum_body(ctype, attrs):
    return "(a > b || a != a) ? a : b"


def _mod_reference(a, b, attrs):
    if a.dtype.kind == "f":
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.fmod(a, b) if attrs["fmod"] else np.mod(a, b)
    safe = np.where(b == 0, 1, b)
    with np.errstate(over="ignore"):
        remainder = np.fmod(a, safe) if attrs["fmod"] else np.mod(a, safe)
    return np.where(b == 0, 0, remainder).astype(a.dtype)


def _mod_body(ctype, attrs):
    if is_float_ctype(ctype):
        if attrs["fmod"]:
            return "fmodf(a, b)"
        return "fmodf(a, b) != 0.0f && ((fmodf(a, b) < 0.0f) != (b < 0.0f)) ? fmodf(a, b) + b : fmodf(a, b)"
    zero = literal(0, ctype)
    if attrs["fmod"] or ctype == "unsigned char":  # no signs to adjust for
        return f"b == {zero} ? {zero} : a % b"
    return (f"b == {zero} ? {zero} : ((a % b != {zero} && ((a % b < {zero}) != (b < {zero}))) ? a % b + b : "
            f"a % b)")


def _mod_partial_b(a, b, attrs):
    quotient = np.trunc(a / b) if attrs["fmod"] else np.floor(a / b)
    return -quotient


def _pow_reference(a, b, attrs):
    if a.dtype.kind == "f":
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return np.power(a, b)
    # integers: b < 0 gives 1 / a^|b| truncated (0 but for a = +-1, and 0 for a = 0), as the generated kernel
    wide = a.astype(np.int64)
    negative = b < 0
    with np.errstate(over="ignore"):
        positive = np.power(wide, np.where(negative, 0, b).astype(np.int64))
    inverse = np.where(wide == 1, 1, np.where(wide == -1, np.where(b % 2 == 0, 1, -1), 0))
    return np.where(negative, inverse, positive).astype(a.dtype)


def _pow_body(ctype, attrs):
    if is_float_ctype(ctype):
        return "powf(a, b)"
    if ctype == "bool":
        return "a || !b"
    zero, one = literal(0, ctype), literal(1, ctype)
    # exponentiation by squaring; a negative exponent leaves 1 / a^|b| truncated toward zero
    minus_one = literal(-1, ctype) if ctype != "unsigned char" else zero  # no -1 base in uint8
    return (f"{{ if (b < {zero}) return a == {one} ? {one} : (a == {minus_one} ? (b % 2 == 0 ? {one} : a) : "
            f"{zero}); {ctype} r = {one}; while (b > {zero}) {{ if (b & 1) r = r * a; a = a * a; b = b >> 1; }} "
            f"return r; }}")


def _pow_partial_b(a, b, attrs):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((a == 0) & (b >= 0), 0.0, np.power(a, b) * np.log(a))


def _compare(name, function, symbol, doc):
    return Binary(name, ANY, lambda a, b, attrs: function(a, b), lambda c, attrs: f"a {symbol} b", predicate=True,
                  doc=doc)


def _logical(name, function, c_operator, doc):
    return Binary(name, ANY, lambda a, b, attrs: function(a, b),
                  lambda c, attrs: f"({_nonzero(c, 'a')}) {c_operator} ({_nonzero(c, 'b')})", predicate=True,
                  doc=doc)


BINARY = (
    Binary("pow", NUMERIC, _pow_reference, _pow_body,
           (lambda a, b, attrs: b * np.power(a, b - 1.0), _pow_partial_b),
           (lambda attrs: "b * powf(a, b - 1.0f)",
            lambda attrs: "(a == 0.0f && b >= 0.0f) ? 0.0f : powf(a, b) * logf(a)"),
           doc="a^b; integers by repeated squaring (a negative exponent truncates 1 / a^|b| toward zero)"),
    Binary("mod", NUMERIC, _mod_reference, _mod_body,
           (lambda a, b, attrs: np.ones(np.broadcast_shapes(a.shape, b.shape)), _mod_partial_b),
           (lambda attrs: "1.0f",
            lambda attrs: f"-{'truncf' if attrs['fmod'] else 'floorf'}(a / b)"),
           attrs=(Attr("fmod", bool, False, doc="False: the result takes the divisor's sign (Python, ONNX fmod=0); "
                                                "True: the dividend's (C fmod, torch.fmod)"),),
           doc="the remainder of a / b; integers mod 0 give 0"),
    Binary("minimum", ANY, lambda a, b, attrs: np.minimum(a, b), _minimum_body,
           (lambda a, b, attrs: np.where(a < b, 1.0, np.where(a == b, 0.5, 0.0)),
            lambda a, b, attrs: np.where(b < a, 1.0, np.where(a == b, 0.5, 0.0))),
           (lambda attrs: "a < b ? 1.0f : (a == b ? 0.5f : 0.0f)",
            lambda attrs: "b < a ? 1.0f : (a == b ? 0.5f : 0.0f)"),
           doc="the smaller of a and b, NaN when either is; ties split the gradient"),
    Binary("maximum", ANY, lambda a, b, attrs: np.maximum(a, b), _maximum_body,
           (lambda a, b, attrs: np.where(a > b, 1.0, np.where(a == b, 0.5, 0.0)),
            lambda a, b, attrs: np.where(b > a, 1.0, np.where(a == b, 0.5, 0.0))),
           (lambda attrs: "a > b ? 1.0f : (a == b ? 0.5f : 0.0f)",
            lambda attrs: "b > a ? 1.0f : (a == b ? 0.5f : 0.0f)"),
           doc="the larger of a and b, NaN when either is; ties split the gradient"),
    _compare("equal", np.equal, "==", "a == b"),
    _compare("not_equal", np.not_equal, "!=", "a != b (true where either is NaN)"),
    _compare("less", np.less, "<", "a < b"),
    _compare("less_equal", np.less_equal, "<=", "a <= b"),
    _compare("greater", np.greater, ">", "a > b"),
    _compare("greater_equal", np.greater_equal, ">=", "a >= b"),
    _logical("logical_and", np.logical_and, "&&", "a and b, each true where nonzero"),
    _logical("logical_or", np.logical_or, "||", "a or b, each true where nonzero"),
    _logical("logical_xor", np.logical_xor, "!=", "exactly one of a and b is nonzero"),
)
UNARY_OPS = tuple(spec.name for spec in UNARY)
BINARY_OPS = tuple(spec.name for spec in BINARY)
POINTWISE_OPS = UNARY_OPS + BINARY_OPS + ("where",)


# ---------------------------------------------------------------------------------------------------------------
# Inference
# ---------------------------------------------------------------------------------------------------------------
def _check_accepts(kind: str, dtype: str, what: str) -> None:
    if not _accepts(kind, dtype):
        raise TypeError(f"{what}: expected {_EXPECTED[kind]}, got {dtype}")


def _infer_unary(spec: Unary):
    def infer(in_types, attrs):
        require_inputs(in_types, ("x",))
        (x,) = in_types
        _check_accepts(spec.accepts, x.dtype, "x")
        if spec.name == "clip" and not is_float(x.dtype):
            info = np.iinfo(to_numpy(x.dtype))
            for bound in ("min", "max"):
                value = attrs[bound]
                if value is not None and not (math.isfinite(value) and value == int(value)
                                              and info.min <= value <= info.max):
                    raise ValueError(f"{bound}: expected an integer in [{info.min}, {info.max}] for {x.dtype} x, "
                                     f"got {value!r}")
        return [TensorType(x.shape, "bool" if spec.predicate else x.dtype)]

    return infer


def _infer_binary(spec: Binary):
    def infer(in_types, attrs):
        require_inputs(in_types, ("a", "b"))
        a, b = in_types
        dtype = result_type(a, b)
        _check_accepts(spec.accepts, dtype, f"a, b (dtypes {a.dtype} and {b.dtype} promote to {dtype})")
        return [TensorType(broadcast_shapes(a.shape, b.shape), "bool" if spec.predicate else dtype)]

    return infer


def _infer_where(in_types, attrs):
    require_inputs(in_types, ("cond", "a", "b"))
    cond, a, b = in_types
    if cond.dtype != "bool":
        raise TypeError(f"cond: expected dtype bool (a mask, as comparisons give), got {cond.dtype}")
    shape = broadcast_shapes(broadcast_shapes(cond.shape, a.shape, ("cond", "a")), b.shape, ("cond, a", "b"))
    return [TensorType(shape, result_type(a, b))]


# ---------------------------------------------------------------------------------------------------------------
# Op definitions
# ---------------------------------------------------------------------------------------------------------------
def _unary_def(spec: Unary) -> OpDef:
    def reference(inputs, attrs):
        (x,) = _operands(inputs)
        with np.errstate(all="ignore"):
            return [spec.reference(x, attrs)]

    def reference_backward(inputs, outputs, out_grads, attrs):
        if not _is_float_array(inputs[0]):
            return [None]
        with np.errstate(all="ignore"):
            return [np.asarray(out_grads[0], np.float64) * spec.derivative(np.asarray(inputs[0], np.float64), attrs)]

    positive = spec.name in ("log", "log2", "sqrt", "rsqrt")  # samples where the op is real and finite
    attrs = {"min": -0.5, "max": 0.5} if spec.name == "clip" else {}
    return OpDef(name=spec.name, inputs=(Input("x"),), outputs=("y",), attrs=spec.attrs, infer=_infer_unary(spec),
                 samples=lambda rng: [Sample((sample_array(rng, 4, 6, positive=positive),), attrs)],
                 reference=reference, reference_backward=None if spec.derivative is None else reference_backward,
                 scalar=lambda args, attrs, ctype: expression(spec.body(ctype, attrs), ("x",), args, ctype),
                 doc=f"{spec.name}(x): {spec.doc}.")


def _binary_def(spec: Binary) -> OpDef:
    def reference(inputs, attrs):
        a, b = _operands(inputs)
        with np.errstate(all="ignore"):
            return [spec.reference(a, b, attrs)]

    def reference_backward(inputs, outputs, out_grads, attrs):
        a, b = (np.asarray(x, np.float64) for x in inputs)
        dy = np.asarray(out_grads[0], np.float64)
        grads = []
        for x, partial in zip(inputs, spec.partials):
            if partial is None or not _is_float_array(x):
                grads.append(None)
                continue
            with np.errstate(all="ignore"):
                grads.append(reduce_to_shape(np.broadcast_to(dy * partial(a, b, attrs), dy.shape), np.shape(x)))
        return grads

    differentiable = any(partial is not None for partial in spec.partials)
    power = spec.name == "pow"  # samples: a positive base; a nonzero divisor for the others
    return OpDef(name=spec.name, inputs=(Input("a"), Input("b")), outputs=("y",), attrs=spec.attrs,
                 samples=lambda rng: [Sample((sample_array(rng, 4, 6, positive=power),
                                              sample_array(rng, 6, positive=not power)))],
                 infer=_infer_binary(spec), reference=reference,
                 reference_backward=reference_backward if differentiable else None,
                 scalar=lambda args, attrs, ctype: expression(spec.body(ctype, attrs), ("a", "b"), args, ctype),
                 doc=f"{spec.name}(a, b): {spec.doc}; NumPy broadcasting, PyTorch type promotion.")


def _where_reference(inputs, attrs):
    cond = np.asarray(inputs[0]).astype(bool)
    a, b = _operands(inputs[1:])
    return [np.where(cond, a, b)]


def _where_reference_backward(inputs, outputs, out_grads, attrs):
    cond = np.asarray(inputs[0]).astype(bool)
    dy = np.asarray(out_grads[0], np.float64)
    grads = [None]
    for x, chosen in zip(inputs[1:], (cond, ~cond)):
        grads.append(reduce_to_shape(np.where(chosen, dy, 0.0), np.shape(x)) if _is_float_array(x) else None)
    return grads


for _spec in UNARY:
    register(_unary_def(_spec))
for _spec in BINARY:
    register(_binary_def(_spec))
register(OpDef(name="where", inputs=(Input("cond"), Input("a"), Input("b")), outputs=("y",), attrs=(),
               samples=lambda rng: [Sample((sample_array(rng, 4, 6) > 0, sample_array(rng, 4, 6),
                                            sample_array(rng, 6)))],
               infer=_infer_where, reference=_where_reference, reference_backward=_where_reference_backward,
               scalar=lambda args, attrs, ctype: expression("cond ? a : b", ("cond", "a", "b"), args, ctype),
               doc="where(cond, a, b): a where cond is true, else b; the three broadcast, a and b promote."))


# ---------------------------------------------------------------------------------------------------------------
# Gradients: pointwise backward ops (each with a scalar rule) and the grad rules that emit them
# ---------------------------------------------------------------------------------------------------------------
def _unary_backward_def(spec: Unary) -> OpDef:
    def infer(in_types, attrs):
        require_inputs(in_types, ("dy", "x"))
        _check_accepts(FLOAT, in_types[1].dtype, "x")
        return [in_types[1]]

    def reference(inputs, attrs):
        dy, x = (np.asarray(v, np.float64) for v in inputs)
        with np.errstate(all="ignore"):
            return [dy * spec.derivative(x, attrs)]

    return _grad.register_backward(OpDef(
        name=f"{spec.name}_backward", inputs=(Input("dy"), Input("x")), outputs=("dx",), attrs=spec.attrs,
        infer=infer, reference=reference,
        scalar=lambda args, attrs, ctype: expression(f"dy * ({spec.derivative_body(attrs)})", ("dy", "x"), args,
                                                     ctype),
        doc=f"{spec.name}_backward(dy, x) -> dx = dy * {spec.name}'(x)"))


def _partial_def(name: str, operand: int, inputs: tuple[str, ...], reference_partial, body) -> OpDef:
    """``<op>_grad_<input>(dy, *forward inputs)``: dy times the partial derivative by forward input ``operand``,
    of the broadcast shape and that input's dtype (the grad rule sums it over the broadcast dims)."""
    def infer(in_types, attrs):
        require_inputs(in_types, ("dy",) + inputs)
        _check_accepts(FLOAT, in_types[1 + operand].dtype, inputs[operand])  # integers have no gradient
        return [TensorType(in_types[0].shape, in_types[1 + operand].dtype)]

    def reference(arrays, attrs):
        with np.errstate(all="ignore"):
            return [reference_partial(*arrays, attrs)]

    return _grad.register_backward(OpDef(
        name=name, inputs=(Input("dy"),) + tuple(map(Input, inputs)), outputs=(f"d{inputs[operand]}",),
        attrs=OPS[name.rsplit("_grad_", 1)[0]].attrs, infer=infer, reference=reference,
        scalar=lambda args, attrs, ctype: expression(body(attrs), ("dy",) + inputs, args, ctype),
        doc=f"{name}(dy, {', '.join(inputs)}): the gradient of {inputs[operand]}, before the sum over its broadcast "
            "dims"))


def _binary_partial_reference(partial):
    def reference(dy, a, b, attrs):
        a, b = (np.asarray(v, np.float64) for v in (a, b))
        return np.asarray(dy, np.float64) * np.broadcast_to(partial(a, b, attrs), np.shape(dy))

    return reference


def _binary_partial_body(body):
    return lambda attrs: f"dy * ({body(attrs)})"


def _sum_to(g, dy, x):
    return _grad.sum_to(g, dy, x.type.shape)


def _unary_grad(spec: Unary):
    def rule(g, node, dys):
        if not is_float(node.inputs[0].type.dtype):
            return [None]
        return [getattr(g, f"{spec.name}_backward")(dys[0], node.inputs[0], **node.attrs)]

    return rule


def _binary_grad(spec: Binary):
    def rule(g, node, dys):
        grads = []
        for operand, (x, partial) in enumerate(zip(node.inputs, spec.partials)):
            if partial is None or not is_float(x.type.dtype):
                grads.append(None)
                continue
            builder = getattr(g, f"{spec.name}_grad_{'ab'[operand]}")
            grads.append(_sum_to(g, builder(dys[0], *node.inputs, **node.attrs), x))
        return grads

    return rule


def _where_grad(g, node, dys):
    cond, a, b = node.inputs
    return [None] + [_sum_to(g, getattr(g, f"where_grad_{name}")(dys[0], cond, a, b), x) if is_float(x.type.dtype)
                     else None for name, x in (("a", a), ("b", b))]


# Predicates (comparisons, logical ops, isnan) have no gradient: no reference_backward, no grad rule.
for _spec in UNARY:
    if _spec.derivative is not None:
        _unary_backward_def(_spec)
        attach_grad(OPS[_spec.name], _unary_grad(_spec))
for _spec in BINARY:
    for _operand, (_partial, _body) in enumerate(zip(_spec.partials, _spec.partial_bodies)):
        if _partial is not None:
            _partial_def(f"{_spec.name}_grad_{'ab'[_operand]}", _operand, ("a", "b"),
                         _binary_partial_reference(_partial), _binary_partial_body(_body))
    if OPS[_spec.name].reference_backward is not None:
        attach_grad(OPS[_spec.name], _binary_grad(_spec))
_partial_def("where_grad_a", 1, ("cond", "a", "b"),
             lambda dy, cond, a, b, attrs: np.where(np.asarray(cond, bool), np.asarray(dy, np.float64), 0.0),
             lambda attrs: "cond ? dy : 0.0f")
_partial_def("where_grad_b", 2, ("cond", "a", "b"),
             lambda dy, cond, a, b, attrs: np.where(np.asarray(cond, bool), 0.0, np.asarray(dy, np.float64)),
             lambda attrs: "cond ? 0.0f : dy")
attach_grad(OPS["where"], _where_grad)


# ---------------------------------------------------------------------------------------------------------------
# Faces: ``ge2.ops.<op>``. The forward runs the op's candidates; the backward runs the backward ops above on the
# device, then sums over the broadcast dims.
# ---------------------------------------------------------------------------------------------------------------
def _run(opdef: OpDef, arrays: list, names: list[str], attrs: dict, out, stream):
    """One op on contiguous device arrays, by its best candidate for the problem (the backward ops have no face)."""
    views = list(_layout.input_views(dict(zip(names, arrays))).values())
    in_types = [TensorType(tuple(v.shape), v.dtype) for v in views]
    (out_type,) = opdef.infer(in_types, attrs)
    problem = Problem(opdef.name, tuple(in_types), (out_type,), attrs, _device.compute_capability(views[0].device))
    ranking = selection.rank(opdef, problem, aligned=not any(v.ptr & 15 for v in views))
    if not ranking.viable:
        reasons = "; ".join(f"{name}: {reason}" for name, reason in ranking.rejected)
        raise RuntimeError(f"{opdef.name}: no GPU kernel can run this problem ({reasons or 'none registered'})")
    launch = selection.choose(ranking, problem, catch=()).launch
    array, view = _layout.output(out, arrays[0], "out", out_type.shape, out_type.dtype, views[0].device)
    launch([v.ptr for v in views], [view.ptr], _device.stream_handle(stream))
    return array


def _reduce_to(gradient, shape: tuple, out, stream):
    """``gradient`` (broadcast shape) summed over the dims an operand of ``shape`` was broadcast along."""
    full = tuple(_device.view_of(gradient, "gradient").shape)
    if full == tuple(shape):
        return gradient
    extra = len(full) - len(shape)
    axes = tuple(range(extra)) + tuple(extra + i for i, d in enumerate(shape) if d == 1 and full[extra + i] != 1)
    kept = [d for i, d in enumerate(full) if i not in axes]
    # the sum face registers after this module; a reshape of a contiguous array is a view for every array kind
    summed = FACES["sum"].forward(gradient, axis=axes, out=None if out is None else out.reshape(kept), stream=stream)
    return summed.reshape(list(shape)) if out is None else out


def _backward(name: str):
    opdef = OPS[name]

    def backward(dy, inputs, attrs, kernel, out, stream):
        """One gradient per input (None for an integer or bool input, or a non-differentiable op)."""
        names = [i.name for i in opdef.inputs]
        views = _layout.input_views(dict(zip(names, inputs)))
        in_types = [TensorType(tuple(v.shape), v.dtype) for v in views.values()]
        (out_type,) = opdef.infer(in_types, attrs)
        _layout.checked_view(dy, "dy", out_type.shape, out_type.dtype, next(iter(views.values())).device)
        grads = []
        for index, (x, t) in enumerate(zip(inputs, in_types)):
            backward_name = (f"{name}_backward" if len(inputs) == 1 else
                             f"{name}_grad_{names[index]}")
            if backward_name not in OPS or not is_float(t.dtype):
                grads.append(None)
                continue
            target = None if out is None else out[index]
            partial = _run(OPS[backward_name], [dy, *inputs], ["dy", *names], attrs,
                           target if tuple(t.shape) == tuple(out_type.shape) else None, stream)
            grads.append(_reduce_to(partial, t.shape, target, stream))
        return tuple(grads)

    return backward


for _name in POINTWISE_OPS:
    Face(OPS[_name], _backward(_name), in_place=True)
