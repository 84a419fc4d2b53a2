"""gemm: reference math, validation (CPU), and every dtype x act x bias x C x trans x candidate on the GPU."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import Problem, gemm
from graph_executor_v2.testing import assert_close, random_array

DTYPES = ("float32", "float16", "bfloat16")
ACTS = ("none", "relu", "gelu", "silu", "leaky_relu")


# ---------------------------------------------------------------------------------------------------------------
# CPU: reference against closed forms
# ---------------------------------------------------------------------------------------------------------------
def test_reference_matches_closed_form():
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    b = np.array([[5.0, -6.0], [7.0, 8.0]])
    bias = np.array([1.0, -100.0])
    c = np.ones((2, 2))
    y, z = gemm.reference(a, b, bias, c, act="relu", alpha=2.0, beta=3.0)
    expected_z = 2.0 * np.array([[19.0, 10.0], [43.0, 14.0]]) + 3.0 + bias
    np.testing.assert_array_equal(z, expected_z)
    np.testing.assert_array_equal(y, np.maximum(expected_z, 0))


def test_reference_adds_the_residual_after_the_activation():
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    b = np.array([[5.0, -6.0], [7.0, 8.0]])
    bias = np.array([1.0, -100.0])
    c = np.array([[1.0, -2.0], [0.5, 4.0]])
    y, z = gemm.reference(a, b, bias, c, act="relu", alpha=2.0, beta=3.0, residual_after_act=True)
    expected_z = 2.0 * np.array([[19.0, 10.0], [43.0, 14.0]]) + bias
    np.testing.assert_array_equal(z, expected_z)
    np.testing.assert_array_equal(y, np.maximum(expected_z, 0) + 3.0 * c)


def test_reference_transposes():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 5)), rng.standard_normal((4, 3))
    y, _ = gemm.reference(a, b, trans_a=True, trans_b=True)
    np.testing.assert_allclose(y, a.T @ b.T)


@pytest.mark.parametrize("residual_after_act", (False, True))
@pytest.mark.parametrize("act", ACTS)
def test_reference_backward_matches_finite_differences(act, residual_after_act, rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    bias, c = rng.standard_normal(5), rng.standard_normal((3, 5))
    dy = rng.standard_normal((3, 5))
    kwargs = dict(act=act, alpha=1.5, beta=0.5, slope=0.1, residual_after_act=residual_after_act)
    _, z = gemm.reference(a, b, bias, c, **kwargs)
    da, db, dbias, dc = gemm.reference_backward(dy, a, b, z, **kwargs)

    def loss(a_, b_, bias_, c_):
        return float((gemm.reference(a_, b_, bias_, c_, **kwargs)[0] * dy).sum())

    def numeric(index, x):
        grad, h = np.zeros_like(x), 1e-6
        for i in np.ndindex(x.shape):
            args_plus = [a, b, bias, c]
            args_minus = [a, b, bias, c]
            plus, minus = x.copy(), x.copy()
            plus[i] += h
            minus[i] -= h
            args_plus[index], args_minus[index] = plus, minus
            grad[i] = (loss(*args_plus) - loss(*args_minus)) / (2 * h)
        return grad

    for index, (name, analytic) in enumerate((("dA", da), ("dB", db), ("dbias", dbias), ("dC", dc))):
        np.testing.assert_allclose(analytic, numeric(index, [a, b, bias, c][index]), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def test_opdef_infers_and_runs_reference():
    op = ge2.ops.OPS["gemm"]
    attrs = op.validate_attrs({"act": "gelu", "trans_b": True}, "node g0")
    out = op.infer([ge2.ir.TensorType((8, 4), "float16"), ge2.ir.TensorType((6, 4), "float16"), None, None], attrs)
    assert out == [ge2.ir.TensorType((8, 6), "float16")]
    a, b = np.ones((8, 4), np.float16), np.ones((6, 4), np.float16)
    (y,) = op.run_reference([a, b, None, None], attrs)
    assert y.dtype == np.float16 and y.shape == (8, 6)
    np.testing.assert_allclose(y.astype(np.float64), gemm.reference(a, b, act="gelu", trans_b=True)[0], rtol=1e-3)


# ---------------------------------------------------------------------------------------------------------------
# CPU: validation happens before any device work
# ---------------------------------------------------------------------------------------------------------------
F32 = np.float32


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(a=np.ones((2, 3), F32), b=np.ones((4, 5), F32)), ValueError, r"b: inner dimension mismatch.*2x3.*4x5"),
        (dict(a=np.ones((2, 3), F32), b=np.ones((3, 5), np.float16)), TypeError, r"b: expected dtype float32.*float16"),
        (dict(a=np.ones((2, 3, 1), F32), b=np.ones((3, 5), F32)), ValueError, r"a: expected a 2-d array"),
        (dict(a=np.ones((2, 3), F32), b=np.ones(3, F32)), ValueError, r"b: expected a 2-d array"),
        (dict(a=np.ones((2, 3), np.int32), b=np.ones((3, 5), np.int32)), TypeError, r"a: expected dtype float32"),
        (dict(a=np.ones((2, 3), F32), b=np.ones((3, 5), F32), bias=np.ones(4, F32)), ValueError,
         r"bias: expected shape \(5,\).*got \(4,\)"),
        (dict(a=np.ones((2, 3), F32), b=np.ones((3, 5), F32), bias=np.ones(5, np.float16)), TypeError,
         r"bias: expected dtype float32"),
        (dict(a=np.ones((2, 3), F32), b=np.ones((3, 5), F32), c=np.ones((5, 2), F32), beta=1.0), ValueError,
         r"c: expected shape \(2, 5\)"),
        (dict(a=np.ones((2, 3), F32), b=np.ones((3, 5), F32), act="tanhh"), ValueError,
         r"attribute 'act' expected one of"),
        (dict(a=np.ones((3, 2), F32), b=np.ones((3, 5), F32), trans_a=1), TypeError,
         r"attribute 'trans_a' expected bool"),
        (dict(a=np.ones((2, 3), F32), b=np.ones((3, 5), F32), kernel="magic"), ValueError, r"kernel: expected one of"),
        (dict(a=[[1.0]], b=np.ones((1, 1), F32)), TypeError, r"a: expected a NumPy array"),
        (dict(a=np.ones((0, 3), F32), b=np.ones((3, 5), F32)), ValueError, r"every dimension must be >= 1"),
    ],
)
def test_forward_numpy_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        gemm.forward_numpy(**kwargs)


def test_backward_numpy_requires_preact_for_activation():
    with pytest.raises(ValueError, match=r"preact: required for act='gelu'"):
        gemm.backward_numpy(np.ones((2, 5), F32), np.ones((2, 3), F32), np.ones((3, 5), F32), act="gelu")
    with pytest.raises(ValueError, match=r"dy: expected shape \(2, 5\)"):
        gemm.backward_numpy(np.ones((5, 2), F32), np.ones((2, 3), F32), np.ones((3, 5), F32))


def test_backward_numpy_validates_chaining_arguments():
    dy, a, b = np.ones((2, 5), F32), np.ones((2, 3), F32), np.ones((3, 5), F32)
    with pytest.raises(ValueError, match=r"a_preact: required for a_act='gelu'"):
        gemm.backward_numpy(dy, a, b, a_act="gelu")
    with pytest.raises(ValueError, match=r"a_preact: expected shape \(2, 3\)"):
        gemm.backward_numpy(dy, a, b, a_act="gelu", a_preact=np.ones((3, 2), F32))
    with pytest.raises(ValueError, match=r"a_act: expected one of"):
        gemm.backward_numpy(dy, a, b, a_act="swish", a_preact=a)


def test_forward_rejects_host_arrays_for_device_path():
    with pytest.raises(TypeError, match=r"a: expected a CUDA device array"):
        gemm.forward(np.ones((2, 3), F32), np.ones((3, 5), F32))


def test_kernels_report_constraints():
    if not ge2._native.is_built("_ops_gemm"):
        pytest.skip("_ops_gemm is not built")
    names = [k["name"] for k in gemm.kernels()]
    assert names == ["cublaslt_epilogue", "cublaslt_postkernel", "cutlass_sm90", "tiled"]
    assert all(k["constraints"] for k in gemm.kernels())
    native = gemm._native_module()
    assert "activation" in native.unsupported_reason("cublaslt_epilogue", 8, 8, 8, "float16", "silu", True, False,
                                                     False, True)
    assert "N % 8" in native.unsupported_reason("cublaslt_epilogue", 8, 7, 8, "float16", "gelu", True, False, True,
                                                True)
    assert native.unsupported_reason("cublaslt_postkernel", 8, 7, 8, "float16", "silu", True, True, True, False) == ""


def test_no_gpu_is_a_clear_error():
    if ge2.device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        gemm.forward_numpy(np.ones((2, 3), F32), np.ones((3, 5), F32))
    if ge2._native.is_built("_runtime"):
        with pytest.raises(RuntimeError, match="no CUDA device"):
            ge2.device.runtime().DeviceArray.empty([4], "float32")


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _run(rng, m, n, k, dtype, act, with_bias, with_c, trans_a, trans_b, kernel, save_preact=False, scale=None,
         residual_after_act=False):
    scale = scale if scale is not None else 1.0 / np.sqrt(k)  # keeps outputs O(1) so activations are exercised
    a = random_array(rng, (k, m) if trans_a else (m, k), dtype, scale)
    b = random_array(rng, (n, k) if trans_b else (k, n), dtype)
    bias = random_array(rng, (n,), dtype) if with_bias else None
    c = random_array(rng, (m, n), dtype) if with_c else None
    alpha, beta, slope = 1.25, (0.5 if with_c else 0.0), 0.05
    runtime = ge2.device.runtime()
    to_device = lambda x: None if x is None else runtime.DeviceArray.from_numpy(x)  # noqa: E731
    y, z = runtime.DeviceArray.empty([m, n], dtype), runtime.DeviceArray.empty([m, n], dtype)
    y.poison()  # NaN: an element a kernel forgets to write can never pass
    z.poison()
    result = gemm.forward(to_device(a), to_device(b), to_device(bias), to_device(c), act=act, alpha=alpha, beta=beta,
                          trans_a=trans_a, trans_b=trans_b, slope=slope, kernel=kernel, save_preact=save_preact,
                          out=y, preact_out=z, residual_after_act=residual_after_act)
    result = (result[0].numpy(), result[1].numpy()) if save_preact else result.numpy()
    y_ref, z_ref = gemm.reference(a, b, bias, c, act=act, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b,
                                  slope=slope, residual_after_act=residual_after_act)
    return result, y_ref, z_ref


CANDIDATES = ("cublaslt_epilogue", "cublaslt_postkernel", "tiled")


def _supported(kernel, act, save_preact=False, n=8):
    if kernel != "cublaslt_epilogue":
        return True
    if act not in ("none", "relu", "gelu"):
        return False
    return not (save_preact and (act == "relu" or (act == "gelu" and n % 8)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("kernel", CANDIDATES)
def test_forward_every_dtype_act_kernel(rng, dtype, act, kernel):
    for with_bias, with_c, trans_a, trans_b in itertools.product((False, True), repeat=4):
        if not _supported(kernel, act):
            with pytest.raises(ValueError, match=f"kernel: '{kernel}' cannot run"):
                _run(rng, 24, 40, 56, dtype, act, with_bias, with_c, trans_a, trans_b, kernel)
            return
        y, y_ref, _ = _run(rng, 24, 40, 56, dtype, act, with_bias, with_c, trans_a, trans_b, kernel)
        assert_close(y, y_ref, dtype, 56, what=f"{kernel} bias={with_bias} C={with_c} ta={trans_a} tb={trans_b}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
def test_residual_after_the_activation(rng, dtype, act):
    for kernel in ("auto", *CANDIDATES):
        for save_preact in ((False, True) if act != "none" else (False,)):
            if kernel == "cublaslt_epilogue" and act != "none":
                reason = ("residual_after_act: cuBLASLt adds C before" if act in ("relu", "gelu")
                          else "cuBLASLt has no epilogue for this activation")
                with pytest.raises(ValueError, match=reason):
                    _run(rng, 24, 40, 56, dtype, act, True, True, False, False, kernel, residual_after_act=True)
                continue
            if not _supported(kernel, act, save_preact, 40):
                continue
            result, y_ref, z_ref = _run(rng, 24, 40, 56, dtype, act, True, True, False, True, kernel, save_preact,
                                        residual_after_act=True)
            y = result[0] if save_preact else result
            assert_close(y, y_ref, dtype, 56, what=f"{kernel} save_preact={save_preact}")
            if save_preact:
                assert_close(result[1], z_ref, dtype, 56, what=f"{kernel} preact (without the residual)")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m, n, k",
    [(1, 1, 1), (1, 4096, 4096), (4096, 1, 7), (7, 13, 9), (33, 65, 17), (129, 100, 1000), (3, 5, 4099),
     (4096, 4096, 4096)],
)
def test_forward_edge_shapes(rng, dtype, m, n, k):
    kernels = ("auto", "tiled") if m * n * k < 1 << 30 else ("auto",)
    for kernel in kernels:
        y, y_ref, _ = _run(rng, m, n, k, dtype, "relu", True, False, False, False, kernel)
        assert_close(y, y_ref, dtype, k, what=f"{m}x{n}x{k} {kernel}")


@pytest.mark.gpu
def test_tf32_is_opt_in(rng):
    a, b = random_array(rng, (256, 512), "float32"), random_array(rng, (512, 128), "float32")
    y_ref = gemm.reference(a, b)[0]
    strict = gemm.forward_numpy(a, b, kernel="cublaslt_epilogue")
    assert_close(strict, y_ref, "float32", 512)
    fast = gemm.forward_numpy(a, b, kernel="cublaslt_epilogue", allow_tf32=True)
    assert_close(fast, y_ref, "tf32", 512)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ("relu", "gelu", "silu", "leaky_relu"))
def test_save_preact(rng, dtype, act):
    for kernel in CANDIDATES:
        for n in (40, 37):
            if not _supported(kernel, act, save_preact=True, n=n):
                with pytest.raises(ValueError, match="cannot run"):
                    _run(rng, 16, n, 24, dtype, act, True, True, False, False, kernel, save_preact=True)
                continue
            (y, z), y_ref, z_ref = _run(rng, 16, n, 24, dtype, act, True, True, False, False, kernel,
                                        save_preact=True)
            assert_close(y, y_ref, dtype, 24, what=f"y {kernel} n={n}")
            assert_close(z, z_ref, dtype, 24, what=f"preact {kernel} n={n}")


@pytest.mark.gpu
def test_outputs_are_fully_written(rng, poisoned, to_device):
    a, b = random_array(rng, (37, 29), "float16"), random_array(rng, (29, 53), "float16")
    for kernel in CANDIDATES:
        out = poisoned((37, 53), "float16")
        gemm.forward(to_device(a), to_device(b), kernel=kernel, out=out)
        result = out.numpy()
        assert not np.isnan(result.astype(np.float32)).any(), kernel
        assert_close(result, gemm.reference(a, b)[0], "float16", 29, what=kernel)


def test_a_direct_call_tries_the_kernels_the_c_chain_tried(monkeypatch):
    """save_preact's direct native call: the selector's order for its pointers (cublaslt_epilogue, then
    cublaslt_postkernel, ..., tiled last), the fused epilogue left out for GE2_FORCE_NO_EPILOGUE=1."""
    if not ge2._native.is_built("_ops_gemm"):
        pytest.skip("_ops_gemm is not built")
    view = lambda *shape: SimpleNamespace(shape=shape, dtype="float16")  # noqa: E731
    views = {"a": view(64, 64), "b": view(64, 64), "bias": view(64)}
    aligned, misaligned_bias = (256, 512, 0, 768, 1024, 0), (256, 512, 0, 770, 1024, 0)

    def kernels(act, pointers=aligned, save_preact=False):
        attrs = gemm.OP.validate_attrs({"act": act}, "test")
        return gemm._call_kernels("auto", views, attrs, pointers, save_preact)

    assert kernels("gelu")[0] == "cublaslt_epilogue" and kernels("gelu")[-1] == "tiled"
    assert kernels("silu")[0] == "cublaslt_postkernel"  # no cuBLASLt epilogue for SiLU
    assert kernels("gelu", misaligned_bias)[0] == "cublaslt_postkernel"
    assert kernels("relu", save_preact=True)[0] == "cublaslt_postkernel"  # RELU_AUX saves a bit-mask
    assert gemm._call_kernels("tiled", views, {}, aligned, False) == ["tiled"]  # named: the native call checks it
    monkeypatch.setenv("GE2_FORCE_NO_EPILOGUE", "1")
    assert kernels("relu")[0] == "cublaslt_postkernel"
    with pytest.raises(ValueError, match="kernel: expected one of cublaslt_epilogue"):  # the selector chooses
        gemm._native_module().unsupported_reason("auto", 8, 8, 8, "float16", "none", False, False, False, True,
                                                 False, False)


BACKWARD_KERNELS = ("cublaslt_epilogue", "cublaslt_postkernel", "tiled")
GELU_C, GELU_K = np.sqrt(2.0 / np.pi), 0.044715
TANH_APPROX_ERROR = 2.0 ** -11  # relative error bound of PTX's tanh.approx.f32, the fast tanh of GPU epilogues


def dgelu_epilogue_slack(d_a, preact):
    """How far cuBLASLt's DGELU_BGRAD epilogue may put dA * gelu'(preact) from the float64 value beyond float32
    rounding: it evaluates gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) c q, t = tanh(c (x + k x^3)), q = 1 + 3 k x^2,
    with an approximate tanh: not float32's (H200 call 3 saw 8.1e-5 on one of 1536 float32 elements, 1.6x the float32
    tolerance), taken here at tanh.approx.f32's bound, relative error 2^-11. gelu' is quadratic in t, so a tanh off by dt (|dt| <= 2^-11 |t|) moves it by
    exactly (0.5 - x t c q) dt - 0.5 x c q dt^2; the product is off by |dA| times that bound."""
    x = np.asarray(preact, np.float64)
    t = np.tanh(GELU_C * (x + GELU_K * x ** 3))
    q = 1 + 3 * GELU_K * x ** 2
    dt = TANH_APPROX_ERROR * np.abs(t)
    return np.abs(d_a) * (np.abs(0.5 - x * t * GELU_C * q) * dt + 0.5 * np.abs(x) * GELU_C * q * dt ** 2)


def _backward_problem(dtype="float16", with_dbias=True):
    types = [TensorType(shape, dtype) for shape in ((64, 48), (64, 32), (32, 48))]
    attrs = gemm.BACKWARD_OP.validate_attrs({"with_dbias": with_dbias}, "test")
    return Problem("gemm_backward", (*types, None), (types[1], types[2], TensorType((48,), dtype)), attrs)


def test_backward_kernels_are_the_tables_kernels_but_cutlass():
    """gemm_backward's candidates are table candidates of _ops_gemm (metadata written once, in C++), best first."""
    if not ge2._native.is_built("_ops_gemm"):
        pytest.skip("_ops_gemm is not built")
    candidates = sorted(selection.candidates(gemm.BACKWARD_OP), key=lambda c: -c.priority)
    assert tuple(c.name for c in candidates) == BACKWARD_KERNELS
    assert candidates[-1].always_works and candidates[0].capabilities == ("fused_epilogue",)


