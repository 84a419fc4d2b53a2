"""Real data that every Python installation has, so examples and tests train on it without a download.

``python_source_corpus()``: the bytes of a fixed, sorted list of the standard library's own ``Lib/*.py`` modules,
concatenated; the last ``validation_fraction`` held out. A byte-level language model reads it with a vocabulary
of 256. ``unigram_entropy`` is the loss of the best model that ignores context: what a model must beat to have
learnt anything.
"""
from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Modules that are single files in Lib/ from Python 3.10 to 3.13, sorted; a missing one is skipped (and listed).
STDLIB_MODULES = (
    "argparse", "ast", "base64", "bisect", "calendar", "cmd", "codecs", "colorsys", "configparser", "contextlib",
    "copy", "csv", "dataclasses", "datetime", "difflib", "dis", "doctest", "enum", "fnmatch", "fractions",
    "functools", "getopt", "gettext", "glob", "gzip", "heapq", "hmac", "inspect", "ipaddress", "keyword",
    "linecache", "locale", "mailbox", "mimetypes", "numbers", "operator", "optparse", "os", "pdb", "pickle",
    "pickletools", "platform", "plistlib", "pprint", "profile", "pstats", "queue", "quopri", "random", "reprlib",
    "sched", "secrets", "selectors", "shlex", "shutil", "socket", "socketserver", "statistics", "string", "struct",
    "subprocess", "symtable", "tabnanny", "tarfile", "tempfile", "textwrap", "threading", "timeit", "token",
    "tokenize", "trace", "traceback", "types", "typing", "uuid", "warnings", "wave", "weakref",
)


@dataclass(frozen=True)
class ByteCorpus:
    train: np.ndarray  # uint8
    validation: np.ndarray  # uint8
    files: tuple[str, ...]  # the files read, in order
    missing: tuple[str, ...]  # modules of STDLIB_MODULES this installation does not have as Lib/<name>.py


def python_source_corpus(validation_fraction: float = 0.1, max_bytes: int | None = None) -> ByteCorpus:
    """The standard library's sources as bytes; ``max_bytes`` keeps only the first bytes (tiny configs, tests)."""
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction: expected a fraction in (0, 1), got {validation_fraction!r}")
    library = Path(sysconfig.get_paths()["stdlib"])
    files, missing, parts = [], [], []
    for module in STDLIB_MODULES:
        path = library / f"{module}.py"
        if path.is_file():
            files.append(path.name)
            parts.append(path.read_bytes())
        else:
            missing.append(module)
    if not parts:
        raise RuntimeError(f"no standard library sources found under {library}")
    data = np.frombuffer(b"".join(parts), dtype=np.uint8)
    if max_bytes is not None:
        if max_bytes < 2:
            raise ValueError(f"max_bytes: expected at least 2, got {max_bytes}")
        data = data[:max_bytes]
    split = int(len(data) * (1.0 - validation_fraction))
    return ByteCorpus(data[:split].copy(), data[split:].copy(), tuple(files), tuple(missing))


def unigram_entropy(data: np.ndarray) -> float:
    """The entropy of the byte frequencies, in nats per byte (the cross-entropy of the best context-free model)."""
    counts = np.bincount(np.asarray(data, dtype=np.uint8), minlength=256).astype(np.float64)
    probabilities = counts[counts > 0] / counts.sum()
    return float(-(probabilities * np.log(probabilities)).sum())


def random_windows(data: np.ndarray, batch: int, context: int, rng: np.random.Generator):
    """``batch`` random windows of ``context + 1`` bytes: (inputs, next-byte targets), both int64 [batch, context]."""
    if len(data) <= context:
        raise ValueError(f"context: {context} needs more than {context} bytes of data, got {len(data)}")
    starts = rng.integers(0, len(data) - context, size=batch)
    windows = np.stack([data[s:s + context + 1] for s in starts]).astype(np.int64)
    return windows[:, :-1], windows[:, 1:]
