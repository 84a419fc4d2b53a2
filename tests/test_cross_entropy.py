"""cross_entropy: closed-form references, finite differences and validation (CPU); every kernel x dtype x reduction
against the float64 reference on the GPU, the fused forward+backward, ignore_index, large logits, bad labels on
the device, determinism, edge shapes, plan-style launches and torch interop."""
from __future__ import annotations

import math

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2 import _native
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, Problem
from graph_executor_v2.ops import cross_entropy as ce
from graph_executor_v2.testing import assert_close, random_array

DTYPES = ("float32", "float16", "bfloat16")
REDUCTIONS = ("none", "sum", "mean")
native_built = pytest.mark.skipif(not _native.is_built("_ops_cross_entropy"),
                                  reason="_ops_cross_entropy not built")


def make_problem(rng, rows, cols, dtype, label_dtype="int64", ignore_index=-100, ignore_fraction=0.25, scale=3.0):
    logits = random_array(rng, (rows, cols), dtype, scale)
    labels = rng.integers(0, cols, rows).astype(label_dtype)
    labels[rng.random(rows) < ignore_fraction] = ignore_index
    return logits, labels


def upstream(rng, rows, reduction, dtype):
    return np.asarray(random_array(rng, ce.loss_shape(rows, reduction), dtype))  # 0-d arrays stay arrays


def finite_difference(f, x, step=1e-6):
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[index] += step
        minus[index] -= step
        grad[index] = (f(plus) - f(minus)) / (2 * step)
    return grad


# ---------------------------------------------------------------------------------------------------------------
# CPU: references, inference, validation
# ---------------------------------------------------------------------------------------------------------------
def test_reference_closed_form():
    logits = np.array([[0.0, 0.0], [1.0, 2.0], [3.0, -1.0]])
    labels = np.array([0, 1, -100])
    rows = [math.log(2.0), math.log(math.e + math.e**2) - 2.0, 0.0]
    assert np.allclose(ce.reference(logits, labels, "none"), rows, rtol=1e-15)
    assert np.allclose(ce.reference(logits, labels, "sum"), sum(rows), rtol=1e-15)
    assert np.allclose(ce.reference(logits, labels, "mean"), sum(rows) / 2, rtol=1e-15)
    assert ce.reference(logits, labels, "mean").shape == ()
    # a custom ignore_index inside [0, classes) ignores that class
    assert np.allclose(ce.reference(logits, np.array([0, 1, 1]), "none", ignore_index=1), [math.log(2.0), 0.0, 0.0])


def test_reference_large_logits_are_stable():
    logits = np.array([[1e4, 0.0, -1e4], [1e4, 1e4, 1e4]])
    loss = ce.reference(logits, np.array([1, 2]), "none")
    assert np.allclose(loss, [1e4, math.log(3.0)], rtol=1e-12)
    grad = ce.reference_backward(np.ones(2), logits, np.array([1, 2]), "none")
    assert np.allclose(grad, [[1.0, -1.0, 0.0], [1 / 3, 1 / 3, -2 / 3]], atol=1e-12)


def test_reference_mean_of_all_ignored_is_nan_with_zero_gradient():
    logits = np.ones((3, 4))
    labels = np.full(3, -100)
    assert math.isnan(float(ce.reference(logits, labels, "mean")))
    assert float(ce.reference(logits, labels, "sum")) == 0.0
    assert not ce.reference_backward(np.array(1.0), logits, labels, "mean").any()


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_reference_backward_matches_finite_differences(rng, reduction):
    logits = rng.standard_normal((5, 7)) * 2
    labels = np.array([3, -100, 0, 6, 2])
    dloss = rng.standard_normal(ce.loss_shape(5, reduction))
    grad = ce.reference_backward(dloss, logits, labels, reduction)
    numeric = finite_difference(lambda x: float(np.sum(ce.reference(x, labels, reduction) * dloss)), logits)
    np.testing.assert_allclose(grad, numeric, atol=1e-7, rtol=1e-6)
    assert not grad[1].any()  # the ignored row


