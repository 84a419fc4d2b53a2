"""Autograd over the IR (CPU backend): every op's grad rule against its float64 ``reference_backward`` and against
float64 finite differences of its reference, gradient accumulation, the training passes, and bad use."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import autograd
from graph_executor_v2.dtypes import to_numpy
from graph_executor_v2.ops import OPS
from graph_executor_v2.passes import TRAINING_BACKWARD, TRAINING_FORWARD, PassManager, resolve
from graph_executor_v2.testing import assert_close


def _away_from_zero(rng, shape, low=0.2):
    """Normal values pushed at least ``low`` away from 0 (kinks of relu, |x| at 0 stay out of the differences)."""
    x = rng.standard_normal(shape)
    return (np.sign(x) * (np.abs(x) + low)).astype(np.float32)


def _normal(rng, shape, scale=1.0):
    return np.asarray(rng.standard_normal(shape) * scale, dtype=np.float32)


# (id, op, inputs builder (rng -> list of arrays), attrs)
CASES = [
    ("add_broadcast", "add", lambda r: [_normal(r, (3, 5)), _normal(r, (5,))], {}),
    ("add_column", "add", lambda r: [_normal(r, (3, 1)), _normal(r, (2, 3, 5))], {}),
    ("sub_broadcast", "sub", lambda r: [_normal(r, (4, 1, 3)), _normal(r, (2, 3))], {}),
    ("mul_broadcast", "mul", lambda r: [_normal(r, (3, 5)), _normal(r, (1, 5))], {}),
    ("div_broadcast", "div", lambda r: [_normal(r, (3, 5)), _away_from_zero(r, (3, 1), 0.5)], {}),
    ("bias_add", "bias_add", lambda r: [_normal(r, (2, 3, 5)), _normal(r, (5,))], {}),
    *[(op, op, lambda r: [_away_from_zero(r, (3, 7))], {})
      for op in ("relu", "gelu", "gelu_erf", "silu", "sigmoid", "tanh", "exp", "neg")],
    *[(op, op, lambda r: [_away_from_zero(r, (3, 7))], {})
      for op in ("abs", "sign", "exp2", "expm1", "sin", "cos", "erf", "floor", "ceil", "round", "trunc", "softplus",
                 "mish", "leaky_relu", "elu")],
    *[(op, op, lambda r: [np.abs(_normal(r, (3, 7))) + np.float32(0.3)], {})
      for op in ("log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal")],
    ("softplus_beta", "softplus", lambda r: [_normal(r, (4, 5), 3.0)], {"beta": 2.0, "threshold": 3.0}),
    ("hardswish", "hardswish", lambda r: [_away_from_zero(r, (4, 5), 0.1) * np.float32(2.5)], {}),
    ("hardsigmoid_onnx", "hardsigmoid", lambda r: [_away_from_zero(r, (4, 5), 0.1) * np.float32(2.5)],
     {"alpha": 0.2, "beta": 0.5}),
    ("clip", "clip", lambda r: [np.round(_normal(r, (4, 6)) * 4) / 4 + np.float32(0.125)], {"min": -0.5, "max": 1.0}),
    ("clip_min_only", "clip", lambda r: [_away_from_zero(r, (4, 6))], {"min": 0.0}),
    ("pow_broadcast", "pow", lambda r: [np.abs(_normal(r, (3, 4))) + np.float32(0.5), _normal(r, (4,))], {}),
    ("mod_python", "mod", lambda r: [_away_from_zero(r, (3, 4)) * np.float32(0.3), np.abs(_normal(r, (3, 1)))
                                    + np.float32(1.5)], {}),
    ("mod_fmod", "mod", lambda r: [_away_from_zero(r, (3, 4)), -np.abs(_normal(r, (4,))) - np.float32(1.5)],
     {"fmod": True}),
    ("minimum", "minimum", lambda r: [_normal(r, (3, 4)), _normal(r, (2, 1, 4))], {}),
    ("maximum", "maximum", lambda r: [_normal(r, (3, 4)), _normal(r, (3, 1))], {}),
    ("where_broadcast", "where", lambda r: [r.standard_normal((3, 1)) > 0, _normal(r, (3, 4)), _normal(r, (4,))],
     {}),
    ("gemm_bias_relu", "gemm", lambda r: [_normal(r, (5, 4)), _normal(r, (4, 3)), _normal(r, (3,)), None],
     {"act": "relu"}),
    ("gemm_trans_gelu", "gemm", lambda r: [_normal(r, (4, 5)), _normal(r, (3, 4)), _normal(r, (3,)), None],
     {"act": "gelu", "trans_a": True, "trans_b": True}),
    ("gemm_residual_silu", "gemm", lambda r: [_normal(r, (5, 4)), _normal(r, (4, 3)), None, _normal(r, (5, 3))],
     {"act": "silu", "alpha": 0.7, "beta": 0.5}),
    ("gemm_residual_beta1", "gemm", lambda r: [_normal(r, (1, 4)), _normal(r, (4, 3)), None, _normal(r, (1, 3))],
     {"beta": 1.0}),
    ("gemm_residual_after_gelu", "gemm", lambda r: [_normal(r, (5, 4)), _normal(r, (4, 3)), _normal(r, (3,)),
                                                    _normal(r, (5, 3))],
     {"act": "gelu", "beta": 0.5, "residual_after_act": True}),
    ("gemm_residual_after_relu", "gemm", lambda r: [_normal(r, (5, 4)), _normal(r, (4, 3)), None,
                                                    _normal(r, (5, 3))],
     {"act": "relu", "beta": 1.0, "residual_after_act": True}),
    ("matmul", "matmul", lambda r: [_normal(r, (5, 7)), _normal(r, (7, 3))], {}),
    # batched: A's batch dim broadcast against B's, B missing A's leading dim (both summed back in the gradient)
    ("matmul_batched", "matmul", lambda r: [_normal(r, (2, 1, 3, 4)), _normal(r, (3, 4, 2))], {}),
    ("sum_axis", "sum", lambda r: [_normal(r, (3, 4, 5))], {"axis": (0, 2)}),
    ("sum_all", "sum", lambda r: [_normal(r, (3, 4))], {}),
    ("mean_keepdims", "mean", lambda r: [_normal(r, (3, 4, 5))], {"axis": 1, "keepdims": True}),
    ("max_last", "max", lambda r: [_normal(r, (4, 6))], {"axis": -1}),
    ("softmax_last", "softmax", lambda r: [_normal(r, (3, 6))], {"axis": -1}),
    ("softmax_first", "softmax", lambda r: [_normal(r, (4, 3))], {"axis": 0}),
    ("log_softmax", "log_softmax", lambda r: [_normal(r, (3, 6))], {"axis": 1}),
    ("transpose", "transpose", lambda r: [_normal(r, (2, 3, 4))], {"perm": (2, 0, 1)}),
    ("reshape", "reshape", lambda r: [_normal(r, (3, 4))], {"shape": (2, -1)}),
    ("slice_steps", "slice", lambda r: [_normal(r, (5, 6))], {"starts": (1, 5), "ends": (4, 0), "axes": (0, 1),
                                                             "steps": (1, -2)}),
    ("layernorm", "layernorm", lambda r: [_normal(r, (3, 8)), _normal(r, (8,)), _normal(r, (8,))], {}),
    ("rmsnorm", "rmsnorm", lambda r: [_normal(r, (3, 8)), _normal(r, (8,))], {}),
    ("cross_entropy_mean_ignore", "cross_entropy",
     lambda r: [_normal(r, (5, 4)), np.array([0, 3, -100, 1, 2], np.int64)], {"ignore_index": -100}),
    ("cross_entropy_sum", "cross_entropy", lambda r: [_normal(r, (3, 5)), np.array([4, 0, 2], np.int32)],
     {"reduction": "sum"}),
    ("cross_entropy_none", "cross_entropy", lambda r: [_normal(r, (3, 5)), np.array([4, 0, 2], np.int64)],
     {"reduction": "none"}),
    ("dropout", "dropout", lambda r: [_normal(r, (4, 9))], {"p": 0.3, "seed": 7}),
    ("embedding", "embedding", lambda r: [_normal(r, (6, 4)), np.array([[0, 5, 5], [2, 0, 1]], np.int64)], {}),
    ("cast_to_bfloat16", "cast", lambda r: [_normal(r, (3, 4))], {"dtype": "bfloat16"}),
    ("concat", "concat", lambda r: [_normal(r, (2, 3)), _normal(r, (2, 1)), _normal(r, (2, 4))], {"axis": 1}),
    ("max_pool2d", "max_pool2d", lambda r: [_normal(r, (2, 3, 5, 6))], {"kernel_size": 3, "stride": 2, "padding": 1,
                                                                       "ceil_mode": True}),
    ("avg_pool2d_nhwc", "avg_pool2d", lambda r: [_normal(r, (2, 5, 6, 3))],
     {"kernel_size": 2, "padding": 1, "count_include_pad": False, "layout": "NHWC"}),
    ("global_avg_pool", "global_avg_pool", lambda r: [_normal(r, (2, 3, 4, 5))], {}),
    ("batch_norm_training", "batch_norm", lambda r: [_normal(r, (4, 3, 2, 2)), _normal(r, (3,)), _normal(r, (3,)),
                                                     _normal(r, (3,)), np.abs(_normal(r, (3,))) + 0.5],
     {"training": True}),
    ("batch_norm_inference_nhwc", "batch_norm", lambda r: [_normal(r, (2, 3, 4)), _normal(r, (4,)), _normal(r, (4,)),
                                                           _normal(r, (4,)), np.abs(_normal(r, (4,))) + 0.5],
     {"layout": "NHWC"}),
    ("conv2d_stride2_bias", "conv2d", lambda r: [_normal(r, (2, 3, 7, 6)), _normal(r, (4, 3, 3, 3)), _normal(r, (4,))],
     {"stride": 2, "padding": 1}),
    ("conv2d_residual_gelu", "conv2d", lambda r: [_normal(r, (2, 3, 6, 5)), _normal(r, (4, 3, 3, 3)), _normal(r, (4,)),
                                                  _normal(r, (2, 4, 6, 5))], {"padding": 1, "act": "gelu"}),
    ("conv2d_residual_sigmoid", "conv2d", lambda r: [_normal(r, (1, 3, 5, 4)), _normal(r, (2, 3, 3, 3)), _normal(r, (2,)),
                                                     _normal(r, (1, 2, 5, 4))], {"padding": 1, "act": "sigmoid"}),
    ("conv2d_residual_clip", "conv2d", lambda r: [_normal(r, (1, 2, 5, 4)), _normal(r, (3, 2, 3, 3)), _normal(r, (3,)),
                                                  _normal(r, (1, 3, 5, 4))],
     {"padding": 1, "act": "leaky_relu", "slope": 0.2, "clip_min": -0.3, "clip_max": 1.5}),
    ("conv2d_residual_nhwc", "conv2d", lambda r: [_normal(r, (1, 5, 4, 3)), _normal(r, (2, 3, 3, 3)), None,
                                                  _normal(r, (1, 2, 1, 2))], {"stride": 2, "layout": "NHWC"}),
    ("conv2d_depthwise_nhwc", "conv2d", lambda r: [_normal(r, (1, 5, 5, 4)), _normal(r, (4, 3, 3, 1)), None],
     {"padding": 1, "groups": 4, "layout": "NHWC"}),
    ("attention_causal_gqa", "attention", lambda r: [_normal(r, (1, 4, 5, 8)), _normal(r, (1, 2, 6, 8)),
                                                     _normal(r, (1, 2, 6, 8))], {"causal": True}),
    ("expand", "expand", lambda r: [_normal(r, (3, 1, 4))], {"shape": (2, 3, 5, 4)}),
    ("pad_constant_crop", "pad", lambda r: [_normal(r, (3, 4))], {"pads": (1, -1, 2, 1), "value": 0.5}),
    ("pad_reflect", "pad", lambda r: [_normal(r, (3, 5))], {"pads": (2, 1, 1, 4), "mode": "reflect"}),
    ("pad_wrap", "pad", lambda r: [_normal(r, (3, 4))], {"pads": (2, 1, 3, 4), "mode": "wrap"}),
    ("pad_edge", "pad", lambda r: [_normal(r, (2, 3, 4))], {"pads": (0, 2, 3, 1, 0, 2), "mode": "edge"}),
    ("roll", "roll", lambda r: [_normal(r, (3, 5))], {"shifts": (2, -1), "axes": (1, 0)}),
    ("repeat_interleave", "repeat_interleave", lambda r: [_normal(r, (2, 3, 2))], {"repeats": 3, "axis": 1}),
    ("tile", "tile", lambda r: [_normal(r, (2, 3))], {"repeats": (2, 3)}),
    ("cumsum_reverse_exclusive", "cumsum", lambda r: [_normal(r, (3, 5))],
     {"axis": 1, "exclusive": True, "reverse": True}),
    ("trilu_lower", "trilu", lambda r: [_normal(r, (2, 4, 5))], {"k": -1, "upper": False}),
    ("attention_bshd", "attention", lambda r: [_normal(r, (2, 3, 2, 4)), _normal(r, (2, 4, 2, 4)),
                                               _normal(r, (2, 4, 2, 4))], {"layout": "bshd"}),
]


def _sample_case(op):
    """A case for a differentiable op from its own first sample (OpDef.samples), so a new op needs no entry here."""
    opdef = OPS[op]
    attrs = dict(opdef.sample_inputs(np.random.default_rng(0))[0].attrs)  # attributes are fixed; values are drawn

    def build(rng):
        inputs = list(opdef.sample_inputs(rng)[0].inputs)
        return list(inputs[0]) if opdef.inputs[0].variadic else inputs + [None] * (len(opdef.inputs) - len(inputs))

    return (f"{op}_sample", op, build, attrs)


# Differentiable ops that no hand-written case covers get one from their samples.
CASES += [_sample_case(name) for name in sorted(name for name, opdef in OPS.items()
                                                 if opdef.reference_backward is not None
                                                 and name not in {case[1] for case in CASES})]


def _op_graph(op, arrays, attrs, projection=None):
    """loss = sum(op(inputs) * projection): a scalar whose gradient w.r.t. op's output is ``projection``."""
    g = ge2.ir.Graph(op)
    values = [None if a is None else g.input(f"in{i}", a.shape, a.dtype.name) for i, a in enumerate(arrays)]
    y = getattr(g, op)(*values, **attrs)
    y = y[0] if isinstance(y, tuple) else y  # several outputs (max_pool2d, batch_norm): the gradient of the first
    if projection is None:
        return y.type
    g.output(g.sum(g.mul(y, g.param("projection", projection))), "loss")
    return g


