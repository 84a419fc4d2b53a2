"""GE2 ops. Importing this package registers every op definition in ``OPS``; native modules load on first use.

Each op module with a native kernel has the same face: ``forward_numpy`` (host in, host out), ``forward`` (device
arrays: DeviceArray, torch, CuPy), ``backward_numpy``, ``backward`` and ``kernels()``. ``matmul`` is a graph-level op
only: canonicalization turns it into ``gemm``, whose face and kernels it uses.
"""
from ._base import OPS, Attr, Candidate, Input, OpDef, Problem, register
from . import elementwise, gemm, matmul
from . import concat, slice, transpose
from . import layernorm, rmsnorm
from . import cross_entropy, dropout, embedding
from . import reduce, softmax
from . import batch_norm, pool2d
from .pool2d import avg_pool2d, global_avg_pool, max_pool2d
from . import conv2d

__all__ = ["OPS", "Attr", "Candidate", "Input", "OpDef", "Problem", "register", "elementwise", "gemm", "matmul",
           "concat", "slice", "transpose", "layernorm", "rmsnorm", "cross_entropy", "dropout", "embedding",
           "reduce", "softmax", "batch_norm", "pool2d", "max_pool2d", "avg_pool2d", "global_avg_pool", "conv2d"]