def test_reference_gradient_rows_sum_to_zero(rng):
    logits = rng.standard_normal((6, 9))
    grad = ce.reference_backward(np.ones(6), logits, rng.integers(0, 9, 6), "none")
    np.testing.assert_allclose(grad.sum(axis=1), 0.0, atol=1e-12)


def test_registered_opdef():
    op = OPS["cross_entropy"]
    assert [i.name for i in op.inputs] == ["logits", "labels"]
    assert [a.name for a in op.attrs] == ["reduction", "ignore_index"]
    assert [c.name for c in op.candidates] == ["warp_row", "block_row", "streaming"]
    assert [c.always_works for c in selection.candidates(op)] == [False, False, True]
    assert op.attr_map["reduction"].default == "mean" and op.attr_map["ignore_index"].default == -100


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_infer(reduction):
    op = OPS["cross_entropy"]
    attrs = op.validate_attrs({"reduction": reduction}, "node")
    (out,) = op.infer([TensorType((8, 10), "bfloat16"), TensorType((8,), "int32")], attrs)
    assert out == TensorType((8,) if reduction == "none" else (), "bfloat16")
    (out,) = op.infer([TensorType(("batch", 10), "float16"), TensorType(("batch",), "int64")], attrs)
    assert out == TensorType(("batch",) if reduction == "none" else (), "float16")


def test_infer_errors():
    op = OPS["cross_entropy"]
    attrs = op.validate_attrs({}, "node")
    with pytest.raises(ValueError, match=r"logits: expected a 2-d array"):
        op.infer([TensorType((8,), "float32"), TensorType((8,), "int64")], attrs)
    with pytest.raises(TypeError, match="logits: expected dtype float32, float16 or bfloat16, got int32"):
        op.infer([TensorType((8, 3), "int32"), TensorType((8,), "int64")], attrs)
    with pytest.raises(TypeError, match="labels: expected dtype int32 or int64, got float32"):
        op.infer([TensorType((8, 3), "float32"), TensorType((8,), "float32")], attrs)
    with pytest.raises(ValueError, match=r"labels: expected shape \(8,\)"):
        op.infer([TensorType((8, 3), "float32"), TensorType((9,), "int64")], attrs)
    with pytest.raises(ValueError, match="labels: expected a 1-d array"):
        op.infer([TensorType((8, 3), "float32"), TensorType((8, 1), "int64")], attrs)
    with pytest.raises(ValueError, match="logits: expected at least one class"):
        op.infer([TensorType((8, 0), "float32"), TensorType((8,), "int64")], attrs)
    with pytest.raises(ValueError, match="attribute 'reduction' expected one of none, sum, mean"):
        op.validate_attrs({"reduction": "avg"}, "node")
    with pytest.raises(TypeError, match="attribute 'ignore_index' expected int"):
        op.validate_attrs({"ignore_index": 1.5}, "node")


def test_run_reference_casts_to_the_logits_dtype(rng):
    logits, labels = make_problem(rng, 6, 5, "float16")
    (loss,) = OPS["cross_entropy"].run_reference([logits, labels], {"reduction": "mean", "ignore_index": -100})
    assert loss.dtype == np.float16 and loss.shape == ()
    assert_close(loss, ce.reference(logits, labels), "float16")


def test_executor_cpu_backend(rng):
    g = ge2.ir.Graph("loss")
    x = g.input("logits", ("batch", 11), "float32")
    y = g.input("labels", ("batch",), "int64")
    g.output(g.cross_entropy(x, y, reduction="sum", ignore_index=2), "loss")
    logits, labels = make_problem(rng, 9, 11, "float32", ignore_index=2)
    out = ge2.ExecutorV2(g, device="cpu").run({"logits": logits, "labels": labels})
    assert out["loss"].shape == () and out["loss"].dtype == np.float32
    assert_close(out["loss"], ce.reference(logits, labels, "sum", 2), "float32", 11)


