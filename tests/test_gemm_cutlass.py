"""gemm's cutlass_sm90 candidate (CUTLASS 3.x warp-specialized persistent GEMM, sm_90a), pinned by name: every fused
epilogue (the residual before and after the activation) in float16 and bfloat16 against the float64 reference, every
tile configuration forced through GE2_CUTLASS_SM90_TILE on edge shapes, the tile scheduler's swizzles, and what it
declines (with the reason). On a CPU machine: kernels() says whether it was built, and why not; the tile table and
the sweep that writes it agree."""
from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ops import gemm
from graph_executor_v2.testing import assert_close, random_array

DTYPES = ("float16", "bfloat16")
ACTS = ("none", "relu", "gelu", "gelu_erf", "silu")
TILE_TABLE = Path(__file__).resolve().parents[1] / "backends/cuda/ops/gemm/cutlass/tile_table.hpp"
TILE_RULES = TILE_TABLE.parent / "tile_rules.inc"  # the tile tables, as the sweep writes them
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _sweep_module():
    """benchmarks/sweep_cutlass_gemm.py, loaded from its file (benchmarks are scripts, not an installed package)."""
    saved = list(sys.path)  # the sweep imports its harness from benchmarks/, which puts the source tree first
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("sweep_cutlass_gemm", BENCHMARKS / "sweep_cutlass_gemm.py")
        sweep = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sweep)
    finally:
        sys.path[:] = saved
    return sweep


def _header_config_names() -> dict[str, str]:
    """tile_table.hpp's kTileConfigNames: name -> TileConfig enumerator."""
    return dict(re.findall(r'\{"(\w+)", TileConfig::(\w+)\}', TILE_TABLE.read_text()))


def _header_act_none_only() -> tuple[str, ...]:
    """tile_table.hpp's kActNoneOnly, as configuration names."""
    enumerators = re.findall(r"TileConfig::(\w+)", TILE_TABLE.read_text().split("kActNoneOnly[]")[1].split("};")[0])
    names = {enumerator: name for name, enumerator in _header_config_names().items()}
    return tuple(names[enumerator] for enumerator in enumerators)


def _header_without_c() -> tuple[str, ...]:
    """tile_table.hpp's kWithoutC, as configuration names."""
    enumerators = re.findall(r"TileConfig::(\w+)", TILE_TABLE.read_text().split("kWithoutC[]")[1].split("};")[0])
    names = {enumerator: name for name, enumerator in _header_config_names().items()}
    return tuple(names[enumerator] for enumerator in enumerators)


TILE_CONFIGS = tuple(_header_config_names())
ACT_NONE_ONLY = _header_act_none_only()
WITHOUT_C = _header_without_c()
TABLE_NAMES = ("kTileTableFloat16ActNone", "kTileTableFloat16Activation", "kTileTableBFloat16ActNone",
               "kTileTableBFloat16Activation")


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


def test_cublaslt_epilogue_declines_the_residual_after_the_activation():
    reason = _native().unsupported_reason("cublaslt_epilogue", 64, 64, 64, "float16", "gelu", True, True, False, True,
                                          False, False, True)
    assert "residual_after_act" in reason
    # without an activation (or without C) the order does not matter
    for act, has_c in (("none", True), ("gelu", False)):
        assert _native().unsupported_reason("cublaslt_epilogue", 64, 64, 64, "float16", act, True, has_c, False, True,
                                            False, False, True) == ""


# ---------------------------------------------------------------------------------------------------------------
# CPU: the tile table and the sweep that writes it
# ---------------------------------------------------------------------------------------------------------------
def _check_rules(text: str, name: str) -> None:
    """The table ``name`` in ``text``: increasing limits, known enumerators (compiled for every activation in the
    activation tables), swizzles of 1, 2, 4 or 8, raster orders, the last rule matching everything."""
    rules = re.findall(r"\{(\w+), \{TileConfig::(\w+), (\d+), Raster::(\w+)\}\}",
                       text.split(f"{name}[]")[1].split("};")[0])
    assert rules and rules[-1][0] == "INT64_MAX"
    limits = [int(limit) for limit, _, _, _ in rules[:-1]]
    assert limits == sorted(limits) and len(set(limits)) == len(limits)
    names = {enumerator: config for config, enumerator in _header_config_names().items()}
    assert all(config in names and swizzle in ("1", "2", "4", "8") and raster in ("Heuristic", "AlongM", "AlongN")
               for _, config, swizzle, raster in rules)
    if name.endswith("Activation"):
        assert not any(names[config] in ACT_NONE_ONLY for _, config, _, _ in rules)


