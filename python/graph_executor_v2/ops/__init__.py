"""GE2 ops. Importing this package registers every op definition in ``OPS``; native modules load on first use.

Each op module with a native kernel has the same face: ``forward_numpy`` (host in, host out), ``forward`` (device
arrays: DeviceArray, torch, CuPy), ``backward_numpy``, ``backward`` and ``kernels()``. ``matmul`` is a graph-level op
only: canonicalization turns it into ``gemm``, whose face and kernels it uses. Other packages add ops (``register``)
and kernel candidates for existing ops (``add_candidate``): see docs/writing-an-op.md.
"""
from ._base import OPS, Attr, Candidate, Input, OpDef, Problem, add_candidate, register, remove_candidate
from . import elementwise, gemm, matmul
from . import concat, slice, transpose
from . import layernorm, rmsnorm
from . import cross_entropy, dropout, embedding
from . import reduce, softmax

__all__ = ["OPS", "Attr", "Candidate", "Input", "OpDef", "Problem", "add_candidate", "register", "remove_candidate",
           "elementwise", "gemm", "matmul", "concat", "slice", "transpose", "layernorm", "rmsnorm", "cross_entropy",
           "dropout", "embedding", "reduce", "softmax"]