def _reference_grads(op, arrays, attrs, projection):
    opdef = OPS[op]
    full = opdef.validate_attrs(attrs, op)
    inputs64 = [None if a is None else (a.astype(np.float64) if a.dtype.kind == "f" else a) for a in arrays]
    outputs = opdef.reference(inputs64, full)
    return opdef.reference_backward(inputs64, outputs, [projection.astype(np.float64)], full), inputs64, full


def _finite_differences(op, inputs64, attrs, projection, index, step=1e-6):
    opdef = OPS[op]
    x = inputs64[index]
    grad = np.zeros_like(x)
    for flat in range(x.size):
        values = []
        for sign in (1.0, -1.0):
            shifted = x.copy()
            shifted.reshape(-1)[flat] += sign * step
            trial = list(inputs64)
            trial[index] = shifted
            values.append(float((np.asarray(opdef.reference(trial, attrs)[0]) * projection).sum()))
        grad.reshape(-1)[flat] = (values[0] - values[1]) / (2 * step)
    return grad


def _case_backward_graph(rng, case):
    """(arrays, projection, backward graph w.r.t. the float inputs, their names, feeds) of one CASES entry."""
    _, op, build, attrs = case
    arrays = build(rng)
    out_type = _op_graph(op, arrays, attrs)
    projection = _normal(rng, out_type.shape).astype(to_numpy(out_type.dtype))
    float_inputs = [f"in{i}" for i, a in enumerate(arrays) if a is not None and a.dtype.kind == "f"]
    if op == "batch_norm":
        float_inputs = float_inputs[:3]  # running statistics: buffers, no gradient
    bg = autograd.backward_graph(_op_graph(op, arrays, attrs, projection), "loss", wrt=float_inputs)
    feeds = {f"in{i}": a for i, a in enumerate(arrays) if a is not None}
    return arrays, projection, bg, float_inputs, feeds


