"""The roofline of the current GPU, for any GPU: peak FLOP/s per dtype computed from the device's properties, and
the copy bandwidth measured once and cached.

- Compute: SM count x boost clock x the dense multiply-add rate per SM and clock of its architecture
  (``FLOPS_PER_SM_PER_CLOCK``: tensor cores for 16-bit and 8-bit floats, the CUDA cores for strict float32).
- Memory: a device-to-device copy of ``COPY_BYTES`` timed between CUDA events (read + write bytes per second, the
  ceiling a bandwidth-bound kernel can reach), measured on first use and kept in ``roofline.json`` next to the
  autotune cache, one entry per device and CUDA setup. The memory's theoretical bandwidth (2 x memory clock x bus
  width) is kept beside it.
"""
from __future__ import annotations

import json
import os
import tempfile
import warnings
from dataclasses import dataclass

from .autotune import default_cache_path

# Dense FLOPs (2 per multiply-add) per SM per clock, by compute capability; a device takes the entry of the
# highest capability not above its own. Tensor-core rates of the data-center parts (float32 accumulation).
FLOPS_PER_SM_PER_CLOCK = {
    (8, 0): {"float16": 2048, "bfloat16": 2048, "float32": 128},
    (8, 6): {"float16": 1024, "bfloat16": 1024, "float32": 256},
    (8, 9): {"float16": 1024, "bfloat16": 1024, "float32": 256, "float8_e4m3fn": 2048, "float8_e5m2": 2048},
    (9, 0): {"float16": 4096, "bfloat16": 4096, "float32": 256, "float8_e4m3fn": 8192, "float8_e5m2": 8192},
}
COPY_BYTES = 256 << 20  # large enough that the L2 cache does not count
FORMAT = "graph_executor_v2.roofline"


@dataclass(frozen=True)
class Roofline:
    device: str
    flops: dict  # dtype -> FLOP/s
    copy_bytes_per_s: float  # measured device-to-device copy, read + write
    memory_bytes_per_s: float  # theoretical: 2 x memory clock x bus width

    def peak(self, unit: str, dtype: str) -> float | None:
        """The ceiling of a rate in ``unit`` ("TFLOP/s": the dtype's compute peak; "GB/s": the copy bandwidth)."""
        return self.flops.get(dtype) if unit == "TFLOP/s" else self.copy_bytes_per_s


def peak_flops(properties: dict) -> dict:
    """dtype -> FLOP/s of a device from its properties (``_runtime.device_properties``)."""
    capability = tuple(properties["compute_capability"])
    known = [c for c in FLOPS_PER_SM_PER_CLOCK if c <= capability]
    if not known:
        return {}
    rates = FLOPS_PER_SM_PER_CLOCK[max(known)]
    clock_hz = properties["clock_rate_khz"] * 1e3
    return {dtype: properties["sm_count"] * clock_hz * rate for dtype, rate in rates.items()}


def memory_bandwidth(properties: dict) -> float:
    """Theoretical bytes per second: double data rate x memory clock x bus width."""
    return 2.0 * properties["memory_clock_rate_khz"] * 1e3 * properties["memory_bus_width_bits"] / 8


def measure_copy(runtime, device: int, repetitions: int = 10) -> float:
    """Read + write bytes per second of a device-to-device copy of ``COPY_BYTES``: the mean of ``repetitions``
    copies between two events, after a warm-up."""
    source = runtime.DeviceArray.empty([COPY_BYTES], "uint8", device)
    destination = runtime.DeviceArray.empty([COPY_BYTES], "uint8", device)
    stream = runtime.Stream(device)
    copy = lambda: runtime.memcpy_device_to_device(destination.ptr, source.ptr, COPY_BYTES, stream.handle)  # noqa
    copy()
    start, end = runtime.Event(), runtime.Event()
    start.record(stream.handle)
    for _ in range(repetitions):
        copy()
    end.record(stream.handle)
    end.synchronize()
    return 2.0 * COPY_BYTES * repetitions / (start.elapsed_ms(end) * 1e-3)


_MEASURED: dict[str, Roofline] = {}


def roofline_of(properties: dict, setup: str, measure) -> Roofline:
    """The roofline of the device ``properties`` describe: from this process, else from the cache file (key
    ``setup``), else computed and measured (``measure()`` -> copy bytes per second) and stored."""
    known = _MEASURED.get(setup)
    if known is not None:
        return known
    path = default_cache_path().with_name("roofline.json")
    entries = _read(path)
    entry = entries.get(setup)
    if not isinstance(entry, dict) or not isinstance(entry.get("copy_bytes_per_s"), (int, float)):
        entry = {"device": properties["name"], "flops": peak_flops(properties), "copy_bytes_per_s": measure(),
                 "memory_bytes_per_s": memory_bandwidth(properties)}
        entries[setup] = entry
        _write(path, entries)
    roofline = _MEASURED[setup] = Roofline(entry["device"], dict(entry["flops"]), float(entry["copy_bytes_per_s"]),
                                           float(entry["memory_bytes_per_s"]))
    return roofline


def current(runtime, setup: str) -> Roofline:
    """The roofline of the current CUDA device (measured once per device and setup, then read from the cache)."""
    device = runtime.current_device()
    properties = runtime.device_properties(device)
    return roofline_of(properties, setup, lambda: measure_copy(runtime, device))


def _read(path) -> dict:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        warnings.warn(f"graph_executor_v2: ignoring the roofline cache {path}: {error}; it will be rewritten",
                      stacklevel=3)
        return {}
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(document.get("devices"),
                                                                                             dict):
        return {}
    return document["devices"]


def _write(path, entries: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".roofline.", suffix=".tmp", delete=False,
                                         encoding="utf-8") as file:
            json.dump({"format": FORMAT, "devices": entries}, file, indent=1, sort_keys=True)
        os.replace(file.name, path)
    except OSError as error:
        warnings.warn(f"graph_executor_v2: could not write the roofline cache {path}: {error}", stacklevel=3)


__all__ = ["FLOPS_PER_SM_PER_CLOCK", "Roofline", "current", "memory_bandwidth", "peak_flops", "roofline_of"]
