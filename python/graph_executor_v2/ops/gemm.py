"""gemm: ``Y = act(alpha * op(A) @ op(B) + beta * C + bias)``, row-major, bias per output column; with
``residual_after_act`` the residual comes after the activation, as a skip connection does:
``Y = act(alpha * op(A) @ op(B) + bias) + beta * C``.

Inputs float32/float16/bfloat16 (all of one dtype) with float32 accumulation; TF32 only with ``allow_tf32``.
``act`` is one of none, relu, gelu (tanh form, as cuBLASLt), gelu_erf (the exact form), silu, leaky_relu (``slope``). With
``save_preact`` the pre-activation ``Z`` is returned too, for backward.

Kernel candidates (``kernels()``), best first:
1. ``cublaslt_epilogue``: cuBLASLt with bias/activation fused into the epilogue (BIAS, RELU_BIAS, GELU_BIAS,
   GELU_AUX_BIAS for the saved pre-activation).
2. ``cublaslt_postkernel``: cuBLASLt GEMM + one fused bias/activation/residual kernel; the fallback for SiLU,
   leaky ReLU, misaligned pointers or no algorithm from the heuristic. ``GE2_FORCE_NO_EPILOGUE=1`` starts here.
3. ``cutlass_sm90``: CUTLASS 3.x warp-specialized persistent GEMM for Hopper (sm_90a: TMA, wgmma) with bias,
   residual, alpha and activation fused by an epilogue visitor tree; float16/bfloat16, no transposes, K and N
   multiples of 8. NOT BUILT (its ``kernels()`` row says why) without CUTLASS's headers (the ``cutlass`` extra or
   ``GE2_CUTLASS_DIR``).
4. ``tiled``: GE2's own tiled kernel, no cuBLAS: the path that always works.

The backward (``backward``, and ``gemm_backward`` in plans) runs the same kernels but ``cutlass_sm90``: the fused
epilogue (dbias as BGRAD, a chained gelu as DGELU_BGRAD), plain cuBLASLt with post-kernels, or tiled. cuBLASLt's
heuristic is asked for each of the call's matmuls when the kernel is chosen, so the selector runs the next kernel
exactly where cuBLASLt has no algorithm; the native call runs only the kernel it is named.
"""
from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from .. import device as _device
from .. import _native
from .. import selection
from ..dtypes import FLOAT_DTYPES, normalize
from ..ir.types import TensorType
from . import _layout, activations
from ._base import (Attr, Input, OpDef, Problem, Sample, as_float64, in_ptr, native_launch, out_ptr, register,
                    require_inputs, sample_array, stream_arg, table_candidate)
from ._face import FACES, Face

GEMM_ACTIVATIONS = ("none", "relu", "gelu", "gelu_erf", "silu", "leaky_relu")


def _native_module():
    return _native.load("_ops_gemm")


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def reference(a, b, bias=None, c=None, *, act="none", alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
              slope=0.01, residual_after_act=False):
    """Returns (Y, Z) in float64, Z being the pre-activation (without the residual when it comes after)."""
    a64, b64 = as_float64(a), as_float64(b)
    z = alpha * ((a64.T if trans_a else a64) @ (b64.T if trans_b else b64))
    residual = beta * as_float64(c) if c is not None and beta != 0.0 else 0.0
    if not residual_after_act:
        z = z + residual
    if bias is not None:
        z = z + as_float64(bias)[None, :]
    y = activations.apply(act, z, slope)
    return (y + residual if residual_after_act else y), z