def test_tile_table_names_every_configuration_the_sweep_times():
    enumerators = re.search(r"enum class TileConfig \{([^}]*)\}",
                            (TILE_TABLE.parent / "cutlass_sm90.hpp").read_text()).group(1)
    assert set(_header_config_names().values()) == {e.strip() for e in enumerators.split(",")}
    assert _sweep_module().CONFIGS == _header_config_names()
    assert _sweep_module().ACT_NONE_ONLY == ACT_NONE_ONLY
    assert tuple(_sweep_module().TABLE_NAMES.values()) == TABLE_NAMES
    assert '#include "tile_rules.inc"' in TILE_TABLE.read_text()
    assert _sweep_module().TABLE == TILE_RULES  # the sweep writes the file the candidate compiles
    for name in TABLE_NAMES:
        assert f"first_matching_rule({name}, tiles)" in TILE_TABLE.read_text()
        _check_rules(TILE_RULES.read_text(), name)


def _defined_act_none_launchers() -> set[tuple[str, str]]:
    """(dtype, TileConfig enumerator) of every launch_<dtype>_none_<config> the candidate's gemm_sm90_none_*.cu
    translation units define, written out or through gemm_sm90.cuh's GE2_CUTLASS_SM90_PER_DTYPE."""
    text = "".join(path.read_text() for path in TILE_TABLE.parent.glob("gemm_sm90_none_*.cu"))
    return set(re.findall(r"void launch_(b?f16)_none_(\w+)\(const Problem", text)) | set(
        re.findall(r"^GE2_CUTLASS_SM90_PER_DTYPE\((b?f16), [\w:]+, (\w+)\)$", text, re.MULTILINE))


def test_act_none_only_configurations_are_compiled_for_both_dtypes():
    """Every act-none-only configuration (the ones without C among them) has a float16 and a bfloat16 launcher,
    declared in cutlass_sm90.hpp and defined in the candidate's translation units, so the bfloat16 tables and
    GE2_CUTLASS_SM90_TILE may pick any of them."""
    assert WITHOUT_C and set(WITHOUT_C) <= set(ACT_NONE_ONLY)
    declared = (TILE_TABLE.parent / "cutlass_sm90.hpp").read_text()
    defined = _defined_act_none_launchers()
    enumerators = _header_config_names()
    for config in ACT_NONE_ONLY:
        for dtype in ("f16", "bf16"):
            assert (dtype, enumerators[config]) in defined, f"{config}: no {dtype} launcher defined"
            assert (f"launch_{dtype}_none_{enumerators[config]}(" in declared
                    or f"GE2_CUTLASS_SM90_NONE_ONLY({enumerators[config]})" in declared), config
    assert "compiled for float16 only" not in (TILE_TABLE.parent / "gemm_sm90.cuh").read_text()


def test_sweep_turns_its_winners_into_table_rules():
    sweep = _sweep_module()
    small, medium, large = "pingpong_64x128x64", "cooperative_128x128x64", "cooperative_128x256x64_cluster2x1"

    def row(tiles, best, swizzle=1, raster="heuristic"):
        times = {config: 2.0 for config in sweep.CONFIGS}
        times[best] = 1.0
        return {"tiles": tiles, "best": best, "swizzle": swizzle, "raster": raster, **times}

    rows = [row(8, small), row(8, small), row(64, small), row(64, medium), row(64, small), row(256, medium),
            row(1024, large, 4, "n"), row(1024, large, 4, "n"), row(1024, medium), row(4096, large, 8),
            row(4096, large, 4, "m")]
    assert sweep.tile_table(rows, "kTileTableFloat16ActNone") == (
        "constexpr TileRule kTileTableFloat16ActNone[] = {\n"
        "    {64, {TileConfig::Pingpong64x128, 1, Raster::Heuristic}},\n"
        "    {256, {TileConfig::Cooperative128x128, 1, Raster::Heuristic}},\n"
        "    {INT64_MAX, {TileConfig::Cooperative128x256Cluster2x1, 4, Raster::AlongN}},\n"
        "};")
    env = {"gpu": "NVIDIA H200", "time": "2026-11-29 13:40:00", "cuda": "13.0"}
    shaped = [{**r, "shape": f"{r['tiles']}x1x1", "dtype": dtype, "epilogue": epilogue}
              for r in rows for dtype in ("float16", "bfloat16") for epilogue in ("none", "bias+gelu+residual")]
    written = sweep.table_file(shaped, env)
    assert written.startswith("// Written by benchmarks/sweep_cutlass_gemm.py") and "NVIDIA H200, 2026-11-29" in written
    assert "44 rows (5 shapes" in written
    for name in TABLE_NAMES:
        assert sweep.tile_table(rows, name) in written
        _check_rules(written, name)


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _require_candidate():
    _native()
    if not _built():
        pytest.skip(f"cutlass_sm90 is not built: {_row()['description']}")
    if ge2.device_count() > 0 and "needs an sm_90 GPU" in _reason():
        pytest.skip(_reason())