def test_backward_runs_tiled_exactly_where_cublaslt_declines(monkeypatch):
    """A direct backward call takes the first kernel the native check accepts for its pointers, in the selector's
    order: the fused epilogue, then plain cuBLASLt, then tiled; GE2_FORCE_NO_EPILOGUE=1 leaves the epilogue out."""
    declined = set()
    why_not = lambda name: "cuBLASLt returned no algorithm" if name in declined else ""  # noqa: E731
    problem = _backward_problem()
    for refused, expected in (((), "cublaslt_epilogue"), (("cublaslt_epilogue",), "cublaslt_postkernel"),
                              (("cublaslt_epilogue", "cublaslt_postkernel"), "tiled")):
        declined = set(refused)
        assert gemm._backward_kernel(problem, why_not) == expected, refused
    declined = set(BACKWARD_KERNELS)
    with pytest.raises(RuntimeError, match="gemm.backward: no kernel can run this problem .*tiled: cuBLASLt"):
        gemm._backward_kernel(problem, why_not)
    declined = set()
    monkeypatch.setenv("GE2_FORCE_NO_EPILOGUE", "1")
    assert gemm._backward_kernel(problem, why_not) == "cublaslt_postkernel"


def test_backward_plan_candidates_fall_to_the_next_where_cublaslt_declines(monkeypatch):
    """A plan's gemm_backward: each candidate's prepare asks the native check (plan buffers' alignment) and raises
    where its kernel cannot run, so the selector prepares the next; the launch names the kernel that prepared."""
    if not ge2._native.is_built("_runtime"):
        pytest.skip("_runtime is not built")
    asked = []

    class Native:
        declined = ("cublaslt_epilogue",)

        def backward_unsupported_reason(self, kernel, *call):
            asked.append((kernel, call[:9]))
            return "cuBLASLt returned no algorithm for the dB matmul" if kernel in self.declined else ""

        def backward(self, *call, residual_after_act=False):
            raise AssertionError("not launched in this test")

    monkeypatch.setattr(gemm, "_native_module", lambda: Native())
    problem = _backward_problem(with_dbias=False)
    choice = selection.choose(selection.rank(gemm.BACKWARD_OP, problem), problem)
    assert choice.candidate.name == "cublaslt_postkernel"
    assert choice.fallbacks == (("cublaslt_epilogue", "RuntimeError: gemm_backward: kernel 'cublaslt_epilogue' "
                                 "cannot run this problem: cuBLASLt returned no algorithm for the dB matmul"),)
    # Every present operand stands in at a plan buffer's 256-byte alignment; the absent ones (no dbias) are 0.
    assert asked[0] == ("cublaslt_epilogue", (256, 256, 256, 0, 0, 256, 256, 0, 0))


