"""A prepared candidate launch on torch tensors: what a compiled plan calls for one node (one binding call); the
correctness check every case runs first."""
from __future__ import annotations

from graph_executor_v2 import selection
from graph_executor_v2.dtypes import normalize
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, Problem


def holding(call, *tensors):
    """``call`` with ``tensors`` attached to it. A call made with bare data_ptr() addresses does not keep their
    tensors alive: once the tensors are dropped, PyTorch's caching allocator hands their memory to the next
    allocation, and the call reads (and writes) someone else's data."""
    call.tensors = tensors
    return call


def prepared(op, inputs, outputs, attrs, candidate=None):
    """The op's best supported candidate (or the one named), prepared once for these tensors' shapes (None for an
    absent optional input)."""
    opdef = OPS[op]
    attrs = opdef.validate_attrs(attrs, op)
    in_types = tuple(None if x is None else TensorType(tuple(x.shape), normalize(x.dtype)) for x in inputs)
    problem = Problem(op, in_types, tuple(opdef.infer(list(in_types), attrs)), attrs)
    viable = selection.rank(opdef, problem, pinned=candidate).viable
    chosen = viable[0] if candidate is None else next(c for c in viable if c.name == candidate)
    launch = chosen.prepare(problem)
    in_ptrs, out_ptrs = [0 if x is None else x.data_ptr() for x in inputs], [y.data_ptr() for y in outputs]
    return holding(lambda: launch(in_ptrs, out_ptrs, 0), *inputs, *outputs)


def close(torch, actual, expected, what, rtol=2e-3, atol=2e-3):
    """Raises when GE2's result and PyTorch's disagree beyond the tolerance (the check before any timing)."""
    if not torch.allclose(actual.float(), expected.float(), rtol=rtol, atol=atol):
        error = (actual.float() - expected.float()).abs().max().item()
        raise AssertionError(f"{what}: GE2 disagrees with PyTorch (max abs error {error:.3e})")
