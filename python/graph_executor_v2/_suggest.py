"""'Did you mean' for a name that is not known: the closest known names (difflib), or a pointer to the list."""
from __future__ import annotations

import difflib
from typing import Iterable


def did_you_mean(name: str, known: Iterable[str], listed_by: str) -> str:
    """"did you mean 'relu'?" (up to three close matches), else where the ``known`` names are listed."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(f"'{match}'" for match in close) + "?"
    return f"no close match among the {len(known)} known names ({listed_by} lists them)"