def test_native_backward_runs_only_the_kernel_it_is_named():
    """The native entry point chooses nothing: "auto" is refused, and a kernel that has no backward is refused with
    the op and the reason, before any device work (this runs without a GPU)."""
    if not ge2._native.is_built("_ops_gemm"):
        pytest.skip("_ops_gemm is not built")
    native = gemm._native_module()
    call = (256, 512, 768, 0, 0, 1024, 1280, 0, 0, 8, 8, 8, "float16", False, False, 1.0, 0.0, "none", 0.01, False,
            0, "none", 0.01, 0)
    assert "cutlass_sm90 has no backward" in native.backward_unsupported_reason("cutlass_sm90", *call)
    assert native.backward_unsupported_reason("tiled", *call) == ""
    with pytest.raises(ValueError, match="ge2 op 'gemm' backward: kernel 'cutlass_sm90' cannot run this problem: "
                                         "cutlass_sm90 has no backward"):
        native.backward(*call, "cutlass_sm90", 0)
    with pytest.raises(ValueError, match="kernel: expected one of cublaslt_epilogue"):
        native.backward(*call, "auto", 0)
    with pytest.raises(ValueError, match="m, n, k: every dimension must be >= 1"):
        native.backward_unsupported_reason("tiled", *call[:9], 0, *call[10:])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_misaligned_bias_forces_fallback(rng, dtype):
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    a = torch.randn(32, 48, device="cuda", dtype=tdtype)
    b = torch.randn(48, 40, device="cuda", dtype=tdtype)
    storage = torch.randn(41, device="cuda", dtype=tdtype)
    bias = storage[1:]  # 2-byte offset: not 16-byte aligned
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        gemm.forward(a, b, bias, act="relu", kernel="cublaslt_epilogue")
    y = gemm.forward(a, b, bias, act="relu")
    expected = gemm.reference(a.float().cpu().numpy(), b.float().cpu().numpy(), bias.float().cpu().numpy(),
                              act="relu")[0]
    assert isinstance(y, torch.Tensor)
    assert_close(y.float().cpu().numpy(), expected, dtype, 48)