def test_validation_errors_name_the_argument(rng):
    logits, labels = make_problem(rng, 4, 5, "float32")
    calls = [
        (lambda: ce.forward_numpy(logits[0], labels), ValueError, "logits: expected a 2-d array"),
        (lambda: ce.forward_numpy(logits.astype(np.int32), labels), TypeError, "logits: expected dtype"),
        (lambda: ce.forward_numpy(logits.astype(np.float64), labels), TypeError, "logits: expected .*got 'float64'"),
        (lambda: ce.forward_numpy(logits, labels.astype(np.float32)), TypeError,
         "labels: expected dtype int32 or int64, got float32"),
        (lambda: ce.forward_numpy(logits, labels.astype(np.uint8)), TypeError, "labels: expected dtype int32"),
        (lambda: ce.forward_numpy(logits, labels[:3]), ValueError, r"labels: expected shape \(4,\)"),
        (lambda: ce.forward_numpy(logits[:, :0], labels), ValueError, "logits: expected at least one class"),
        (lambda: ce.forward_numpy(logits, labels, reduction="avg"), ValueError,
         "'reduction' expected one of none, sum, mean, got 'avg'"),
        (lambda: ce.forward_numpy(logits, labels, ignore_index=-1.0), TypeError,
         "attribute 'ignore_index' expected int, got float"),
        (lambda: ce.forward_numpy(logits, labels, ignore_index=True), TypeError,
         "attribute 'ignore_index' expected int, got bool"),
        (lambda: ce.forward_numpy(logits, labels, kernel="fast"), ValueError, "kernel: expected one of auto"),
        (lambda: ce.forward_numpy(logits.tolist(), labels), TypeError, "logits: expected a NumPy array"),
        (lambda: ce.forward_numpy(logits, np.array([0, 1, 5, 2])), ValueError,
         r"labels: label 5 at row 2 is outside \[0, 5\) and is not ignore_index \(-100\)"),
        (lambda: ce.forward_numpy(logits, np.array([0, -1, 2, 2])), ValueError, "labels: label -1 at row 1"),
        (lambda: ce.forward_backward_numpy(logits, np.array([0, 1, 2, 7])), ValueError, "labels: label 7 at row 3"),
        (lambda: ce.backward_numpy(np.ones(4, np.float32), logits, labels, "mean"), ValueError,
         r"dy: expected shape \(\) \(the output's\), got \(4,\)"),
        (lambda: ce.backward_numpy(np.ones((), np.float32), logits, labels, "none"), ValueError,
         r"dy: expected shape \(4,\)"),
        (lambda: ce.backward_numpy(np.ones((), np.float16), logits, labels), TypeError,
         "dy: expected dtype float32 .the output's., got float16"),
        (lambda: ce.backward_numpy(1.0, logits, labels), TypeError, "dy: expected a NumPy array"),
        (lambda: ce.backward_numpy(np.ones((), np.float32), logits, np.array([0, 1, 2, 7])), ValueError,
         "labels: label 7 at row 3"),
        (lambda: ce.reference(logits, np.array([0, 1, 2, 9])), ValueError, "labels: label 9 at row 3"),
    ]
    for call, error, message in calls:
        with pytest.raises(error, match=message):
            call()


def test_host_label_check_accepts_ignore_index_anywhere():
    ce.check_labels(np.array([0, 99, 4, 99]), 5, ignore_index=99)
    ce.check_labels(np.array([0, 3, 4]), 5, ignore_index=3)
    ce.check_labels(np.array([], dtype=np.int64), 5)
    with pytest.raises(ValueError, match="labels: label -100 at row 1"):
        ce.check_labels(np.array([0, -100]), 5, ignore_index=99)