def _run(rng, m, n, k, dtype, act, with_bias, with_c, alpha=1.25, residual_after_act=False):
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
                          kernel="cutlass_sm90", out=y, residual_after_act=residual_after_act).numpy()
    expected, _ = gemm.reference(a, b, bias, c, act=act, alpha=alpha, beta=beta,
                                 residual_after_act=residual_after_act)
    return result, expected


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
def test_every_epilogue_matches_the_reference(rng, dtype, act):
    _require_candidate()
    for with_bias, with_c, after in itertools.product((False, True), repeat=3):
        y, expected = _run(rng, 136, 264, 200, dtype, act, with_bias, with_c, residual_after_act=after)
        assert_close(y, expected, dtype, 200,
                     what=f"cutlass_sm90 {act} bias={with_bias} residual={with_c} residual_after_act={after}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", TILE_CONFIGS)
def test_every_tile_configuration_on_edge_shapes(rng, monkeypatch, dtype, config):
    _require_candidate()
    monkeypatch.setenv("GE2_CUTLASS_SM90_TILE", config)
    # one row; odd M (a partial cluster of two CTAs); K not a multiple of the 64-deep tile; N not a multiple of the
    # 128- or 256-wide tile; several waves of tiles
    # (the act-none-only configurations: the plain product, with bias, and act none with bias and residual, which
    # the configurations without C run on their sibling with C)
    cases = (("none", True, True, False), ("none", False, False, False), ("none", True, False, False)) \
        if config in ACT_NONE_ONLY else (("gelu", True, True, False), ("silu", True, True, True),
                                         ("none", False, False, False))
    for m, n, k in ((1, 8, 8), (7, 24, 72), (129, 136, 520), (333, 1032, 4104), (1000, 2056, 264)):
        for act, with_bias, with_c, after in cases:
            y, expected = _run(rng, m, n, k, dtype, act, with_bias, with_c, alpha=1.0, residual_after_act=after)
            assert_close(y, expected, dtype, k, what=f"cutlass_sm90 {config} {m}x{n}x{k} {act} bias={with_bias} "
                                                     f"residual={with_c} residual_after_act={after}")


@pytest.mark.gpu
@pytest.mark.parametrize("config", ACT_NONE_ONLY)
def test_act_none_only_configurations_refuse_an_activation(rng, monkeypatch, config):
    _require_candidate()
    monkeypatch.setenv("GE2_CUTLASS_SM90_TILE", config)
    with pytest.raises(ValueError, match="compiled for act none only"):
        _run(rng, 64, 64, 64, "float16", "relu", True, False)