@pytest.mark.gpu
def test_torch_and_cupy_zero_copy(rng):
    torch = pytest.importorskip("torch")
    a = torch.randn(64, 32, device="cuda", dtype=torch.float16)
    b = torch.randn(32, 16, device="cuda", dtype=torch.float16)
    out = torch.full((64, 16), float("nan"), device="cuda", dtype=torch.float16)
    result = gemm.forward(a, b, out=out)
    assert result is out  # written in place, no copy
    torch.testing.assert_close(out, (a.float() @ b.float()).half(), rtol=2e-3, atol=2e-3)

    runtime = ge2.device.runtime()
    imported = ge2.device.as_device_array(a)
    assert imported.ptr == a.data_ptr() and imported.shape == (64, 32) and imported.dtype == "float16"
    back = torch.from_dlpack(runtime.DeviceArray.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3)))
    assert back.device.type == "cuda" and back.cpu().numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    bf16 = torch.randn(8, 8, device="cuda", dtype=torch.bfloat16)
    assert ge2.device.as_device_array(bf16).dtype == "bfloat16"

    cupy = pytest.importorskip("cupy")
    ca = cupy.asarray(rng.standard_normal((16, 8)).astype(np.float32))
    cb = cupy.asarray(rng.standard_normal((8, 4)).astype(np.float32))
    cy = gemm.forward(ca, cb)
    assert isinstance(cy, cupy.ndarray)
    assert_close(cupy.asnumpy(cy), gemm.reference(cupy.asnumpy(ca), cupy.asnumpy(cb))[0], "float32", 8)
    via_cai = runtime.DeviceArray.from_cuda_array_interface(ca)
    assert via_cai.ptr == ca.data.ptr
    assert cupy.asarray(via_cai).data.ptr == ca.data.ptr  # and back, through __cuda_array_interface__