@native_built
def test_native_reasons_and_table():
    native = _native.load("_ops_cross_entropy")
    assert [k["name"] for k in native.kernels()] == ["warp_row", "block_row", "streaming"]
    assert native.unsupported_reason("warp_row", 1024, "float16", True) == ""
    assert "exceed" in native.unsupported_reason("warp_row", 1025, "float16", True)
    assert native.unsupported_reason("warp_row", 128, "float16", False) == ""
    assert "unvectorized" in native.unsupported_reason("warp_row", 129, "float16", False)
    assert native.unsupported_reason("block_row", 65536, "bfloat16", True) == ""
    assert "exceed" in native.unsupported_reason("block_row", 65544, "bfloat16", True)
    assert "exceed" in native.unsupported_reason("block_row", 32772, "float32", True)
    assert "aligned" in native.unsupported_reason("block_row", 1000, "float32", False)
    assert native.unsupported_reason("streaming", 10**7, "float32", False) == ""
    with pytest.raises(ValueError, match="kernel: expected one of warp_row"):
        native.unsupported_reason("fast", 10, "float32", True)
    with pytest.raises(ValueError, match="kernel: expected one of warp_row"):  # the selector chooses, not C++
        native.unsupported_reason("auto", 10, "float32", True)
    assert all(k["dtypes"] == ("float32", "float16", "bfloat16") for k in native.kernels())
    # a float32 loss of 16-bit logits is for a reduced loss only; no other loss dtype (checked before any launch)
    for loss_dtype, reduction in (("float16", "mean"), ("float32", "none")):
        with pytest.raises(ValueError, match=f"loss_dtype: expected the logits' dtype bfloat16 or float32 for a "
                                             f"reduced loss, got {loss_dtype}"):
            native.forward(0, 0, 0, 0, 1, 10, "bfloat16", "int64", reduction, -100, "streaming", False, 0, loss_dtype)


