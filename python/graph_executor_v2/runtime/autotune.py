"""The autotune cache: the fastest candidate per problem, persisted across processes.

One JSON Lines journal in the user cache directory (``$GE2_CACHE_DIR``, else ``$XDG_CACHE_HOME/graph_executor_v2``,
else ``~/.cache/graph_executor_v2``): a header line, then one line per timed problem with its machine setup (GPU
name, CUDA runtime and cuBLASLt versions, so a driver or library upgrade re-tunes instead of trusting old timings),
the winner, every candidate's milliseconds and the wall seconds the timing took (prepares included).

A store appends its line with one write to the file opened for appending, so processes sharing the file (the GPU
test suite's parallel files, the zoo beside it) never overwrite each other's entries, and a store costs the same
with ten entries as with ten thousand. (The previous format, one JSON document rewritten whole on every store,
made each new entry cost a parse and a rewrite of everything before it.) The executors of one process share one
reader per file, which reads only what was appended since its last read: on a lookup miss, so that what another
executor or process timed meanwhile is used, not timed again.

A corrupt, unreadable or stale header, or a line that is not an entry, is ignored with a warning, and the next
store rewrites the file from the good entries (a temporary file and an atomic rename); a failed write only warns,
and the entry stays in memory. A line cut short by a writer that has not finished is left for the next read.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import warnings
from pathlib import Path

from ..codegen.compiler import user_cache_directory

FORMAT = "graph_executor_v2.autotune"
VERSION = 2
HEADER_FIELDS = {"format": FORMAT, "version": VERSION}
HEADER = json.dumps(HEADER_FIELDS) + "\n"


def default_cache_path() -> Path:
    return user_cache_directory() / "autotune.jsonl"


class _Journal:
    """What one process knows of one journal file: the entries read or stored so far, and how far it has read."""

    def __init__(self, path: Path):
        self.path = path
        self.sections: dict[str, dict[str, dict]] = {}  # setup -> problem -> {"winner", "times_ms", "seconds"}
        self.offset = 0  # bytes of the file read so far (whole lines only)
        self.identity = None  # (device, inode) of the file read: a replaced file is read again from the start
        self.rewrite = False  # a bad header or line was found: the next store rewrites the file
        self.lock = threading.Lock()

    def refresh(self, quiet: bool) -> None:
        """Reads what was appended since the last read (all of it when the file was replaced or truncated)."""
        try:
            with open(self.path, "rb") as file:
                status = os.fstat(file.fileno())
                identity = (status.st_dev, status.st_ino)
                if identity != self.identity or status.st_size < self.offset:
                    self.identity, self.offset, self.rewrite = identity, 0, False
                if status.st_size == self.offset:
                    return
                file.seek(self.offset)
                content = file.read()
        except FileNotFoundError:
            return
        except OSError as error:
            self._ignore(f"unreadable ({error})", quiet)
            return
        complete = content.rfind(b"\n") + 1  # a line not ended yet is a write in progress: read it next time
        first_line = self.offset == 0
        if first_line and complete == 0:
            complete = len(content)  # the header is written whole (_create): a file with no line end has none
        for line in content[:complete].splitlines():
            why = self._header_problem(line) if first_line else self._add(line)
            if why:
                self._ignore(why, quiet)
                if first_line:
                    break  # nothing after a bad header is trusted
            first_line = False
        self.offset += complete

    @staticmethod
    def _header_problem(line: bytes) -> str | None:
        try:
            header = json.loads(line.decode("utf-8"))
        except ValueError as error:  # bad UTF-8 or bad JSON
            return f"corrupt ({error})"
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            return "not an autotune cache"
        if header.get("version") != VERSION:
            return f"stale (version {header.get('version')!r}, expected {VERSION})"
        return None

    def _add(self, line: bytes) -> str | None:
        try:
            entry = json.loads(line.decode("utf-8"))
        except ValueError as error:
            return f"corrupt line ({error})"
        if entry == HEADER_FIELDS:
            return None  # two processes created the file at once: each wrote the header
        if not (isinstance(entry, dict) and isinstance(entry.get("setup"), str)
                and isinstance(entry.get("problem"), str) and isinstance(entry.get("winner"), str)
                and isinstance(entry.get("times_ms"), dict)):
            return f"malformed entry {line[:80]!r}"
        self.sections.setdefault(entry["setup"], {})[entry["problem"]] = {
            "winner": entry["winner"], "times_ms": entry["times_ms"], "seconds": entry.get("seconds")}
        return None

    def append(self, setup: str, problem: str, entry: dict) -> None:
        self.sections.setdefault(setup, {})[problem] = entry
        line = json.dumps({"setup": setup, "problem": problem, **entry}, sort_keys=True) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.rewrite:
                self._rewrite()
                return
            if not self.path.exists():
                self._create()
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(descriptor, line.encode("utf-8"))  # one write of one line: appends never interleave
            finally:
                os.close(descriptor)
        except OSError as error:
            warnings.warn(f"graph_executor_v2: could not write the autotune cache {self.path}: {error}", stacklevel=4)

    def _create(self) -> None:
        """The file with its header, created atomically (a hard link fails if another process created it first)."""
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, prefix=".autotune.", suffix=".tmp",
                                         delete=False, encoding="utf-8") as file:
            file.write(HEADER)
        try:
            os.link(file.name, self.path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: a rename, which a racing creator may undo (no harm)
            if not self.path.exists():
                os.replace(file.name, self.path)
                return
        os.unlink(file.name)

    def _rewrite(self) -> None:
        """The file replaced by the header and every good entry known here."""
        lines = [HEADER] + [json.dumps({"setup": setup, "problem": problem, **entry}, sort_keys=True) + "\n"
                            for setup, problems in self.sections.items() for problem, entry in problems.items()]
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, prefix=".autotune.", suffix=".tmp",
                                         delete=False, encoding="utf-8") as file:
            file.writelines(lines)
        os.replace(file.name, self.path)
        status = os.stat(self.path)
        self.identity, self.offset, self.rewrite = (status.st_dev, status.st_ino), status.st_size, False

    def _ignore(self, why: str, quiet: bool) -> None:
        self.rewrite = True
        if not quiet:
            warnings.warn(f"graph_executor_v2: ignoring the autotune cache {self.path}: {why}; it will be rewritten",
                          stacklevel=5)


_JOURNALS: dict[Path, _Journal] = {}  # one reader per file and process: executors share what was read
_JOURNALS_LOCK = threading.Lock()


class AutotuneCache:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path if path is not None else default_cache_path()).absolute()
        with _JOURNALS_LOCK:
            self._journal = _JOURNALS.setdefault(self.path, _Journal(self.path))
        with self._journal.lock:
            self._journal.refresh(quiet=False)

    def lookup(self, setup: str, problem: str) -> str | None:
        """The winner stored for ``problem``; a miss reads what was appended to the file since, first, so that what
        another executor or process timed meanwhile is used, not timed again (two executors of one graph then agree
        on every kernel)."""
        journal = self._journal
        with journal.lock:
            if problem not in journal.sections.get(setup, {}):
                journal.refresh(quiet=True)
            entry = journal.sections.get(setup, {}).get(problem)
        return entry["winner"] if entry else None

    def times(self, setup: str, problem: str) -> dict[str, float]:
        """The milliseconds each candidate took when ``problem`` was timed (empty when it never was)."""
        entry = self._journal.sections.get(setup, {}).get(problem)
        return dict(entry["times_ms"]) if entry else {}

    def store(self, setup: str, problem: str, winner: str, times_ms: dict[str, float],
              seconds: float | None = None) -> None:
        """Keeps ``winner`` and the candidates' ``times_ms`` for ``problem``; ``seconds``: the wall time the timing
        took, prepares included (what a plan build spent on it)."""
        with self._journal.lock:
            self._journal.append(setup, problem, {"winner": winner, "times_ms": dict(times_ms), "seconds": seconds})

    def entries(self) -> list[dict]:
        """Every entry known here, read to the end of the file: {"setup", "problem", "winner", "times_ms",
        "seconds"} (what a test run or a benchmark spent on timing, by problem)."""
        journal = self._journal
        with journal.lock:
            journal.refresh(quiet=True)
            return [{"setup": setup, "problem": problem, **entry}
                    for setup, problems in journal.sections.items() for problem, entry in problems.items()]


def seconds_by_op(entries: list[dict]) -> dict[str, list[float]]:
    """op -> the seconds each of its timed problems took (entries with their seconds), costliest op first."""
    by_op: dict[str, list[float]] = {}
    for entry in entries:
        if entry.get("seconds") is not None:
            by_op.setdefault(entry["problem"].split("(", 1)[0], []).append(entry["seconds"])
    return dict(sorted(by_op.items(), key=lambda item: -sum(item[1])))


def summarize(entries: list[dict], top: int = 10) -> str:
    """What timing cost, from ``AutotuneCache.entries()``: the problems timed and their wall seconds (prepares
    included), per op, and the ``top`` costliest problems (scripts/gpu_test_files.sh writes it for a test run)."""
    timed = [entry for entry in entries if entry.get("seconds") is not None]
    total = sum(entry["seconds"] for entry in timed)
    lines = [f"{len(entries)} problem(s) in the cache, {len(timed)} with their timing's seconds: {total:.1f} s"]
    for op, seconds in seconds_by_op(entries).items():
        lines.append(f"  {op}: {len(seconds)} problem(s), {sum(seconds):.2f} s, at most {max(seconds):.3f} s")
    lines.append(f"costliest {min(top, len(timed))}:")
    for entry in sorted(timed, key=lambda entry: -entry["seconds"])[:top]:
        lines.append(f"  {entry['seconds']:.3f} s  {entry['problem'][:150]}  ({len(entry['times_ms'])} candidates, "
                     f"{entry['winner']} won)")
    return "\n".join(lines)