@pytest.mark.gpu
def test_streams_and_no_new_plans_in_steady_state(rng, to_device):
    runtime = ge2.device.runtime()
    stream = runtime.Stream()
    a, b = to_device(random_array(rng, (128, 64), "bfloat16")), to_device(random_array(rng, (64, 96), "bfloat16"))
    y = gemm.forward(a, b, act="gelu", stream=stream)
    stream.synchronize()
    before = gemm._native_module().lt_plan_count()
    start, end = runtime.Event(), runtime.Event()
    start.record(stream.handle)
    for _ in range(10):
        gemm.forward(a, b, act="gelu", out=y, stream=stream)
    end.record(stream.handle)
    end.synchronize()
    assert start.elapsed_ms(end) > 0.0
    assert gemm._native_module().lt_plan_count() == before
    assert_close(y.numpy(), gemm.reference(a.numpy(), b.numpy(), act="gelu")[0], "bfloat16", 64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
def test_backward_matches_reference(rng, dtype, act):
    for trans_a, trans_b in itertools.product((False, True), repeat=2):
        m, n, k = 24, 40, 32
        a = random_array(rng, (k, m) if trans_a else (m, k), dtype, 0.5)
        b = random_array(rng, (n, k) if trans_b else (k, n), dtype, 0.5)
        bias, c, dy = random_array(rng, (n,), dtype), random_array(rng, (m, n), dtype), random_array(rng, (m, n), dtype)
        kwargs = dict(act=act, alpha=1.0, beta=0.5, trans_a=trans_a, trans_b=trans_b, slope=0.1)
        _, z = gemm.reference(a, b, bias, c, **kwargs)
        z = z.astype(a.dtype)
        grads = gemm.backward_numpy(dy, a, b, bias, c, preact=None if act == "none" else z, **kwargs)
        assert len(grads) == 4
        refs = gemm.reference_backward(dy, a, b, z, **kwargs)
        for name, got, ref, length in zip(("dA", "dB", "dbias", "dC"), grads, refs, (n, m, m, 1)):
            assert_close(got, ref, dtype, length, what=f"{name} ta={trans_a} tb={trans_b}")


@pytest.mark.gpu
@pytest.mark.parametrize("act", ("none", "gelu"))
def test_backward_with_the_residual_after_the_activation(rng, act):
    m, n, k, dtype = 24, 40, 32, "float32"
    a, b = random_array(rng, (m, k), dtype, 0.5), random_array(rng, (k, n), dtype, 0.5)
    bias, c, dy = random_array(rng, (n,), dtype), random_array(rng, (m, n), dtype), random_array(rng, (m, n), dtype)
    kwargs = dict(act=act, beta=0.5, residual_after_act=True)
    _, z = gemm.reference(a, b, bias, c, **kwargs)
    z = z.astype(a.dtype)
    grads = gemm.backward_numpy(dy, a, b, bias, c, preact=None if act == "none" else z, **kwargs)
    refs = gemm.reference_backward(dy, a, b, z, **kwargs)
    for name, got, ref, length in zip(("dA", "dB", "dbias", "dC"), grads, refs, (n, m, m, 1)):
        assert_close(got, ref, dtype, length, what=name)


@pytest.mark.gpu
def test_backward_with_alpha_against_finite_differences(rng):
    m, n, k = 5, 7, 3
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    bias, dy = rng.standard_normal(n).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)
    kwargs = dict(act="silu", alpha=0.75)
    _, z = gemm.reference(a, b, bias, **kwargs)
    da, db, dbias, dc = gemm.backward_numpy(dy, a, b, bias, preact=z.astype(np.float32), **kwargs)
    assert dc is None  # no c, no gradient for it

    def loss(a_, b_, bias_):
        return float((gemm.reference(a_, b_, bias_, **kwargs)[0] * dy).sum())

    h = 1e-4
    for name, x, grad, slot in (("dA", a, da, 0), ("dB", b, db, 1), ("dbias", bias, dbias, 2)):
        numeric = np.zeros(x.shape)
        for i in np.ndindex(x.shape):
            args = [a.astype(np.float64), b.astype(np.float64), bias.astype(np.float64)]
            plus, minus = args[slot].copy(), args[slot].copy()
            plus[i] += h
            minus[i] -= h
            numeric[i] = (loss(*args[:slot], plus, *args[slot + 1:]) - loss(*args[:slot], minus, *args[slot + 1:])) / (2 * h)
        assert_close(grad, numeric, "float32", 64, what=name)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_act", ("gelu", "relu", "silu", "leaky_relu"))
