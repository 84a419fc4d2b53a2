"""Compiling generated sources with NVRTC, through a cubin cache on disk, and loading them.

- ``compile_cubin(source, name, arch, group)``: the cubin for ``sm_<arch>``, from the cache when it has it. The cache
  is a directory ``kernels/`` next to the autotune cache (``$GE2_CACHE_DIR``, else the user cache directory), one
  file per kernel named by the SHA-256 of the source, the architecture, the NVRTC version and the options. A file is
  written to a temporary name and renamed into place, so two processes compiling the same kernel both succeed and a
  reader never sees half a file. Each file starts with a header holding the digest of its cubin: a corrupt or
  truncated file is recompiled, with a warning, and rewritten.
- An NVRTC error is a RuntimeError naming the group, with NVRTC's log, the failing source line and which NVRTC
  (version and library file) compiled it; explain() names it beside each cold compile too.
- NVRTC's own cache (12.9+, the driver's compute cache) is off: the native compile always runs ptxas and returns
  its whole log (``--ptxas-options=-v`` reports included); GE2's cache below is the only one.
- ``GE2_DUMP_KERNELS=DIR`` writes every generated source to ``DIR/<kernel>.cu``.
- ``availability()``: None when kernels can be generated, else why not (no ``_codegen`` module, no NVRTC): the
  ``generated`` candidates then report it and the hand-written kernels run.
- ``STATS`` records, per kernel, the cold compile time or the cache-hit time, for ``ExecutorV2.explain()``,
  ``ExecutorV2.profile()`` and the benchmark.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from .. import _native

MAGIC = b"GE2CUBIN1\n"
OPTIONS = ("-lineinfo",)  # exact math: no --use_fast_math; line info for profilers and compute-sanitizer


@dataclass
class CompileRecord:
    kernel: str
    group: str
    seconds: float
    cache_hit: bool
    cold_seconds: float | None = None  # a cache hit of a kernel this process compiled earlier: that compile's time


def describe_build(record: CompileRecord) -> str:
    """``compiled cold in 412.0 ms by NVRTC 13.0 (<path of the libnvrtc loaded>)`` or ``cache hit in 0.3 ms
    (compiled cold in 412.0 ms earlier)``."""
    if not record.cache_hit:
        return f"compiled cold in {record.seconds * 1e3:.1f} ms by {nvrtc_description()}"
    earlier = "" if record.cold_seconds is None else f" (compiled cold in {record.cold_seconds * 1e3:.1f} ms earlier)"
    return f"cache hit in {record.seconds * 1e3:.1f} ms{earlier}"


class CompileStats:
    """Compile and cache-hit times of the kernels this process prepared, and which launch runs which kernel (so a
    plan's explain() and profile() can say what each generated node cost to build)."""

    def __init__(self):
        self.records: list[CompileRecord] = []
        self._by_launch: dict[int, CompileRecord] = {}

    def add(self, record: CompileRecord) -> None:
        self.records.append(record)

    def attach(self, launch, record: CompileRecord) -> None:
        self._by_launch[id(launch)] = record  # every generated launch is attached when made: no stale id is read

    def of_launch(self, launch) -> CompileRecord | None:
        return self._by_launch.get(id(launch))

    def clear(self) -> None:
        self.records.clear()
        self._by_launch.clear()


STATS = CompileStats()


def _native_module():
    """The native ``_codegen`` module; where the toolkit's NVRTC is missing, the PyPI ``nvidia-cuda-nvrtc`` wheel's
    library is loaded first (the module links ``libnvrtc.so.<major>``, which the loader then finds in memory)."""
    try:
        return _native.load("_codegen")
    except ImportError as error:
        if "nvrtc" not in str(error) or not _preload_wheel_nvrtc():
            raise
    return _native.load("_codegen")


def _preload_wheel_nvrtc() -> bool:
    import ctypes
    import importlib.util

    for package in ("nvidia.cu13", "nvidia.cuda_nvrtc"):
        try:
            spec = importlib.util.find_spec(package)
        except ImportError:
            continue
        for directory in (spec.submodule_search_locations or []) if spec else []:
            for library in sorted(Path(directory, "lib").glob("libnvrtc.so*")):  # not libnvrtc-builtins
                try:
                    ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
                    return True
                except OSError:
                    continue
    return False


def availability() -> str | None:
    """None when generated kernels can be compiled here; else the reason."""
    try:
        _native_module().nvrtc_version()
    except (ImportError, RuntimeError) as error:
        return f"NVRTC is not available: {error}"
    return None


def nvrtc_version() -> tuple[int, int]:
    return tuple(_native_module().nvrtc_version())


def nvrtc_description() -> str:
    """``NVRTC 13.0 (<path of the libnvrtc loaded>)``: the version and the library file loaded at run time
    (the toolkit's, or the PyPI wheel's)."""
    native = _native_module()
    library = native.nvrtc_library() or "library file unknown"
    return "NVRTC %d.%d (%s)" % (*native.nvrtc_version(), library)


def user_cache_directory() -> Path:
    """GE2's cache directory: ``$GE2_CACHE_DIR``, else ``$XDG_CACHE_HOME/graph_executor_v2``, else
    ``~/.cache/graph_executor_v2`` (the kernel cache here, the autotune cache in runtime/autotune.py)."""
    directory = os.environ.get("GE2_CACHE_DIR")
    if not directory:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        directory = os.path.join(base, "graph_executor_v2")
    return Path(directory)


def cache_directory() -> Path:
    return user_cache_directory() / "kernels"


def cache_key(source: str, arch: int) -> str:
    digest = hashlib.sha256()
    for part in (source, f"sm_{arch}", "nvrtc %d.%d" % nvrtc_version(), " ".join(OPTIONS)):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _read_cached(path: Path) -> bytes | None:
    """The cubin in ``path``; None when there is no file; warns and returns None when it is corrupt."""
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        warnings.warn(f"graph_executor_v2: unreadable kernel cache file {path} ({error}); recompiling", stacklevel=3)
        return None
    header_size = len(MAGIC) + 64 + 1
    if content.startswith(MAGIC) and len(content) > header_size:
        digest, cubin = content[len(MAGIC):header_size - 1], content[header_size:]
        if hashlib.sha256(cubin).hexdigest().encode() == digest:
            return cubin
    warnings.warn(f"graph_executor_v2: corrupt kernel cache file {path}; recompiling and rewriting it", stacklevel=3)
    return None


def _write_cached(path: Path, cubin: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=path.parent, prefix=".kernel.", suffix=".tmp",
                                         delete=False) as file:
            file.write(MAGIC + hashlib.sha256(cubin).hexdigest().encode() + b"\n" + cubin)
        os.replace(file.name, path)
    except OSError as error:
        warnings.warn(f"graph_executor_v2: could not write the kernel cache file {path}: {error}", stacklevel=3)


def _dump(name: str, source: str) -> None:
    directory = os.environ.get("GE2_DUMP_KERNELS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        Path(directory, f"{name}.cu").write_text(source, encoding="utf-8")


def compile_error(group: str, name: str, source: str, log: str) -> RuntimeError:
    """The RuntimeError for NVRTC's failure on ``source``: the group, the log and the source line it points at."""
    lines = source.splitlines()
    quoted = []
    for number in sorted({int(n) for n in re.findall(rf"{re.escape(name)}\.cu\((\d+)\)", log)}):
        if 1 <= number <= len(lines):
            quoted.append(f"  line {number}: {lines[number - 1].strip()}")
    where = "\n".join(quoted) or "  (NVRTC named no source line)"
    return RuntimeError(f"generated kernel for {group}: {nvrtc_description()} could not compile {name}.cu:\n"
                        f"{log.strip()}\nfailing source line(s):\n{where}")


def compile_cubin(source: str, name: str, arch: int, group: str) -> bytes:
    """The cubin of ``source`` (kernel ``name``) for ``sm_<arch>``, from the disk cache or NVRTC."""
    _dump(name, source)
    start = time.perf_counter()
    path = cache_directory() / f"{cache_key(source, arch)}.cubin"
    cubin = _read_cached(path)
    if cubin is not None:
        cold = next((r.seconds for r in reversed(STATS.records) if r.kernel == name and not r.cache_hit), None)
        STATS.add(CompileRecord(name, group, time.perf_counter() - start, True, cold))
        return cubin
    try:
        cubin, _ = _native_module().compile(source, f"{name}.cu", arch, list(OPTIONS))
    except RuntimeError as error:
        raise compile_error(group, name, source, str(error)) from None
    _write_cached(path, cubin)
    STATS.add(CompileRecord(name, group, time.perf_counter() - start, False))
    return cubin


def load_kernel(source: str, name: str, arch: int, group: str):
    """(the loaded kernel (``_codegen.Kernel``), its CompileRecord): compiled or from the cache, then loaded."""
    cubin = compile_cubin(source, name, arch, group)
    return _native_module().Kernel(cubin, name), STATS.records[-1]
