"""gemm's cutlass_sm90 candidate (CUTLASS 3.x warp-specialized persistent GEMM, sm_90a), pinned by name: every fused
epilogue in float16 and bfloat16 against the float64 reference, edge shapes, and what it declines (with the reason).
On a CPU machine: kernels() says whether it was built, and why not."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ops import gemm
from graph_executor_v2.testing import assert_close, random_array

DTYPES = ("float16", "bfloat16")
ACTS = ("none", "relu", "gelu", "gelu_erf", "silu")


def _native():
    if not ge2._native.is_built("_ops_gemm"):
        pytest.skip("_ops_gemm is not built")
    return gemm._native_module()


def _row():
    return next(k for k in gemm.kernels() if k["name"] == "cutlass_sm90")


def _built() -> bool:
    return "NOT BUILT" not in _row()["description"]


def _reason(m=256, n=256, k=256, dtype="float16", act="none", has_bias=True, has_c=True, save_preact=False,
            aligned=True, trans_a=False, trans_b=False):
    return _native().unsupported_reason("cutlass_sm90", m, n, k, dtype, act, has_bias, has_c, save_preact, aligned,
                                        trans_a, trans_b)


# ---------------------------------------------------------------------------------------------------------------
# CPU: the kernels() row and the reasons it declines
# ---------------------------------------------------------------------------------------------------------------
def test_kernels_row_says_built_or_not_built_with_the_reason():
    _native()
    row = _row()
    assert row["constraints"]
    if _built():
        assert "TMA" in row["description"] and "epilogue visitor tree" in row["description"]
    else:
        assert "NOT BUILT (" in row["description"]
        assert "CUTLASS" in row["description"] or "GE2_CUTLASS" in row["description"]
        assert _reason().startswith("NOT BUILT: ")


@pytest.mark.parametrize(
    "kwargs, match",
    [({"dtype": "float32"}, "float16 or bfloat16 only, got float32"),
     ({"trans_a": True}, "trans_a and trans_b false"),
     ({"trans_b": True}, "trans_a and trans_b false"),
     ({"act": "leaky_relu"}, "act: none, relu, gelu, gelu_erf or silu only"),
     ({"act": "gelu", "save_preact": True}, "save_preact"),
     ({"n": 100}, "multiples of 8 .*N = 100"),
     ({"k": 1001}, "multiples of 8 .*K = 1001"),
     ({"aligned": False}, "16-byte aligned")],
)
def test_declines_what_it_does_not_support(kwargs, match):
    _native()
    if not _built():
        pytest.skip("cutlass_sm90 is not built: every problem is declined as NOT BUILT (tested above)")
    assert re.search(match, _reason(**kwargs)), _reason(**kwargs)


def test_odd_m_is_not_declined_for_alignment():
    _native()
    if not _built():
        pytest.skip("cutlass_sm90 is not built")
    reason = _reason(m=7)
    assert "multiples of 8" not in reason and "aligned" not in reason


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _require_candidate():
    _native()
    if not _built():
        pytest.skip(f"cutlass_sm90 is not built: {_row()['description']}")
    if ge2.device_count() > 0 and "needs an sm_90 GPU" in _reason():
        pytest.skip(_reason())


def _run(rng, m, n, k, dtype, act, with_bias, with_c, alpha=1.25):
    a = random_array(rng, (m, k), dtype, 1.0 / np.sqrt(k))  # keeps outputs O(1) so activations are exercised
    b = random_array(rng, (k, n), dtype)
    bias = random_array(rng, (n,), dtype) if with_bias else None
    c = random_array(rng, (m, n), dtype) if with_c else None
    beta = 1.0 if with_c else 0.0  # the residual add
    runtime = ge2.device.runtime()
    to_device = lambda x: None if x is None else runtime.DeviceArray.from_numpy(x)  # noqa: E731
    y = runtime.DeviceArray.empty([m, n], dtype)
    y.poison()  # NaN: an element the kernel forgets to write can never pass
    result = gemm.forward(to_device(a), to_device(b), to_device(bias), to_device(c), act=act, alpha=alpha, beta=beta,
                          kernel="cutlass_sm90", out=y).numpy()
    expected, _ = gemm.reference(a, b, bias, c, act=act, alpha=alpha, beta=beta)
    return result, expected


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
def test_every_epilogue_matches_the_reference(rng, dtype, act):
    _require_candidate()
    for with_bias, with_c in itertools.product((False, True), repeat=2):
        y, expected = _run(rng, 136, 264, 200, dtype, act, with_bias, with_c)
        assert_close(y, expected, dtype, 200, what=f"cutlass_sm90 {act} bias={with_bias} residual={with_c}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m, n, k",
    # K not a multiple of the 64-deep tile, odd M, one row, N below one tile, both tile configurations
    [(1, 8, 8), (7, 16, 72), (129, 136, 520), (33, 1032, 4104), (1000, 1000, 1000), (2048, 2048, 2048)],
)
def test_edge_shapes(rng, dtype, m, n, k):
    _require_candidate()
    y, expected = _run(rng, m, n, k, dtype, "gelu", True, True, alpha=1.0)
    assert_close(y, expected, dtype, k, what=f"cutlass_sm90 {m}x{n}x{k}")


@pytest.mark.gpu
def test_misaligned_or_unsupported_problems_are_refused_with_the_reason(rng):
    _require_candidate()
    runtime = ge2.device.runtime()
    a = runtime.DeviceArray.from_numpy(random_array(rng, (16, 24), "float16"))
    b = runtime.DeviceArray.from_numpy(random_array(rng, (24, 12), "float16"))  # N = 12: rows not 16-byte multiples
    with pytest.raises(ValueError, match="kernel: 'cutlass_sm90' cannot run this problem: .*multiples of 8"):
        gemm.forward(a, b, kernel="cutlass_sm90")
    b32 = runtime.DeviceArray.from_numpy(random_array(rng, (24, 16), "float32"))
    a32 = runtime.DeviceArray.from_numpy(random_array(rng, (16, 24), "float32"))
    with pytest.raises(ValueError, match="float16 or bfloat16 only"):
        gemm.forward(a32, b32, kernel="cutlass_sm90")