def test_backward_chained_through_previous_activation(rng, dtype, a_act):
    """dA comes back as the previous layer's pre-activation gradient, with that layer's bias gradient: DGELU_BGRAD
    for gelu with trans_a False and K % 8 == 0, the post-kernel path otherwise (trans_a, other activations)."""
    for trans_a, k in ((False, 48), (True, 48), (False, 13)):
        m, n = 32, 24
        a_preact = random_array(rng, (k, m) if trans_a else (m, k), dtype)
        from graph_executor_v2.ops import activations

        a = activations.apply(a_act, a_preact.astype(np.float64), 0.1).astype(a_preact.dtype)
        b, dy = random_array(rng, (k, n), dtype, 0.5), random_array(rng, (m, n), dtype)
        runtime = ge2.device.runtime()
        dbias_a = runtime.DeviceArray.empty([a.shape[1]], dtype)
        dbias_a.poison()
        device = runtime.DeviceArray.from_numpy
        grads = gemm.backward(device(dy), device(a), device(b), trans_a=trans_a, a_preact=device(a_preact),
                              a_act=a_act, a_slope=0.1, dbias_a_out=dbias_a)
        assert grads[2] is None and grads[3] is None
        d_a, _, _, _ = gemm.reference_backward(dy, a, b, trans_a=trans_a)
        d_pre = d_a * activations.derivative(a_act, a_preact.astype(np.float64), 0.1)
        fused = a_act == "gelu" and not trans_a and k % 8 == 0  # DGELU_BGRAD (the fused kernel is auto's first)
        slack = dgelu_epilogue_slack(d_a, a_preact) if fused else 0.0
        assert_close(grads[0].numpy(), d_pre, dtype, n, what=f"dA_pre ta={trans_a} k={k}", slack=slack)
        assert_close(dbias_a.numpy(), d_pre.sum(axis=0), dtype, n * (k if trans_a else m),
                     what=f"dbias_a ta={trans_a} k={k}", slack=np.sum(slack, axis=0))
        with pytest.raises(ValueError, match="dbias_a_out: required"):
            gemm.backward(device(dy), device(a), device(b), trans_a=trans_a, a_preact=device(a_preact), a_act=a_act)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", BACKWARD_KERNELS + ("auto",))