def reference_backward(dy, a, b, preact=None, *, act="none", alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
                       slope=0.01, residual_after_act=False):
    """Returns (dA, dB, dbias, dC) in float64 for the forward above (dC = beta * dZ, or beta * dY when the residual
    comes after the activation)."""
    dy64, a64, b64 = as_float64(dy), as_float64(a), as_float64(b)
    dz = dy64 if act == "none" else dy64 * activations.derivative(act, as_float64(preact), slope)
    op_a = a64.T if trans_a else a64
    op_b = b64.T if trans_b else b64
    d_op_a = alpha * dz @ op_b.T
    d_op_b = alpha * op_a.T @ dz
    dc = beta * (dy64 if residual_after_act else dz)
    return (d_op_a.T if trans_a else d_op_a, d_op_b.T if trans_b else d_op_b, dz.sum(axis=0), dc)


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes and dtypes only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmShape:
    m: int
    n: int
    k: int
    dtype: str


def check_operands(a_shape, a_dtype, b_shape, b_dtype, bias_shape=None, bias_dtype=None, c_shape=None,
                   c_dtype=None, *, act="none", trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
                   slope=0.01) -> GemmShape:
    """Validates a gemm problem; raises ValueError/TypeError naming the argument, the expectation and the value."""
    if len(a_shape) != 2:
        raise ValueError(f"a: expected a 2-d array, got shape {tuple(a_shape)}")
    if len(b_shape) != 2:
        raise ValueError(f"b: expected a 2-d array, got shape {tuple(b_shape)}")
    if a_dtype not in FLOAT_DTYPES:
        raise TypeError(f"a: expected dtype float32, float16 or bfloat16, got {a_dtype}")
    if b_dtype != a_dtype:
        raise TypeError(f"b: expected dtype {a_dtype} (the dtype of a), got {b_dtype}")
    for name, value in (("trans_a", trans_a), ("trans_b", trans_b)):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    for name, value in (("alpha", alpha), ("beta", beta), ("slope", slope)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    if act not in GEMM_ACTIVATIONS:
        raise ValueError(f"act: expected one of {', '.join(GEMM_ACTIVATIONS)}, got {act!r}")
    m, k = (a_shape[1], a_shape[0]) if trans_a else (a_shape[0], a_shape[1])
    k_b, n = (b_shape[1], b_shape[0]) if trans_b else (b_shape[0], b_shape[1])
    if k != k_b:
        raise ValueError(f"b: inner dimension mismatch: op(a) is {m}x{k} but op(b) is {k_b}x{n} "
                         f"(trans_a={trans_a}, trans_b={trans_b})")
    if min(m, n, k) < 1:
        raise ValueError(f"a, b: every dimension must be >= 1, got M={m}, N={n}, K={k}")
    if bias_shape is not None:
        if tuple(bias_shape) != (n,):
            raise ValueError(f"bias: expected shape ({n},) (one per output column), got {tuple(bias_shape)}")
        if bias_dtype != a_dtype:
            raise TypeError(f"bias: expected dtype {a_dtype}, got {bias_dtype}")
    if c_shape is not None:
        if tuple(c_shape) != (m, n):
            raise ValueError(f"c: expected shape ({m}, {n}), got {tuple(c_shape)}")
        if c_dtype != a_dtype:
            raise TypeError(f"c: expected dtype {a_dtype}, got {c_dtype}")
    return GemmShape(m, n, k, a_dtype)


# ---------------------------------------------------------------------------------------------------------------
# Python face (ops/_face.py): forward is the generic one; these add the saved pre-activation and the gradients.
# ---------------------------------------------------------------------------------------------------------------
def _forward_with_preact(inputs, attrs, kernel, out, stream, save_preact=False, preact_out=None):
    """forward(..., save_preact=True): returns (y, z) with z the pre-activation (y itself for act='none')."""
    a, b, bias, c = inputs
    views = _layout.input_views({name: x for name, x in (("a", a), ("b", b), ("bias", bias), ("c", c))
                                 if x is not None})
    va, vb, vbias, vc = views["a"], views["b"], views.get("bias"), views.get("c")
    shape = check_operands(va.shape, va.dtype, vb.shape, vb.dtype, None if vbias is None else vbias.shape,
                           None if vbias is None else vbias.dtype, None if vc is None else vc.shape,
                           None if vc is None else vc.dtype, act=attrs["act"], trans_a=attrs["trans_a"],
                           trans_b=attrs["trans_b"], alpha=attrs["alpha"], beta=attrs["beta"], slope=attrs["slope"])
    y, vy = _layout.output(out, a, "out", (shape.m, shape.n), shape.dtype, va.device)
    want_preact = save_preact and attrs["act"] != "none"
    z, vz = (_layout.output(preact_out, a, "preact_out", (shape.m, shape.n), shape.dtype, va.device) if want_preact
             else (y, None))
    native, ptr = _native_module(), lambda view: 0 if view is None else view.ptr  # noqa: E731
    pointers = (va.ptr, vb.ptr, ptr(vc), ptr(vbias), vy.ptr, ptr(vz))
    for name in _call_kernels(kernel, views, attrs, pointers, want_preact):
        try:
            native.forward(*pointers, shape.m, shape.n, shape.k, shape.dtype, attrs["trans_a"], attrs["trans_b"],
                           attrs["alpha"], attrs["beta"] if vc is not None else 0.0, attrs["act"], attrs["slope"],
                           attrs["allow_tf32"], name, _device.stream_handle(stream),
                           residual_after_act=attrs["residual_after_act"])
            break
        except RuntimeError:  # cuBLASLt returned no algorithm: a chosen kernel falls to the next, a named one raises
            if kernel != "auto":
                raise
    return (y, z) if save_preact else y


def _call_kernels(kernel, views, attrs, pointers, save_preact) -> list[str]:
    """The kernels a direct native forward tries in order: the named one, or the selector's viable candidates for
    these pointers (a, b, c, bias, y, preact) and this save_preact, best first (the fused epilogue left out when
    the environment turned it off). The last one, tiled, always runs."""
    if kernel != "auto":
        return [kernel]
    native = _native_module()
    a, b, c, bias, y, preact = pointers
    epilogue_aligned = not (bias | preact) % 16  # what the cuBLASLt epilogue reads besides the operands
    every_aligned = not (a | b | c | bias | y | preact) % 16  # TMA (cutlass_sm90) reads every operand
    in_types = tuple(None if views.get(name) is None else TensorType(views[name].shape, views[name].dtype)
                     for name in ("a", "b", "bias", "c"))
    problem = Problem("gemm", in_types, tuple(OP.infer(list(in_types), attrs)), attrs)

    def supports(candidate, problem):
        m, n, k, dtype, has_bias, has_c = _problem_args(problem)
        aligned = every_aligned if candidate.name == "cutlass_sm90" else epilogue_aligned
        return native.unsupported_reason(candidate.name, m, n, k, dtype, attrs["act"], has_bias, has_c, save_preact,
                                         aligned, attrs["trans_a"], attrs["trans_b"],
                                         attrs["residual_after_act"]) or None

    return [candidate.name for candidate in selection.rank(OP, problem, supports=supports).viable]


def _check_chaining(a_shape, dtype, a_preact_shape, a_preact_dtype, a_act, a_slope):
    if a_act not in GEMM_ACTIVATIONS:
        raise ValueError(f"a_act: expected one of {', '.join(GEMM_ACTIVATIONS)}, got {a_act!r}")
    if isinstance(a_slope, bool) or not isinstance(a_slope, (int, float, np.floating, np.integer)):
        raise TypeError(f"a_slope: expected a float, got {type(a_slope).__name__}")
    if a_act != "none":
        if a_preact_shape is None:
            raise ValueError(f"a_preact: required for a_act={a_act!r} (the pre-activation that produced a)")
        if tuple(a_preact_shape) != tuple(a_shape):
            raise ValueError(f"a_preact: expected shape {tuple(a_shape)} (the shape of a), got {tuple(a_preact_shape)}")
        if a_preact_dtype != dtype:
            raise TypeError(f"a_preact: expected dtype {dtype}, got {a_preact_dtype}")


def _check_backward_options(inputs, attrs, preact=None, a_preact=None, a_act="none", a_slope=0.01):
    """The backward options against the problem: on host arrays before an upload, on views before a launch."""
    a, b = inputs[0], inputs[1]
    shape = check_operands(a.shape, normalize(a.dtype, "a"), b.shape, normalize(b.dtype, "b"), act=attrs["act"],
                           trans_a=attrs["trans_a"], trans_b=attrs["trans_b"], alpha=attrs["alpha"],
                           beta=attrs["beta"], slope=attrs["slope"])
    if attrs["act"] != "none":
        if preact is None:
            raise ValueError(f"preact: required for act={attrs['act']!r} (run forward with save_preact=True)")
        if tuple(preact.shape) != (shape.m, shape.n):
            raise ValueError(f"preact: expected shape ({shape.m}, {shape.n}), got {tuple(preact.shape)}")
        if normalize(preact.dtype, "preact") != shape.dtype:
            raise TypeError(f"preact: expected dtype {shape.dtype}, got {normalize(preact.dtype, 'preact')}")
    _check_chaining(a.shape, shape.dtype, None if a_preact is None else a_preact.shape,
                    None if a_preact is None else normalize(a_preact.dtype, "a_preact"), a_act, a_slope)
    return shape


def _backward_kernel(problem: Problem, why_not) -> str:
    """The kernel of a direct backward call: the selector's first viable candidate of gemm_backward, each checked
    by ``why_not(name)`` (the native check of this call's pointers: cuBLASLt's heuristic is asked with their
    alignment), so the tiled kernel runs exactly where cuBLASLt has no algorithm for one of the call's matmuls."""
    ranking = selection.rank(BACKWARD_OP, problem, supports=lambda candidate, _: why_not(candidate.name) or None)
    if not ranking.viable:
        reasons = "; ".join(f"{name}: {why}" for name, why in ranking.rejected)
        raise RuntimeError(f"gemm.backward: no kernel can run this problem ({reasons})")
    return ranking.viable[0].name


def _backward(dy, inputs, attrs, kernel, out, stream, preact=None, a_preact=None, a_act="none", a_slope=0.01,
              dbias_a_out=None):
    """(da, db, dbias, dc); dbias and dc are None when bias or c was not given. ``preact``: the saved
    pre-activation (forward with save_preact), required for act != 'none'.

    Layer chaining: when a = a_act(a_preact) came from the previous layer, pass ``a_preact``/``a_act`` and
    ``dbias_a_out``: da comes back as the gradient w.r.t. a_preact and that layer's bias gradient is written into
    dbias_a_out - fused into the da matmul as cuBLASLt's DGELU_BGRAD epilogue for gelu (trans_a False, K % 8 == 0),
    by a post-kernel otherwise.

    The kernel: the one named (the native call raises a ValueError saying why when it cannot run the call), or for
    "auto" the selector's choice among gemm_backward's candidates for this call (``_backward_kernel``)."""
    a, b, bias, c = inputs
    act = attrs["act"]
    views = _layout.input_views({name: x for name, x in (("dy", dy), ("a", a), ("b", b), ("preact", preact),
                                                          ("a_preact", a_preact)) if x is not None})
    va, vb, vdy = views["a"], views["b"], views["dy"]
    shape = _check_backward_options([va, vb], attrs, views.get("preact"), views.get("a_preact"), a_act, a_slope)
    _layout.checked_view(dy, "dy", (shape.m, shape.n), shape.dtype, va.device)
    vaz = views.get("a_preact")
    chained = a_act != "none"
    if chained and dbias_a_out is None:
        raise ValueError(f"dbias_a_out: required with a_act={a_act!r} (the previous layer's bias gradient, one per "
                         f"column of a)")
    entry = lambda index: None if out is None else out[index]  # noqa: E731
    new = lambda array, argument, shape_: _layout.output(array, a, argument, shape_, shape.dtype, va.device)  # noqa
    (da, vda), (db, vdb) = new(entry(0), "out[0]", tuple(va.shape)), new(entry(1), "out[1]", tuple(vb.shape))
    dbias, vdbias = new(entry(2), "out[2]", (shape.n,)) if bias is not None else (None, None)
    dc, vdc = new(entry(3), "out[3]", (shape.m, shape.n)) if c is not None else (None, None)
    vdz = new(None, "scratch", (shape.m, shape.n))[1] if act != "none" else None
    vdbias_a = new(dbias_a_out, "dbias_a_out", (va.shape[1],))[1] if chained else None
    ptr = lambda view: 0 if view is None else view.ptr  # noqa: E731
    call = (vdy.ptr, va.ptr, vb.ptr, ptr(views.get("preact")), ptr(vdz), vda.ptr, vdb.ptr, ptr(vdbias), ptr(vdc),
            shape.m, shape.n, shape.k, shape.dtype, attrs["trans_a"], attrs["trans_b"], attrs["alpha"], attrs["beta"],
            act, attrs["slope"], attrs["allow_tf32"], ptr(vaz), a_act, float(a_slope), ptr(vdbias_a))
    after = attrs["residual_after_act"]
    if kernel == "auto":
        backward_attrs = BACKWARD_OP.validate_attrs({name: value for name, value in attrs.items()
                                                     if name in ("alpha", "trans_a", "trans_b", "allow_tf32")}
                                                    | {"a_act": a_act, "a_slope": float(a_slope),
                                                       "with_dbias": bias is not None}, "gemm.backward")
        view_type = lambda view: None if view is None else TensorType(view.shape, view.dtype)  # noqa: E731
        problem = Problem(BACKWARD_OP.name, tuple(map(view_type, (vdy, va, vb, vaz))),
                          tuple(map(view_type, (vda, vdb, vdbias))), backward_attrs,
                          _device.compute_capability(va.device))
        kernel = _backward_kernel(problem, lambda name: _native_module().backward_unsupported_reason(
            name, *call, residual_after_act=after))
    _native_module().backward(*call, kernel, _device.stream_handle(stream), residual_after_act=after)
    return da, db, dbias, dc


# ---------------------------------------------------------------------------------------------------------------
# Op definition: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
def _infer(in_types, attrs):
    a, b, bias, c = in_types
    require_inputs(in_types, ("a", "b"))
    concrete = lambda t: t is None or t.is_concrete  # noqa: E731
    if all(concrete(t) for t in in_types):
        shape = check_operands(a.shape, a.dtype, b.shape, b.dtype, None if bias is None else bias.shape,
                               None if bias is None else bias.dtype, None if c is None else c.shape,
                               None if c is None else c.dtype, act=attrs["act"], trans_a=attrs["trans_a"],
                               trans_b=attrs["trans_b"], alpha=attrs["alpha"], beta=attrs["beta"],
                               slope=attrs["slope"])
        return [TensorType((shape.m, shape.n), shape.dtype)]
    # Symbolic dims: check ranks, dtypes and whichever dims are known.
    if a.rank != 2 or b.rank != 2:
        raise ValueError(f"a, b: expected 2-d inputs, got {a} and {b}")
    if a.dtype not in FLOAT_DTYPES or b.dtype != a.dtype:
        raise TypeError(f"a, b: expected matching float dtypes, got {a.dtype} and {b.dtype}")
    m, k = (a.shape[1], a.shape[0]) if attrs["trans_a"] else a.shape
    k_b, n = (b.shape[1], b.shape[0]) if attrs["trans_b"] else b.shape
    if isinstance(k, int) and isinstance(k_b, int) and k != k_b:
        raise ValueError(f"b: inner dimension mismatch: op(a) is {m}x{k} but op(b) is {k_b}x{n}")
    return [TensorType((m, n), a.dtype)]


def _reference(inputs, attrs):
    a, b, bias, c = inputs
    y, _ = reference(a, b, bias, c, act=attrs["act"], alpha=attrs["alpha"], beta=attrs["beta"],
                     trans_a=attrs["trans_a"], trans_b=attrs["trans_b"], slope=attrs["slope"],
                     residual_after_act=attrs["residual_after_act"])
    return [y]


def _reference_backward(inputs, outputs, out_grads, attrs):
    a, b, bias, c = inputs
    after = attrs["residual_after_act"]
    _, z = reference(a, b, bias, c, act=attrs["act"], alpha=attrs["alpha"], beta=attrs["beta"],
                     trans_a=attrs["trans_a"], trans_b=attrs["trans_b"], slope=attrs["slope"], residual_after_act=after)
    da, db, dbias, dc = reference_backward(out_grads[0], a, b, z, act=attrs["act"], alpha=attrs["alpha"],
                                           beta=attrs["beta"], trans_a=attrs["trans_a"], trans_b=attrs["trans_b"],
                                           slope=attrs["slope"], residual_after_act=after)
    return [da, db, None if bias is None else dbias, None if c is None else dc]


def _problem_args(problem: Problem):
    a, b, bias, c = problem.in_types
    m, n = problem.out_types[0].shape
    k = a.shape[0] if problem.attrs["trans_a"] else a.shape[1]
    return m, n, k, a.dtype, bias is not None, c is not None


def _make_candidate(name, capabilities=()):
    def supports(problem: Problem):
        m, n, k, dtype, has_bias, has_c = _problem_args(problem)
        attrs = problem.attrs
        reason = _native_module().unsupported_reason(name, m, n, k, dtype, attrs["act"], has_bias, has_c, False,
                                                     True, attrs["trans_a"], attrs["trans_b"],
                                                     attrs["residual_after_act"])
        return reason or None

    def prepare(problem: Problem):
        m, n, k, dtype, has_bias, has_c = _problem_args(problem)
        attrs = problem.attrs
        act, alpha, slope, tf32 = attrs["act"], float(attrs["alpha"]), float(attrs["slope"]), attrs["allow_tf32"]
        beta = float(attrs["beta"]) if has_c else 0.0
        # A C launch (inputs a, b, bias, c; output y): the arguments are converted once, here.
        return native_launch(_native_module().bind_forward(m, n, k, dtype, attrs["trans_a"], attrs["trans_b"], alpha,
                                                           beta, act, slope, tf32, name, attrs["residual_after_act"]))

    return table_candidate("_ops_gemm", name, supports, prepare, capabilities)


def _positive(value):
    return None if value >= 0 else "must be >= 0"


OP = register(OpDef(
    name="gemm",
    samples=lambda rng: [Sample((sample_array(rng, 4, 8), sample_array(rng, 8, 6), sample_array(rng, 6)),
                                {"alpha": 0.5}),
                         Sample((sample_array(rng, 5, 3), sample_array(rng, 7, 3), sample_array(rng, 7)),
                                {"trans_b": True, "act": "relu"}, "odd sizes, b transposed, relu epilogue"),
                         Sample(tuple(sample_array(rng, *shape, dtype="float16") for shape in ((4, 8), (8, 6), (6,))),
                                {"act": "relu"}, "float16")],
    flops=lambda in_types, out_types, attrs: 2.0 * out_types[0].numel * (
        in_types[0].shape[0] if attrs["trans_a"] else in_types[0].shape[1]),
    inputs=(Input("a"), Input("b"), Input("bias", optional=True), Input("c", optional=True)),
    outputs=("y",),
    attrs=(
        Attr("act", str, "none", choices=GEMM_ACTIVATIONS),
        Attr("alpha", float, 1.0),
        Attr("beta", float, 0.0),
        Attr("trans_a", bool, False),
        Attr("trans_b", bool, False),
        Attr("slope", float, 0.01, check=_positive, doc="leaky_relu negative slope"),
        Attr("allow_tf32", bool, False),
        Attr("residual_after_act", bool, False, doc="add beta * C after the activation, not before it"),
    ),
    infer=_infer,
    reference=_reference,
    reference_backward=_reference_backward,
    candidates=(
        _make_candidate("cublaslt_epilogue", capabilities=("fused_epilogue",)),  # GE2_FORCE_NO_EPILOGUE=1 turns it off
        _make_candidate("cublaslt_postkernel"),
        _make_candidate("cutlass_sm90"),
        _make_candidate("tiled"),
    ),
    doc=__doc__,
))
Face(OP, _backward, extras={"save_preact": False, "preact_out": None},
     forward_extras=_forward_with_preact,
     saved={"preact": None, "a_preact": None, "a_act": "none", "a_slope": 0.01, "dbias_a_out": None},
     backward_host_check=_check_backward_options)
globals().update(FACES["gemm"].functions())


# ---------------------------------------------------------------------------------------------------------------
# Grad rule: the activation's backward first (relu from y; gelu/silu from a recomputed pre-activation), then one
# ``gemm_backward`` giving dA, dB and dbias in one native call (dbias through cuBLASLt's BGRAD epilogue).
# ``a_act``/``a_preact`` chain the previous layer's activation into the dA matmul (the autograd's fusion pass sets
# them: DGELU/DRELU applied to dA, no separate activation-backward node).
# ---------------------------------------------------------------------------------------------------------------
from . import _grad  # noqa: E402  (the grad section stays separate from the face above)
from ._base import attach_grad  # noqa: E402


def _backward_dims(in_types, attrs):
    dy, a = in_types[0], in_types[1]
    m, n = dy.shape
    k = a.shape[0] if attrs["trans_a"] else a.shape[1]
    return m, n, k


def _infer_backward(in_types, attrs):
    dy, a, b, a_preact = in_types
    (y,) = _infer([a, b, None, None], {**attrs, "act": "none", "alpha": 1.0, "beta": 0.0, "slope": 0.01})
    if dy.dtype != a.dtype or (dy.is_concrete and y.is_concrete and tuple(dy.shape) != tuple(y.shape)):
        raise ValueError(f"dy: expected {y} (the gemm's output type), got {dy}")
    if attrs["a_act"] != "none" and (a_preact is None or a_preact.shape != a.shape or a_preact.dtype != a.dtype):
        raise ValueError(f"a_preact: expected {a} (the pre-activation that produced a) for a_act="
                         f"{attrs['a_act']!r}, got {a_preact}")
    return [a, b, TensorType((y.shape[1],), a.dtype)]


def _reference_gemm_backward(inputs, attrs):
    dy, a, b, a_preact = inputs
    da, db, dbias, _ = reference_backward(dy, a, b, alpha=attrs["alpha"], trans_a=attrs["trans_a"],
                                          trans_b=attrs["trans_b"])
    if attrs["a_act"] != "none":
        da = da * activations.derivative(attrs["a_act"], as_float64(a_preact), attrs["a_slope"])
    return [da, db, dbias]


# A stand-in address for the pointers of a plan's launch, which prepare does not know yet: plans align every buffer
# to 256 bytes (runtime/planner.py), and cuBLASLt's heuristic answers by alignment.
_PLAN_BUFFER_ADDRESS = 256


def _backward_candidate(name, capabilities=()):
    """gemm_backward's candidate of kernel ``name``; its prepare asks the native check (cuBLASLt's heuristic for
    each of the call's matmuls) and raises RuntimeError when the kernel cannot run it, so the next one prepares."""

    def prepare(problem: Problem):
        attrs = problem.attrs
        m, n, k = _backward_dims(problem.in_types, attrs)
        dtype = problem.in_types[1].dtype
        native = _native_module()
        want = (attrs["with_da"], attrs["with_db"], attrs["with_dbias"])
        args = (m, n, k, dtype, attrs["trans_a"], attrs["trans_b"], float(attrs["alpha"]), 0.0, "none", 0.01,
                attrs["allow_tf32"])
        chain = (attrs["a_act"], float(attrs["a_slope"]))
        stand_in = lambda present: _PLAN_BUFFER_ADDRESS if present else 0  # noqa: E731
        a_preact = problem.in_types[3] is not None
        reason = native.backward_unsupported_reason(
            name, *(stand_in(True),) * 3, 0, 0, *map(stand_in, want), 0, *args, stand_in(a_preact), *chain, 0)
        if reason:
            raise RuntimeError(f"gemm_backward: kernel '{name}' cannot run this problem: {reason}")
        da, db, dbias = (out_ptr(index) if wanted else 0 for index, wanted in enumerate(want))
        return native_launch(native.backward, in_ptr(0), in_ptr(1), in_ptr(2), 0, 0, da, db, dbias, 0, *args,
                             in_ptr(3), *chain, 0, name, stream_arg())

    return table_candidate("_ops_gemm", name, lambda problem: None, prepare, capabilities)


BACKWARD_OP = _grad.register_backward(OpDef(
    name="gemm_backward",
    flops=lambda in_types, out_types, attrs: 2.0 * in_types[0].numel * (  # da and db: 2 * m * n * k each
        (attrs["with_da"] + attrs["with_db"]) * (in_types[1].shape[0] if attrs["trans_a"] else in_types[1].shape[1])),
    inputs=(Input("dy"), Input("a"), Input("b"), Input("a_preact", optional=True)),
    outputs=("da", "db", "dbias"),
    attrs=(
        Attr("alpha", float, 1.0),
        Attr("trans_a", bool, False),
        Attr("trans_b", bool, False),
        Attr("allow_tf32", bool, False),
        Attr("a_act", str, "none", choices=GEMM_ACTIVATIONS, doc="activation that produced a from a_preact"),
        Attr("a_slope", float, 0.01, check=_positive),
        Attr("with_da", bool, True, doc="False: da is not computed (nothing reads it)"),
        Attr("with_db", bool, True, doc="False: db is not computed"),
        Attr("with_dbias", bool, True, doc="False: dbias is not computed"),
    ),
    infer=_infer_backward,
    reference=_reference_gemm_backward,
    candidates=(_backward_candidate("cublaslt_epilogue", capabilities=("fused_epilogue",)),
                _backward_candidate("cublaslt_postkernel"),
                _backward_candidate("tiled")),
    doc="gemm_backward(dy, a, b, a_preact?) -> (da, db, dbias) of y = alpha * op(a) @ op(b) + bias; dy is the "
        "gradient of the pre-activation. With a_act, da is w.r.t. a_preact (a = a_act(a_preact)).",
))


def _grad_gemm(g, node, dys):
    (dy,) = dys
    a, b, bias, c = node.inputs
    attrs = node.attrs
    act = attrs["act"]
    after = attrs["residual_after_act"] and c is not None  # y = act(z) + beta * c
    if act == "relu" and not after:
        dz = g.relu_backward(dy, node.outputs[0])  # relu'(z) == relu'(relu(z)): no pre-activation needed
    elif act in ("relu", "gelu", "silu"):  # the pre-activation, recomputed (without a residual added after act)
        z = g.gemm(a, b, bias, None if after else c,
                   **{**attrs, "act": "none", "beta": 0.0 if after else attrs["beta"]})
        dz = getattr(g, f"{act}_backward")(dy, z)
    elif act == "none":
        dz = dy
    else:
        raise ValueError(f"{node.where()}: act={act!r} has no grad rule; write the activation as its own node")
    da, db, dbias = g.gemm_backward(dz, a, b, alpha=attrs["alpha"], trans_a=attrs["trans_a"],
                                    trans_b=attrs["trans_b"], allow_tf32=attrs["allow_tf32"],
                                    with_dbias=bias is not None)
    dc = None
    if c is not None:
        dy_c = dy if after else dz  # the gradient where beta * C is added
        dc = dy_c if attrs["beta"] == 1.0 else g.mul(dy_c, _grad.constant(g, attrs["beta"], dy_c.type.dtype))
    return [da, db, dbias if bias is not None else None, dc]


attach_grad(OP, _grad_gemm)
