"""ge2_swiglu: SwiGLU for GE2, built out of tree (a worked example of docs/writing-an-op.md in GE2).

Importing it registers the ``swiglu`` and ``swiglu_backward`` OpDefs (graph builders ``g.swiglu``, CPU references,
the grad rule) and their two kernel candidates with GE2's registry."""
from . import swiglu
