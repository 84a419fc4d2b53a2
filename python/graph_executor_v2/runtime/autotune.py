"""The autotune cache: the fastest candidate per problem, persisted across processes.

One JSON file in the user cache directory (``$GE2_CACHE_DIR``, else ``$XDG_CACHE_HOME/graph_executor_v2``, else
``~/.cache/graph_executor_v2``), with a section per machine setup (GPU name, CUDA runtime and cuBLASLt versions),
so a driver or library upgrade re-tunes instead of trusting old timings. A corrupt, unreadable or stale file is
ignored with a warning and rewritten on the next store; a failed write only warns. Writes go through a temporary
file and an atomic rename, merging what other processes stored meanwhile.
"""
from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

from ..codegen.compiler import user_cache_directory

FORMAT = "graph_executor_v2.autotune"
VERSION = 1


def default_cache_path() -> Path:
    return user_cache_directory() / "autotune.json"


class AutotuneCache:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_cache_path()
        self._sections = self._read()

    def lookup(self, setup: str, problem: str) -> str | None:
        """The winner stored for ``problem``; a miss reads the file again first, so that what another executor or
        process timed meanwhile is used, not timed again (two executors of one graph then agree on every kernel)."""
        if problem not in self._sections.get(setup, {}):
            for name, problems in self._read(quiet=True).items():  # merged: an unwritable file keeps what we stored
                self._sections.setdefault(name, {}).update(problems)
        entry = self._sections.get(setup, {}).get(problem)
        return entry.get("winner") if isinstance(entry, dict) else None

    def times(self, setup: str, problem: str) -> dict[str, float]:
        """The milliseconds each candidate took when ``problem`` was timed (empty when it never was)."""
        entry = self._sections.get(setup, {}).get(problem)
        times = entry.get("times_ms") if isinstance(entry, dict) else None
        return dict(times) if isinstance(times, dict) else {}

    def store(self, setup: str, problem: str, winner: str, times_ms: dict[str, float]) -> None:
        sections = self._read(quiet=True)  # keep what other processes stored since we read
        sections.setdefault(setup, {})[problem] = {"winner": winner, "times_ms": times_ms}
        self._sections = sections
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, prefix=".autotune.", suffix=".tmp",
                                             delete=False, encoding="utf-8") as file:
                json.dump({"format": FORMAT, "version": VERSION, "setups": sections}, file, indent=1, sort_keys=True)
            os.replace(file.name, self.path)
        except OSError as error:
            warnings.warn(f"graph_executor_v2: could not write the autotune cache {self.path}: {error}", stacklevel=2)

    def _read(self, quiet: bool = False) -> dict:
        try:
            content = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as error:
            return self._ignore(f"unreadable ({error})", quiet)
        try:
            document = json.loads(content.decode("utf-8"))
        except ValueError as error:  # bad UTF-8 or bad JSON
            return self._ignore(f"corrupt ({error})", quiet)
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            return self._ignore("not an autotune cache", quiet)
        if document.get("version") != VERSION:
            return self._ignore(f"stale (version {document.get('version')!r}, expected {VERSION})", quiet)
        sections = document.get("setups")
        if not isinstance(sections, dict) or not all(isinstance(s, dict) for s in sections.values()):
            return self._ignore("malformed 'setups'", quiet)
        return sections

    def _ignore(self, why: str, quiet: bool) -> dict:
        if not quiet:
            warnings.warn(f"graph_executor_v2: ignoring the autotune cache {self.path}: {why}; it will be rewritten",
                          stacklevel=3)
        return {}