def test_with_grad_float32_loss_infers_a_float32_loss():
    op = OPS["cross_entropy_with_grad"]
    in_types = (TensorType((3, 7), "bfloat16"), TensorType((3,), "int64"))
    plain = op.infer(in_types, op.validate_attrs({}, "node"))
    wide = op.infer(in_types, op.validate_attrs({"float32_loss": True}, "node"))
    assert plain == [TensorType((), "bfloat16"), in_types[0]]
    assert wide == [TensorType((), "float32"), in_types[0]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_selector_chooses_the_first_kernel_that_runs_the_rows(dtype):
    """The order the C++ chain had: warp_row, block_row (vectorizable rows only), streaming."""
    packs = 16 // np.dtype(ge2.dtypes.to_numpy(dtype)).itemsize
    assert ce._kernel("auto", 16, dtype, 0) == "warp_row"
    assert ce._kernel("auto", 4096, dtype, 0, 256) == "block_row"
    assert ce._kernel("auto", 4096, dtype, 0, 8) == "streaming"  # dlogits not 16-byte aligned: unvectorized
    assert ce._kernel("auto", 4096 + 1, dtype, 0) == "streaming"
    assert ce._kernel("auto", 70000, dtype, 0) == "streaming"
    assert ce._kernel("auto", 128 * packs, dtype, 0) == "warp_row"
    assert ce._kernel("auto", 130, dtype, 0) == "streaming"  # not packs: over the unvectorized warp's 128
    assert ce._kernel("block_row", 70000, dtype, 0) == "block_row"  # named: the native call checks it
    with pytest.raises(ValueError, match="kernel: 'warp_row' cannot run this problem: dtype int32"):
        ce._kernel("warp_row", 16, "int32", 0)


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def applicable_kernels(cols, dtype, aligned=True):
    native = _native.load("_ops_cross_entropy")
    vectorizable = aligned and cols % (4 if dtype == "float32" else 8) == 0
    return [k for k in ("warp_row", "block_row", "streaming")
            if native.unsupported_reason(k, cols, dtype, vectorizable) == ""]


def run_fused(to_device, poisoned, logits, labels, reduction, kernel="auto", ignore_index=-100):
    rows, cols = logits.shape
    dtype = ge2.dtypes.normalize(logits.dtype)
    loss_out = poisoned(ce.loss_shape(rows, reduction), dtype)
    dlogits_out = poisoned((rows, cols), dtype)
    loss, dlogits = ce.forward_backward(to_device(logits), to_device(labels), reduction, ignore_index, kernel,
                                        out=(loss_out, dlogits_out))
    assert loss is loss_out and dlogits is dlogits_out
    return loss.numpy(), dlogits.numpy()


# (rows, cols): one class, short rows (warp_row), odd rows (scalar paths), long rows (block_row), rows longer than
# the register-cached kernels take (streaming), more rows than resident blocks (the persistent loops).
SHAPES = [(1, 1), (3, 2), (7, 10), (16, 100), (33, 1000), (9, 1024), (5, 1031), (8, 4096), (4, 32000),
          (3, 65536), (2, 70001), (600, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", SHAPES)
def test_fused_every_kernel(rng, to_device, poisoned, dtype, rows, cols):
    logits, labels = make_problem(rng, rows, cols, dtype, label_dtype="int32" if cols % 2 else "int64")
    for reduction in REDUCTIONS:
        expected_loss = ce.reference(logits, labels, reduction)
        expected_grad = ce.reference_backward(np.ones(ce.loss_shape(rows, reduction)), logits, labels, reduction)
        for kernel in applicable_kernels(cols, dtype) + ["auto"]:
            loss, dlogits = run_fused(to_device, poisoned, logits, labels, reduction, kernel)
            what = f"{kernel} {reduction} {rows}x{cols}"
            assert_close(loss, expected_loss, dtype, what=f"loss {what}")
            assert_close(dlogits, expected_grad, dtype, what=f"dlogits {what}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("rows, cols", [(6, 50), (12, 3000), (3, 40000), (4, 1001)])
def test_forward_and_backward_separately(rng, to_device, poisoned, dtype, reduction, rows, cols):
    logits, labels = make_problem(rng, rows, cols, dtype)
    dloss = upstream(rng, rows, reduction, dtype)
    out = poisoned(ce.loss_shape(rows, reduction), dtype)
    assert ce.forward(to_device(logits), to_device(labels), reduction, out=out) is out
    assert_close(out.numpy(), ce.reference(logits, labels, reduction), dtype)
    grad_out = poisoned((rows, cols), dtype)
    assert ce.backward(to_device(dloss), to_device(logits), to_device(labels), reduction,
                       out=(grad_out, None)) == (grad_out, None)
    assert_close(grad_out.numpy(), ce.reference_backward(dloss, logits, labels, reduction), dtype)
    # the numpy face
    assert_close(ce.forward_numpy(logits, labels, reduction), ce.reference(logits, labels, reduction), dtype)
    assert_close(ce.backward_numpy(dloss, logits, labels, reduction)[0],
                 ce.reference_backward(dloss, logits, labels, reduction), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols", [(4, 7), (3, 40)])
def test_gradient_matches_finite_differences(rng, to_device, rows, cols):
    logits, labels = make_problem(rng, rows, cols, "float32", ignore_fraction=0.3)
    labels[0] = rng.integers(0, cols)  # a mean over no counted label is NaN: no finite differences to compare with
    for reduction in REDUCTIONS:
        dloss = upstream(rng, rows, reduction, "float32")
        grad, no_grad = ce.backward_numpy(dloss, logits, labels, reduction)
        assert no_grad is None  # integer labels have no gradient
        numeric = finite_difference(
            lambda x: float(np.sum(ce.reference(x, labels, reduction) * dloss.astype(np.float64))),
            logits.astype(np.float64))
        np.testing.assert_allclose(grad, numeric, atol=2e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols", [(20000, 40), (1500, 3000), (1000, 1031)])
def test_many_rows_per_block_and_determinism(rng, to_device, poisoned, rows, cols):
    """More rows than resident warps/blocks (each runs several rows of its persistent loop): correct, and the
    fused loss is bitwise the forward-only loss and the same run to run."""
    logits, labels = make_problem(rng, rows, cols, "float32")
    for reduction in REDUCTIONS:
        first = run_fused(to_device, poisoned, logits, labels, reduction)
        assert_close(first[0], ce.reference(logits, labels, reduction), "float32")
        expected_grad = ce.reference_backward(np.ones(ce.loss_shape(rows, reduction)), logits, labels, reduction)
        assert_close(first[1], expected_grad, "float32")
        again = run_fused(to_device, poisoned, logits, labels, reduction)
        forward_only = ce.forward(to_device(logits), to_device(labels), reduction).numpy()
        assert first[0].tobytes() == again[0].tobytes() == forward_only.tobytes()
        assert first[1].tobytes() == again[1].tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_ignore_index(rng, to_device, poisoned, dtype):
    logits, labels = make_problem(rng, 40, 130, dtype, ignore_index=7, ignore_fraction=0.4)
    labels[:3] = 7  # an ignore_index inside [0, classes)
    for reduction in REDUCTIONS:
        loss, dlogits = run_fused(to_device, poisoned, logits, labels, reduction, ignore_index=7)
        assert_close(loss, ce.reference(logits, labels, reduction, 7), dtype)
        expected = ce.reference_backward(np.ones(ce.loss_shape(40, reduction)), logits, labels, reduction, 7)
        assert_close(dlogits, expected, dtype)
        assert not dlogits[labels == 7].any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_ignored(rng, to_device, poisoned, dtype):
    logits, _ = make_problem(rng, 5, 16, dtype)
    labels = np.full(5, -100, np.int64)
    loss, dlogits = run_fused(to_device, poisoned, logits, labels, "mean")
    assert math.isnan(float(loss)) and not dlogits.any()
    loss, dlogits = run_fused(to_device, poisoned, logits, labels, "sum")
    assert float(loss) == 0.0 and not dlogits.any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [10, 700, 5000, 70000])
def test_large_logits(rng, to_device, poisoned, dtype, cols):
    # |logits| <= 1e4, so a row's loss stays under 2e4 + log(cols) and the sum of 3 fits float16 (65504)
    logits = (rng.uniform(-1.0, 1.0, (3, cols)) * 1e4).astype(ge2.dtypes.to_numpy(dtype))
    labels = rng.integers(0, cols, 3)
    for reduction in REDUCTIONS:
        loss, dlogits = run_fused(to_device, poisoned, logits, labels, reduction)
        assert np.isfinite(loss.astype(np.float64)).all() and np.isfinite(dlogits.astype(np.float64)).all()
        assert_close(loss, ce.reference(logits, labels, reduction), dtype)
        expected_grad = ce.reference_backward(np.ones(ce.loss_shape(3, reduction)), logits, labels, reduction)
        assert_close(dlogits, expected_grad, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [12, 900, 8000, 70000])
def test_bad_labels_on_device(rng, to_device, poisoned, cols):
    logits, labels = make_problem(rng, 9, cols, "float32", ignore_fraction=0.0)
    labels[3], labels[6] = cols, -5
    device_logits, device_labels = to_device(logits), to_device(labels)
    with pytest.raises(ValueError, match=rf"labels: label {cols} at row 3 is outside \[0, {cols}\)"):
        ce.forward(device_logits, device_labels, "none")
    with pytest.raises(ValueError, match=rf"labels: label {cols} at row 3"):
        ce.forward_backward(device_logits, device_labels, "mean")
    with pytest.raises(ValueError, match=rf"labels: label {cols} at row 3"):
        ce.backward(to_device(np.ones(9, np.float32)), device_logits, device_labels, "none")
    # unchecked: the bad rows are NaN, the others exact; nothing read out of bounds (memcheck runs this test)
    loss_out, dlogits_out = poisoned((9,), "float32"), poisoned((9, cols), "float32")
    ce.forward_backward(device_logits, device_labels, "none", out=(loss_out, dlogits_out), check_labels=False)
    loss, dlogits = loss_out.numpy(), dlogits_out.numpy()
    bad = np.zeros(9, bool)
    bad[[3, 6]] = True
    assert np.isnan(loss[bad]).all() and np.isnan(dlogits[bad]).all()
    good_labels = np.where(bad, -100, labels)
    assert_close(loss[~bad], ce.reference(logits, good_labels, "none")[~bad], "float32")
    expected = ce.reference_backward(np.ones(9), logits, good_labels, "none")
    assert_close(dlogits[~bad], expected[~bad], "float32")
    # the error slot is reset per checked call: a clean call after a bad one passes
    good = to_device(good_labels)
    assert math.isfinite(float(ce.forward(device_logits, good, "sum").numpy()))


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_empty_batch(to_device, reduction):
    logits = np.zeros((0, 5), np.float32)
    labels = np.zeros(0, np.int64)
    loss = ce.forward_numpy(logits, labels, reduction)
    assert loss.shape == ce.loss_shape(0, reduction)
    if reduction == "mean":
        assert math.isnan(float(loss))
    elif reduction == "sum":
        assert float(loss) == 0.0
    loss, dlogits = ce.forward_backward_numpy(logits, labels, reduction)
    assert dlogits.shape == (0, 5)
    grad, _ = ce.backward_numpy(np.ones(ce.loss_shape(0, reduction), np.float32), logits, labels, reduction)
    assert grad.shape == (0, 5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_choice(rng, to_device, dtype):
    native = _native.load("_ops_cross_entropy")
    cases = {16: "warp_row", 4096: "block_row", 70000: "streaming", 1031: "streaming"}
    for cols, expected in cases.items():
        logits, labels = make_problem(rng, 2, cols, dtype)
        x, y = to_device(logits), to_device(labels)
        loss = ce.forward(x, y, "sum")
        kernel = ce._kernel("auto", cols, dtype, x.ptr)  # the selector's choice for these arrays
        ran = native.forward(x.ptr, y.ptr, loss.ptr, 0, 2, cols, dtype, "int64", "sum", -100, kernel, True, 0)
        assert kernel == ran == expected, (cols, kernel, ran)
    logits, labels = make_problem(rng, 2, 70000, dtype)
    with pytest.raises(ValueError, match="kernel: 'block_row' cannot run this problem: rows of 70000"):
        ce.forward(to_device(logits), to_device(labels), kernel="block_row")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_candidates_launch_plan_style(rng, to_device, poisoned, dtype):
    op = OPS["cross_entropy"]
    for cols in (24, 2048, 40000):
        logits, labels = make_problem(rng, 7, cols, dtype)
        for reduction in REDUCTIONS:
            attrs = op.validate_attrs({"reduction": reduction}, "node")
            in_types = (TensorType(logits.shape, dtype), TensorType(labels.shape, "int64"))
            problem = Problem("cross_entropy", in_types, tuple(op.infer(in_types, attrs)), attrs)
            for candidate in op.candidates:
                if candidate.supports(problem) is not None:
                    continue
                launch = candidate.prepare(problem)
                x, y = to_device(logits), to_device(labels)
                out = poisoned(ce.loss_shape(7, reduction), dtype)
                launch([x.ptr, y.ptr], [out.ptr], 0)
                assert_close(out.numpy(), ce.reference(logits, labels, reduction), dtype,
                             what=f"{candidate.name} {reduction} {cols}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rows, cols", [(7, 24), (9, 2048), (5, 50257)])
def test_with_grad_float32_loss_of_16_bit_logits(rng, to_device, poisoned, dtype, rows, cols):
    """cross_entropy_with_grad(float32_loss=True) launched as a plan launches it (mixed precision's fused loss): the
    loss in float32 at float32's tolerance against the float64 reference (not rounded to 16 bits), dlogits in the
    logits' dtype."""
    op = OPS["cross_entropy_with_grad"]
    logits, labels = make_problem(rng, rows, cols, dtype)
    (candidate,) = op.candidates
    for reduction in ("sum", "mean"):
        attrs = op.validate_attrs({"reduction": reduction, "float32_loss": True}, "node")
        in_types = (TensorType(logits.shape, dtype), TensorType(labels.shape, "int64"))
        out_types = tuple(op.infer(in_types, attrs))
        launch = candidate.prepare(Problem("cross_entropy_with_grad", in_types, out_types, attrs))
        x, y = to_device(logits), to_device(labels)
        loss, dlogits = poisoned((), "float32"), poisoned((rows, cols), dtype)
        launch([x.ptr, y.ptr], [loss.ptr, dlogits.ptr], 0)
        what = f"{reduction} {rows}x{cols}"
        assert_close(loss.numpy(), ce.reference(logits, labels, reduction), "float32", cols, what=f"loss {what}")
        assert_close(dlogits.numpy(), ce.reference_backward(np.ones(()), logits, labels, reduction), dtype,
                     what=f"dlogits {what}")


@pytest.mark.gpu
def test_large_training_shape(rng, to_device, poisoned):
    """1024 x 32000 float16 (the benchmark's rows): block_row with several rows per block."""
    logits, labels = make_problem(rng, 1024, 32000, "float16", ignore_fraction=0.05)
    loss, dlogits = run_fused(to_device, poisoned, logits, labels, "mean")
    assert_close(loss, ce.reference(logits, labels), "float16")
    assert_close(dlogits, ce.reference_backward(np.array(1.0), logits, labels), "float16")


@pytest.mark.gpu
def test_torch_interop_and_misaligned_views(rng):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for dtype, cols in (("float32", 1000), ("float16", 32000), ("bfloat16", 77)):
        logits, labels = make_problem(rng, 12, cols, dtype)
        torch_dtype = getattr(torch, dtype)
        x = torch.from_numpy(logits.astype(np.float32)).to("cuda", torch_dtype)
        y = torch.from_numpy(labels).cuda()
        loss, dlogits = ce.forward_backward(x, y, "mean")
        assert isinstance(loss, torch.Tensor) and loss.shape == () and loss.dtype == torch_dtype
        x32 = x.float().requires_grad_()
        expected = F.cross_entropy(x32, y, ignore_index=-100)
        expected.backward()
        assert_close(loss.float().cpu().numpy(), expected.detach().cpu().numpy(), dtype)
        assert_close(dlogits.float().cpu().numpy(), x32.grad.cpu().numpy(), dtype)
        # a contiguous but misaligned copy (2- or 4-byte offset): the unvectorized paths
        storage = torch.empty(12 * cols + 1, dtype=torch_dtype, device="cuda")
        shifted = storage[1:].view(12, cols)
        shifted.copy_(x)
        shifted_loss = ce.forward(shifted, y.int(), "none")
        assert_close(shifted_loss.float().cpu().numpy(), ce.reference(logits, labels, "none"), dtype)
        grad, _ = ce.backward(torch.ones(12, dtype=torch_dtype, device="cuda"), shifted, y, "none")
        assert_close(grad.float().cpu().numpy(), ce.reference_backward(np.ones(12), logits, labels, "none"), dtype)


@pytest.mark.gpu
def test_device_errors(rng, to_device):
    logits, labels = make_problem(rng, 4, 6, "float32")
    x, y = to_device(logits), to_device(labels)
    with pytest.raises(ValueError, match=r"out: expected shape \(\)"):
        ce.forward(x, y, "mean", out=to_device(np.zeros(4, np.float32)))
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        ce.forward(x, y, "mean", out=to_device(np.zeros((), np.float16)))
    with pytest.raises(ValueError, match=r"out\[1\]: must not overlap logits"):
        ce.forward_backward(x, y, "mean", out=(None, x))
    with pytest.raises(TypeError, match="labels: expected a CUDA device array"):
        ce.forward(x, labels)
    torch = pytest.importorskip("torch")
    tx = torch.from_numpy(logits).cuda()
    with pytest.raises(ValueError, match="logits: expected a contiguous"):
        ce.forward(tx.t().contiguous().t(), torch.from_numpy(labels).cuda())