@pytest.mark.parametrize("case", CASES, ids=lambda case: case[0])
def test_grad_rule_matches_reference_backward_and_finite_differences(rng, case):
    _, op, _, attrs = case
    arrays, projection, bg, float_inputs, feeds = _case_backward_graph(rng, case)
    results = ge2.ExecutorV2(bg, passes=TRAINING_BACKWARD).run(feeds)

    expected, inputs64, full = _reference_grads(op, arrays, attrs, projection)
    for index, array in enumerate(arrays):
        name = f"in{index}"
        if name not in float_inputs:
            assert expected[index] is None, f"{op}: input {index} (absent or integer) has a reference gradient"
            continue
        got = results[autograd.grad_name(name)]
        reduction = max(array.shape) if op in ("gemm", "matmul", "sum", "mean") else 8
        assert_close(got, expected[index], "float32", reduction, what=f"{op} d{name} vs reference_backward")
        if op == "cast":
            continue  # rounding is piecewise constant: its gradient is the identity by definition, not a limit
        numeric = _finite_differences(op, inputs64, full, projection.astype(np.float64), index)
        np.testing.assert_allclose(expected[index], numeric, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{op}: reference_backward d{name} vs float64 finite differences")
        assert_close(got, numeric, "float32", reduction, what=f"{op} d{name} vs finite differences")


def test_every_differentiable_op_has_a_grad_rule_and_a_case():
    forward_ops = {name for name, opdef in OPS.items() if opdef.reference_backward is not None}
    covered = {case[1] for case in CASES}  # a hand-written case, else one from the op's samples
    assert forward_ops <= covered, f"ops with no grad-rule test: {sorted(forward_ops - covered)}"
    assert all(OPS[name].grad is not None for name in forward_ops)


def test_value_used_several_times_sums_its_gradients(rng):
    x = _normal(rng, (3, 4))
    g = ge2.ir.Graph("reuse")
    xv = g.input("x", x.shape, "float32")
    g.output(g.sum(g.add(g.mul(xv, xv), g.exp(xv))), "loss")
    grads = ge2.ExecutorV2(autograd.backward_graph(g, "loss", ["x"]), passes=[]).run({"x": x})
    x64 = x.astype(np.float64)
    assert_close(grads["grad/x"], 2 * x64 + np.exp(x64), "float32", what="d(x*x + exp(x))/dx")


def test_integer_inputs_get_no_gradient(rng):
    g = ge2.ir.Graph("ce")
    logits = g.input("logits", (4, 3), "float32")
    labels = g.input("labels", (4,), "int64")
    g.output(g.cross_entropy(logits, labels), "loss")
    bg = autograd.backward_graph(g, "loss", ["logits"])
    assert set(bg.outputs) == {"loss", "grad/logits"}
    with pytest.raises(TypeError, match="wrt: 'labels' has dtype int64"):
        autograd.backward_graph(g, "loss", ["labels"])


def _mlp(rng, activation):
    g = ge2.ir.Graph("mlp")
    x = g.input("x", ("B", 6), "float32")
    labels = g.input("labels", ("B",), "int64")
    h = x
    for index, (fan_in, fan_out) in enumerate(((6, 16), (16, 16), (16, 5))):
        z = g.add(g.matmul(h, g.param(f"w{index}", _normal(rng, (fan_in, fan_out), fan_in ** -0.5))),
                  g.param(f"b{index}", _normal(rng, (fan_out,), 0.1)))
        h = z if index == 2 else getattr(g, activation)(z)
    g.output(g.cross_entropy(h, labels), "loss")
    return g


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_training_passes_fuse_and_keep_the_numbers(rng, activation):
    g = _mlp(rng, activation)
    feeds = {"x": _normal(rng, (7, 6)), "labels": rng.integers(0, 5, 7).astype(np.int64)}
    plain = ge2.ExecutorV2(autograd.backward_graph(g, "loss"), passes=[]).run(feeds)
    forward, _ = PassManager(resolve(TRAINING_FORWARD)).run(g)
    fused, records = PassManager(resolve(TRAINING_BACKWARD)).run(autograd.backward_graph(forward, "loss"))
    counts = fused.op_counts()
    assert counts["gemm_backward"] == 3 and f"{activation}_backward" not in counts, counts
    assert sum(n.attrs["a_act"] == activation for n in fused.nodes if n.op == "gemm_backward") == 2
    assert sum(not n.attrs["with_da"] for n in fused.nodes if n.op == "gemm_backward") == 1  # the first layer's dA
    assert counts.get("gemm", 0) == 3 and ("relu" not in counts)  # relu fused into the gemm epilogue
    assert counts["cross_entropy_with_grad"] == 1 and "cross_entropy_backward" not in counts
    assert not any(n.attrs["float32_loss"] for n in fused.nodes if n.op == "cross_entropy_with_grad")  # float32 in
    optimized = ge2.ExecutorV2(fused, passes=[]).run(feeds)
    for name, value in plain.items():
        assert_close(optimized[name], value.astype(np.float64), "float32", 16, what=name)


def _classifier(rng, classes, trans_b, with_bias, logits_output=False):
    """A linear classifier (width 12) over ``classes`` classes with its mean cross-entropy: the GPT head's shape."""
    g = ge2.ir.Graph("classifier")
    x = g.input("x", (9, 12), "float32")
    labels = g.input("labels", (9,), "int64")
    w = g.param("w", _normal(rng, (classes, 12) if trans_b else (12, classes), 0.3))
    bias = g.param("b", _normal(rng, (classes,), 0.3)) if with_bias else None
    logits = g.gemm(x, w, bias, trans_b=trans_b)
    g.output(g.cross_entropy(logits, labels), "loss")
    if logits_output:
        g.output(logits, "logits")
    return g


@pytest.mark.parametrize("trans_b", [True, False])
@pytest.mark.parametrize("with_bias", [False, True])
def test_pad_classes_keeps_the_loss_and_gradients(rng, trans_b, with_bias):
    """1031 classes (not a multiple of 8) become 1088 with zero weights and a -inf bias on the 57 added: the loss
    and the gradients of x, w (and the bias) are those of the unpadded graph."""
    g = _classifier(rng, 1031, trans_b, with_bias)
    feeds = {"x": _normal(rng, (9, 12)), "labels": rng.integers(0, 1031, 9).astype(np.int64)}
    wrt = ["x", "w"] + (["b"] if with_bias else [])
    plain = ge2.ExecutorV2(autograd.backward_graph(g, "loss", wrt), passes=[]).run(feeds)
    padded, records = PassManager(resolve(["pad_classes"])).run(g)
    (gemm,) = [n for n in padded.nodes if n.op == "gemm"]
    assert gemm.outputs[0].type.shape == (9, 1088), gemm.outputs[0].type
    assert any("1031 classes computed as 1088" in note for record in records for note in record.notes)
    result = ge2.ExecutorV2(autograd.backward_graph(padded, "loss", wrt), passes=[]).run(feeds)
    assert set(result) == set(plain)
    for name, value in plain.items():
        assert result[name].shape == value.shape, name
        assert_close(result[name], value.astype(np.float64), "float32", 1031, what=name)


@pytest.mark.parametrize("classes, logits_output", [(1031, True), (1032, False), (999, False)])
def test_pad_classes_leaves_aligned_small_or_read_logits(rng, classes, logits_output):
    """No padding where the logits are also an output (their shape is the graph's), where the class count is a
    multiple of 8 already, or below 1024 classes (the added columns' share of a small GEMM)."""
    g = _classifier(rng, classes, True, False, logits_output)
    padded, _ = PassManager(resolve(["pad_classes"])).run(g)
    assert [n.outputs[0].type.shape for n in padded.nodes if n.op == "gemm"] == [(9, classes)]
    assert "pad" not in padded.op_counts()


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_loss_gradient_of_cast_logits_reads_the_16_bit_logits(rng, low):
    """Mixed precision's cross_entropy(cast(logits16 -> float32)), whose gradient is cast back to 16 bits, fuses
    into one cross_entropy_with_grad on the 16-bit logits with a float32 loss: no cast of the logits either way, and
    the numbers of the unfused graph."""
    g = ge2.ir.Graph("cast_logits")
    x = g.input("x", (6, 4), "float32")
    labels = g.input("labels", (6,), "int64")
    w = g.param("w", _normal(rng, (4, 9), 0.5))
    logits = g.matmul(g.cast(x, dtype=low), g.cast(w, dtype=low))
    g.output(g.cross_entropy(g.cast(logits, dtype="float32"), labels), "loss")
    feeds = {"x": _normal(rng, (6, 4)), "labels": rng.integers(0, 9, 6).astype(np.int64)}
    plain = ge2.ExecutorV2(autograd.backward_graph(g, "loss"), passes=[]).run(feeds)
    fused, records = PassManager(resolve(TRAINING_BACKWARD)).run(autograd.backward_graph(g, "loss"))
    (node,) = [n for n in fused.nodes if n.op == "cross_entropy_with_grad"]
    assert node.attrs["float32_loss"]
    assert node.inputs[0].type.dtype == low and node.outputs[1].type.dtype == low
    assert not any(n.op == "cast" and node.inputs[0] in n.inputs for n in fused.nodes), fused.op_counts()
    assert fused.outputs["loss"].type.dtype == "float32"
    assert any("float32 loss" in note for record in records for note in record.notes)
    optimized = ge2.ExecutorV2(fused, passes=[]).run(feeds)
    assert optimized["loss"].dtype == np.float32
    for name, value in plain.items():
        assert_close(optimized[name], value.astype(np.float64), low, what=name)


def test_bad_use_raises_naming_the_problem(rng):
    g = ge2.ir.Graph("bad")
    x = g.input("x", (3, 4), "float32")
    w = g.param("w", _normal(rng, (4, 2)))
    g.param("unused", _normal(rng, (2,)))
    y = g.matmul(x, w)
    g.output(y, "y")
    g.output(g.sum(y), "loss")
    with pytest.raises(ValueError, match="loss: expected a scalar"):
        autograd.backward_graph(g, "y")
    with pytest.raises(ValueError, match="loss: expected the name of a graph output"):
        autograd.backward_graph(g, "nope")
    with pytest.raises(ValueError, match="wrt: unknown parameter or input 'v'"):
        autograd.backward_graph(g, "loss", ["v"])
    with pytest.raises(ValueError, match="wrt: 'unused' does not influence the loss"):
        autograd.backward_graph(g, "loss", ["w", "unused"])
    reserved = ge2.ir.Graph("reserved")
    seed_input = reserved.input(autograd.SEED, (3,), "float32")
    reserved.output(reserved.sum(seed_input), "loss")
    with pytest.raises(ValueError, match="is reserved for the loss gradient"):
        autograd.backward_graph(reserved, "loss", [autograd.SEED])
    h = ge2.ir.Graph("no_rule")
    dy = h.input("dy", (3,), "float32")
    xv = h.input("x", (3,), "float32")
    h.output(h.sum(h.relu_backward(dy, xv)), "loss")
    with pytest.raises(ValueError, match="has no grad rule"):
        autograd.backward_graph(h, "loss", ["x"])


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda case: case[0])
def test_backward_graph_on_the_gpu_matches_the_cpu_backend(rng, case):
    op = case[1]
    arrays, projection, bg, wrt, feeds = _case_backward_graph(rng, case)
    executor = ge2.ExecutorV2(bg, device="cuda", passes=TRAINING_BACKWARD, precision="highest")
    assert not executor.fallbacks, [f"{s.node} ({s.op}): {s.kernel}" for s in executor.fallbacks]
    on_gpu = executor.run(feeds)
    on_cpu = ge2.ExecutorV2(bg, passes=TRAINING_BACKWARD).run(feeds)
    for name in wrt:
        reduction = max(max(a.shape) for a in arrays if a is not None)
        assert_close(on_gpu[autograd.grad_name(name)], on_cpu[autograd.grad_name(name)].astype(np.float64),
                     projection.dtype.name if op == "cast" else "float32", reduction,
                     what=f"{op} grad {name} on the GPU")


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("amp", [None, "bfloat16", "float16"])
def test_fused_training_graph_on_the_gpu_matches_the_cpu_backend(rng, activation, amp):
    from graph_executor_v2.passes import autocast

    forward, _ = PassManager(resolve(TRAINING_FORWARD)).run(_mlp(rng, activation))
    if amp is not None:
        autocast(forward, amp)
    fused, _ = PassManager(resolve(TRAINING_BACKWARD)).run(autograd.backward_graph(forward, "loss"))
    feeds = {"x": _normal(rng, (33, 6)), "labels": rng.integers(0, 5, 33).astype(np.int64)}
    executor = ge2.ExecutorV2(fused, device="cuda", passes=[], precision="highest")
    assert not executor.fallbacks, [f"{s.node} ({s.op}): {s.kernel}" for s in executor.fallbacks]
    on_gpu, on_cpu = executor.run(feeds), ge2.ExecutorV2(fused, passes=[]).run(feeds)
    for name, value in on_cpu.items():
        # The float32 loss too is a function of amp-rounded logits: one logit rounded the other way (the two backends
        # accumulate in different orders) moves it by a 16-bit ulp's share (seen: 2.2e-4 relative with bfloat16).
        dtype = "float32" if amp is None else amp
        assert_close(on_gpu[name], value.astype(np.float64), dtype, 16, what=f"{name} ({activation}, amp={amp})")
