"""What an op module is written with: the op schema (``ir/schema.py``: OpDef, Attr, Input, Candidate, Problem,
register, attach_grad, ...) and the launch of a candidate as one native call (``native_launch`` and its slots), the
one part that needs the device runtime."""
from __future__ import annotations

from .. import device as _device
from ..ir.schema import (OPS, REQUIRED, Attr, Candidate, Input, Launch, OpDef, Problem, Sample, add_candidate,
                         as_float64, attach_grad, register, remove_candidate, require_inputs, sample_array,
                         table_candidate)

__all__ = ["OPS", "REQUIRED", "Attr", "Candidate", "Input", "Launch", "OpDef", "Problem", "Sample", "add_candidate",
           "as_float64", "attach_grad", "in_ptr", "in_ptrs", "native_launch", "out_ptr", "out_ptrs", "register",
           "remove_candidate", "require_inputs", "sample_array", "stream_arg", "table_candidate"]


def native_launch(function, *arguments) -> Launch:
    """A candidate's launch as one call of its op binding, ``function(*arguments)``, with ``in_ptr(i)``,
    ``out_ptr(i)``, ``in_ptrs()``, ``out_ptrs()`` and ``stream_arg()`` standing for the call's addresses and stream.
    The arguments are bound once, at prepare time; a call fills the slots and calls the binding in C++
    (``_runtime.Launch``), so the face's prepared call and a plan's node pay no Python frame for it.

    ``function`` may instead be an op module's C launch (a binding's ``bind_*(...)`` result, with no ``arguments``:
    src/bindings/common/c_launch.hpp): called with the addresses directly, it skips the binding's argument
    conversion too."""
    return _device.runtime().Launch(function, arguments)


def in_ptr(index: int):
    """The address of input ``index`` in a ``native_launch`` (0 for an absent optional input)."""
    return _device.runtime().LaunchSlot("input", index)


def out_ptr(index: int):
    """The address of output ``index`` in a ``native_launch``."""
    return _device.runtime().LaunchSlot("output", index)


def in_ptrs():
    """The list of every input address in a ``native_launch`` (a variadic op's binding takes them as one list)."""
    return _device.runtime().LaunchSlot("inputs")


def out_ptrs():
    """The list of every output address in a ``native_launch``."""
    return _device.runtime().LaunchSlot("outputs")


def stream_arg():
    """The stream handle in a ``native_launch``."""
    return _device.runtime().LaunchSlot("stream")