def test_backward_every_kernel_matches_reference(rng, poisoned, dtype, kernel):
    """Each backward kernel by name, and the selector's, into poisoned outputs: bias gradient (BGRAD for the epilogue
    kernel), alpha 1 and not, every transpose, a chained gelu (DGELU_BGRAD for the epilogue kernel where trans_a is
    False). Where cuBLASLt has no algorithm for the fused epilogue, naming that kernel is a ValueError saying so
    (and "auto" runs the next one); plain cuBLASLt, tiled and "auto" run every case."""
    from graph_executor_v2.ops import activations

    device = ge2.device.runtime().DeviceArray.from_numpy
    m, n, k = 32, 24, 48
    for (trans_a, trans_b), alpha in itertools.product(itertools.product((False, True), repeat=2), (1.0, 0.75)):
        a_preact = random_array(rng, (k, m) if trans_a else (m, k), dtype)
        a = activations.apply("gelu", a_preact.astype(np.float64), 0.01).astype(a_preact.dtype)
        b, dy = random_array(rng, (n, k) if trans_b else (k, n), dtype, 0.5), random_array(rng, (m, n), dtype)
        bias = random_array(rng, (n,), dtype)
        out = (poisoned(a.shape, dtype), poisoned(b.shape, dtype), poisoned((n,), dtype))
        dbias_a = poisoned((a.shape[1],), dtype)
        what = f"{kernel} ta={trans_a} tb={trans_b} alpha={alpha}"
        try:
            gemm.backward(device(dy), device(a), device(b), device(bias), alpha=alpha, trans_a=trans_a,
                          trans_b=trans_b, kernel=kernel, out=out, a_preact=device(a_preact), a_act="gelu",
                          dbias_a_out=dbias_a)
        except ValueError as error:
            assert kernel == "cublaslt_epilogue" and "cuBLASLt returned no algorithm" in str(error), (what, error)
            continue
        d_a, d_b, d_bias, _ = gemm.reference_backward(dy, a, b, alpha=alpha, trans_a=trans_a, trans_b=trans_b)
        d_pre = d_a * activations.derivative("gelu", a_preact.astype(np.float64), 0.01)
        # The fused kernel (named, or auto's first choice) runs gelu' in cuBLASLt's DGELU epilogue where trans_a is
        # False; elsewhere GE2's own float32 kernel does.
        slack = dgelu_epilogue_slack(d_a, a_preact) if kernel in ("cublaslt_epilogue", "auto") and not trans_a else 0.0
        assert_close(out[0].numpy(), d_pre, dtype, n, what=f"dA_pre {what}", slack=slack)
        assert_close(out[1].numpy(), d_b, dtype, m, what=f"dB {what}")
        assert_close(out[2].numpy(), d_bias, dtype, m, what=f"dbias {what}")
        assert_close(dbias_a.numpy(), d_pre.sum(axis=0), dtype, n * a.shape[0], what=f"dbias_a {what}",
                     slack=np.sum(slack, axis=0))