@pytest.mark.gpu
@pytest.mark.parametrize("swizzle", ("2", "4", "8"))
@pytest.mark.parametrize("config", ("cooperative_128x128x64", "cooperative_128x256x64_cluster2x1"))
def test_tile_scheduler_swizzles(rng, monkeypatch, swizzle, config):
    _require_candidate()
    monkeypatch.setenv("GE2_CUTLASS_SM90_TILE", config)
    monkeypatch.setenv("GE2_CUTLASS_SM90_SWIZZLE", swizzle)
    for m, n in ((1160, 2056), (2056, 1160)):  # both raster directions, tiles left over at the strips' ends
        y, expected = _run(rng, m, n, 136, "bfloat16", "gelu", True, True)
        assert_close(y, expected, "bfloat16", 136, what=f"cutlass_sm90 {config} swizzle {swizzle} {m}x{n}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("swizzle", ("1", "2", "8"))
@pytest.mark.parametrize("config", WITHOUT_C)
def test_configurations_without_c_at_every_swizzle(rng, monkeypatch, dtype, swizzle, config):
    """The configurations without C forced in both dtypes at the swizzles the table and the benchmarks use: the plain
    product and with bias on 256 and 520 128x128 tiles (2048^3's and a thin 8192x1024's tile grids, short K), both
    raster directions and a partial cluster; with a residual they run on the sibling with C."""
    _require_candidate()
    monkeypatch.setenv("GE2_CUTLASS_SM90_TILE", config)
    monkeypatch.setenv("GE2_CUTLASS_SM90_SWIZZLE", swizzle)
    for m, n, k in ((2048, 2048, 136), (8320, 1024, 72), (1160, 2056, 200), (129, 2056, 264)):
        for with_bias, with_c in ((False, False), (True, False), (True, True)):
            y, expected = _run(rng, m, n, k, dtype, "none", with_bias, with_c, alpha=1.0)
            assert_close(y, expected, dtype, k, what=f"cutlass_sm90 {config} swizzle {swizzle} {m}x{n}x{k} "
                                                     f"bias={with_bias} residual={with_c}")


@pytest.mark.gpu
@pytest.mark.parametrize("raster", ("m", "n"))
@pytest.mark.parametrize("config", ("cooperative_128x128x64", "cooperative_128x256x64_cluster2x1"))
def test_tile_scheduler_raster_orders(rng, monkeypatch, raster, config):
    _require_candidate()
    monkeypatch.setenv("GE2_CUTLASS_SM90_TILE", config)
    monkeypatch.setenv("GE2_CUTLASS_SM90_SWIZZLE", "2")
    monkeypatch.setenv("GE2_CUTLASS_SM90_RASTER", raster)
    for m, n in ((1160, 2056), (2056, 1160)):
        y, expected = _run(rng, m, n, 136, "float16", "gelu", True, True)
        assert_close(y, expected, "float16", 136, what=f"cutlass_sm90 {config} raster {raster} {m}x{n}")


@pytest.mark.gpu
def test_repeated_problems_reuse_parameters_only_when_nothing_changed(rng):
    """Calls on the same buffers reuse the kernel's stored parameters: new data, another alpha or beta, another
    bias or residual buffer, another output or the residual's order each give the right answer."""
    _require_candidate()
    runtime = ge2.device.runtime()
    m, n, k = 200, 264, 136
    host = {name: random_array(rng, shape, "float16", 1.0 / np.sqrt(k) if name == "a" else 1.0)
            for name, shape in (("a", (m, k)), ("b", (k, n)), ("bias", (n,)), ("bias2", (n,)), ("c", (m, n)))}
    dev = {name: runtime.DeviceArray.from_numpy(value) for name, value in host.items()}
    outputs = [runtime.DeviceArray.empty([m, n], "float16") for _ in range(2)]
    # (bias, alpha, beta, residual_after_act, output): each call changes one thing, the second only the data
    calls = [("bias", 1.0, 1.0, False, 0), ("bias", 1.0, 1.0, False, 0), ("bias", 0.5, 1.0, False, 0),
             ("bias", 0.5, 2.0, False, 0), ("bias2", 0.5, 2.0, False, 0), ("bias2", 0.5, 2.0, True, 0),
             ("bias2", 0.5, 2.0, True, 1), (None, 0.5, 2.0, True, 1)]
    for index, (bias, alpha, beta, after, out) in enumerate(calls):
        if index == 1:  # new data in the same buffers
            host["a"] = random_array(rng, (m, k), "float16", 1.0 / np.sqrt(k))
            dev["a"].copy_from_numpy(host["a"])
        y = outputs[out]
        y.poison()
        result = gemm.forward(dev["a"], dev["b"], None if bias is None else dev[bias], dev["c"], act="gelu",
                              alpha=alpha, beta=beta, kernel="cutlass_sm90", out=y, residual_after_act=after).numpy()
        expected, _ = gemm.reference(host["a"], host["b"], None if bias is None else host[bias], host["c"], act="gelu",
                                     alpha=alpha, beta=beta, residual_after_act=after)
        assert_close(result, expected, "float16", k, what=f"cutlass_sm90 call {index} ({bias}, alpha {alpha}, beta "
                                                          f"{beta}, after {after}, out {out})")


@pytest.mark.gpu
def test_bad_tile_or_swizzle_settings_are_refused(rng, monkeypatch):
    _require_candidate()
    monkeypatch.setenv("GE2_CUTLASS_SM90_TILE", "cooperative_64x64x64")
    with pytest.raises(ValueError, match="GE2_CUTLASS_SM90_TILE: expected one of pingpong_64x128x64, .*got "
                                         "'cooperative_64x64x64'"):
        _run(rng, 64, 64, 64, "float16", "none", False, False)
    monkeypatch.setenv("GE2_CUTLASS_SM90_TILE", "cooperative_128x128x64")
    monkeypatch.setenv("GE2_CUTLASS_SM90_SWIZZLE", "3")
    with pytest.raises(ValueError, match="GE2_CUTLASS_SM90_SWIZZLE: expected 1, 2, 4 or 8, got '3'"):
        _run(rng, 64, 64, 64, "float16", "none", False, False)
    monkeypatch.setenv("GE2_CUTLASS_SM90_SWIZZLE", "2")
    monkeypatch.setenv("GE2_CUTLASS_SM90_RASTER", "diagonal")
    with pytest.raises(ValueError, match="GE2_CUTLASS_SM90_RASTER: expected heuristic, m or n, got 'diagonal'"):
        _run(rng, 64, 64, 64, "float16", "none", False, False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m, n, k",
    # K not a multiple of the 64-deep tile, odd M, one row, N below one tile; the table's rules in turn (up to 131,
    # up to 511 and from 512 128x128 output tiles)
    [(1, 8, 8), (7, 16, 72), (129, 136, 520), (33, 1032, 4104), (1000, 1000, 1000), (2048, 2048, 2048),
     (4095, 2056, 200)],
)
def test_edge_shapes(rng, dtype, m, n, k):
    _require_candidate()
    y, expected = _run(rng, m, n, k, dtype, "gelu", True, True, alpha=1.0)
    assert_close(y, expected, dtype, k, what=f"cutlass_sm90 {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n, k", [(2048, 2048, 136), (3000, 4200, 72)])
def test_plain_table_rules_without_c_give_way_to_a_residual(rng, dtype, m, n, k):
    """The float16 act-none table picks a configuration without C at 193-256 and from 769 128x128 tiles (256 and 792
    here); a problem with a residual takes the activations' rule there."""
    _require_candidate()
    for with_bias, with_c in ((False, False), (True, False), (True, True)):
        y, expected = _run(rng, m, n, k, dtype, "none", with_bias, with_c, alpha=1.0)
        assert_close(y, expected, dtype, k, what=f"cutlass_sm90 {m}x{n}x{k} bias={with_bias} residual={with_c}")


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


@pytest.mark.gpu
@pytest.mark.parametrize("config", TILE_CONFIGS)
@pytest.mark.parametrize("operand", ("a", "b", "c", "bias"))
def test_misaligned_pointers_are_refused_for_every_configuration(rng, monkeypatch, config, operand):
    _require_candidate()
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("GE2_CUTLASS_SM90_TILE", config)
    shapes = {"a": (64, 72), "b": (72, 40), "c": (64, 40), "bias": (40,)}
    tensors = {}
    for name, shape in shapes.items():
        storage = torch.randn(int(np.prod(shape)) + 1, device="cuda", dtype=torch.float16)
        start = 1 if name == operand else 0  # a 2-byte offset: not 16-byte aligned
        tensors[name] = storage[start:start + int(np.prod(shape))].view(shape)
    with pytest.raises(ValueError, match="kernel: 'cutlass_sm90' cannot run this problem: .*16-byte aligned"):
        gemm.forward(tensors["a"], tensors["b"], tensors["bias"], tensors["c"], act="gelu", beta=1.0,
                     kernel="cutlass_sm90")
