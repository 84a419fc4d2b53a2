"""GE2 ops. Importing this package registers every op definition in ``OPS``; native modules load on first use.

Every op has the same face, ``ge2.ops.<op>``: ``forward_numpy`` (host in, host out), ``forward`` (device arrays:
DeviceArray, torch, CuPy), ``backward_numpy``, ``backward`` (a tuple with one gradient per input), ``kernels()`` and
``prepare`` (a call validated once). The faces are generated from the op definitions (``ops/_face.py``); an op module
that holds one op is its face (``ops.gemm``), the others' faces are attributes of this package (``ops.add``,
``ops.log_softmax``, ``ops.sum``, ``ops.reshape``). The convention is in CONTRIBUTING.md, "The op face". Other
packages add ops (``register``) and kernel candidates for existing ops (``add_candidate``): docs/writing-an-op.md.
"""
from ._base import (OPS, Attr, Candidate, Input, OpDef, Problem, Sample, add_candidate, in_ptr, in_ptrs, native_launch,
                    out_ptr, out_ptrs, register, remove_candidate, sample_array, stream_arg, table_candidate)
from ._face import FACES, Face
from . import elementwise, gemm, matmul
from . import concat, slice, transpose
from . import layernorm, rmsnorm
from . import cross_entropy, dropout, embedding
from . import reduce, softmax
from . import cast, quantize_fp8, scaled_gemm
from . import pointwise
from . import optimizer
from . import attention
from . import batch_norm, pool2d
from . import conv2d, scaled_conv2d
from . import indexing
from . import fused  # last: it gives every op with a scalar expression its generated candidate

# The faces of ops that share a module (add, relu, log_softmax, sum, reshape, ...); one-op modules are their face.
globals().update({name: face for name, face in FACES.items() if name not in globals()})

from ._grad import BACKWARD_OPS, register_backward
from .fused import FUSED_OPS

# Every op has a face except the backward ops (ops/_grad.py, BACKWARD_OPS) and the fused ops the compiler makes
# (ops/fused.py, FUSED_OPS).
__all__ = ["OPS", "FACES", "BACKWARD_OPS", "FUSED_OPS", "Attr", "Candidate", "Face", "Input", "OpDef", "Problem",
           "Sample", "pointwise", "add_candidate", "register", "register_backward", "remove_candidate", "native_launch",
           "in_ptr", "in_ptrs", "out_ptr", "out_ptrs", "sample_array", "stream_arg", "table_candidate", "elementwise",
           "reduce", "optimizer", "pool2d"]
__all__ += sorted(set(OPS) - BACKWARD_OPS - FUSED_OPS)