@pytest.mark.gpu
def test_backward_auto_takes_the_first_kernel_cublaslt_runs(rng, to_device):
    """On the GPU: plain cuBLASLt and tiled run an ordinary problem, "auto" is the first kernel the native check
    accepts for the call's pointers, and a kernel with no backward is a ValueError naming it."""
    a, b = to_device(random_array(rng, (64, 32), "float16")), to_device(random_array(rng, (32, 48), "float16"))
    dy, bias = to_device(random_array(rng, (64, 48), "float16")), to_device(random_array(rng, (48,), "float16"))
    da, db, dbias = to_device(np.zeros((64, 32), np.float16)), to_device(np.zeros((32, 48), np.float16)), \
        to_device(np.zeros(48, np.float16))
    call = (dy.ptr, a.ptr, b.ptr, 0, 0, da.ptr, db.ptr, dbias.ptr, 0, 64, 48, 32, "float16", False, False, 1.0, 0.0,
            "none", 0.01, False, 0, "none", 0.01, 0)
    native = gemm._native_module()
    reasons = {name: native.backward_unsupported_reason(name, *call) for name in BACKWARD_KERNELS}
    assert reasons["cublaslt_postkernel"] == "" and reasons["tiled"] == "", reasons
    first = next(name for name in BACKWARD_KERNELS if not reasons[name])
    assert gemm._backward_kernel(_backward_problem(), lambda name: reasons[name]) == first
    with pytest.raises(ValueError, match="kernel 'cutlass_sm90' cannot run this problem: cutlass_sm90 has no "
                                         "backward"):
        gemm.backward(dy, a, b, bias, kernel="cutlass_sm90")
