"""The op face, generated from an op's definition: ``ge2.ops.<op>.forward_numpy / forward / backward_numpy /
backward / kernels`` and ``prepare``, the same for every op (CONTRIBUTING.md, "The op face").

``forward`` on device arrays validates a call once per signature (shapes, dtypes, layouts, attributes, kernel):
the OpDef's ``infer`` raises errors naming the argument, and the op's GPU candidate for that problem is chosen and
prepared (``Candidate.prepare``, a native launch). Each signature then has a native prepared call
(``_runtime.prepared_call``): in C++ it checks the arrays against the signature, checks or allocates the outputs
and launches. A later ``forward`` with the same attributes costs one dict lookup and that one native call (which
declines arrays of another signature, sending the call down the slow path); ``prepare`` returns it.

An op supplies what a definition cannot say: ``backward`` (the native backward kernels; the face binds arguments,
validates host arrays and turns the result into one entry per forward input) and, where its forward has more to
it than a candidate launch (a view instead of a copy, strided inputs, saved statistics), ``forward``.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import device as _device
from .. import selection
from ..dtypes import itemsize
from ..ir.types import TensorType
from . import _layout
from ._base import REQUIRED, OpDef, Problem

_MISSING = object()
_CACHE_LIMIT = 4096  # signatures per op before the cache starts over (shapes that never repeat)
_RECENT_PER_KEY = 4  # input signatures forward tries natively per attribute set before its slow path

FACES: dict[str, "Face"] = {}

# forward(inputs, attrs, kernel, out, stream, **extras) -> array(s); inputs are the device arrays as passed.
ForwardImpl = Callable[..., Any]
# backward(dy, inputs, attrs, kernel, out, stream, **saved) -> sequence with one entry per forward input.
BackwardImpl = Callable[..., Any]


@dataclass
class _Prepared:
    """One validated forward signature: the chosen kernel's launch and how to make the outputs."""

    kernel: str
    launch: Callable
    make_outputs: tuple[Callable[[], Any], ...]
    out_types: tuple[TensorType, ...]
    device: int
    aligned: bool  # the inputs were 16-byte aligned, so the kernel may need them to be
    in_bytes: tuple[int, ...]  # of each input (0 when absent): outputs given by the caller must not overlap them
    out_bytes: tuple[int, ...]
    call: Any = None  # the native prepared call of this signature, made with the first arrays that had it


class Face:
    """The five functions of one op (plus ``prepare``), each a plain function with the op's own signature."""

    def __init__(self, opdef: OpDef, backward: BackwardImpl, *, forward: ForwardImpl | None = None,
                 extras: dict[str, Any] | None = None,
                 forward_extras: ForwardImpl | None = None, saved: tuple[str, ...] | dict[str, Any] = (),
                 host_check: Callable[[list, dict], None] | None = None,
                 backward_host_check: Callable[..., None] | None = None, in_place: bool | dict[str, str] = False,
                 no_kernel: Callable[[Problem], None] | None = None):
        self.op = opdef
        self.name = opdef.name
        self._backward_impl = backward
        self._forward_impl = forward
        # Keyword-only forward options (name -> default); a call that sets one goes to forward_extras.
        self._extras = dict(extras or {})
        self._forward_extras = forward_extras
        # Keyword-only backward options (name -> default): saved forward results it can reuse, and op options.
        self._saved = saved if isinstance(saved, dict) else dict.fromkeys(saved)
        self._host_check = host_check  # values only host arrays show before an upload (ids, labels in range)
        self._backward_host_check = backward_host_check  # (inputs, attrs, **options): backward_numpy's options
        # True: each output element depends on the same input elements only, so out=input works. A dict {output:
        # input}: that output may be that input, as a whole (batch_norm's running statistics, updated in place).
        self._in_place = in_place is True
        self._in_place_of = {opdef.outputs.index(output): input_name
                             for output, input_name in (in_place.items() if isinstance(in_place, dict) else ())}
        # no_kernel(problem) raises the error, naming the argument, for a valid problem no candidate supports (the
        # face's kernels cannot run it; a graph can, on the host fallback); else a RuntimeError names the op.
        self._no_kernel = no_kernel
        self._inputs = tuple(i.name for i in opdef.inputs)
        self._params = self._inputs + tuple(a.name for a in opdef.attrs)
        self._index = {name: i for i, name in enumerate(self._params)}
        self._optional = {i.name for i in opdef.inputs if i.optional}
        self._variadic = any(i.variadic for i in opdef.inputs)
        self._kernel_names = ("auto",) + tuple(c.name for c in opdef.candidates)
        self._cache: dict[tuple, _Prepared] = {}
        # (attribute values, their types, kernel) -> the native calls of the signatures most recently run with them
        self._recent: dict[tuple, list] = {}
        self.forward = self._make_forward()
        self.forward_numpy = self._make_forward_numpy()
        self.backward = self._make_backward()
        self.backward_numpy = self._make_backward_numpy()
        self.prepare = self._make_prepare()
        self.kernels = self._make_kernels()
        FACES[self.name] = self

    def functions(self) -> dict[str, Callable]:
        """The face as a module's globals: ``globals().update(FACE.functions())``."""
        return {name: getattr(self, name) for name in
                ("forward_numpy", "forward", "backward_numpy", "backward", "kernels", "prepare")}

    def __repr__(self):
        return f"<ge2 op face '{self.name}'>"

    # -----------------------------------------------------------------------------------------------------------
    # Arguments
    # -----------------------------------------------------------------------------------------------------------
    def _bind(self, where: str, args: tuple, kwargs: dict) -> list:
        """Inputs then attributes, positional or by keyword, in OpDef order: None for an absent optional input,
        _MISSING for an attribute not given."""
        values = list(args) + [_MISSING] * (len(self._params) - len(args))
        for name, value in kwargs.items():
            index = self._index.get(name)
            if index is None:
                raise TypeError(f"{where}: unexpected argument '{name}'; expected among "
                                f"{', '.join(self._params + ('kernel', 'out', 'stream'))}")
            if values[index] is not _MISSING:
                raise TypeError(f"{where}: got several values for argument '{name}'")
            values[index] = value
        for index, name in enumerate(self._inputs):
            if values[index] is _MISSING:
                if name not in self._optional:
                    raise TypeError(f"{where}: missing required input '{name}'")
                values[index] = None
        return values

    def _tail(self, where: str, args: tuple, trailing: dict) -> tuple[tuple, list]:
        """Positional arguments after the inputs and attributes: ``kernel``, ``out``, ``stream`` in that order."""
        count = len(self._params)
        extra = args[count:]
        if len(extra) > len(trailing):
            raise TypeError(f"{where}: takes at most {count + len(trailing)} positional argument(s) "
                            f"({', '.join(self._params + tuple(trailing))}), got {len(args)}")
        values = list(trailing.values())
        for index, (name, value) in enumerate(zip(trailing, extra)):
            given = values[index] != "auto" if name == "kernel" else values[index] is not None
            if given:
                raise TypeError(f"{where}: got several values for argument '{name}'")
            values[index] = value
        return args[:count], values

    def _split(self, where: str, values: list) -> tuple[list, dict]:
        """(input arrays, validated attribute dict); a variadic input expands to its arrays."""
        count = len(self._inputs)
        inputs = list(values[:count])
        if self._variadic:
            inputs = _sequence(inputs[0], self._inputs[0])
        given = {name: v for name, v in zip(self._params[count:], values[count:]) if v is not _MISSING}
        return inputs, self.op.validate_attrs(given, where)

    def _check_kernel(self, kernel) -> None:
        if not isinstance(kernel, str) or kernel not in self._kernel_names:
            got = repr(kernel) if isinstance(kernel, str) else type(kernel).__name__
            raise ValueError(f"kernel: expected one of {', '.join(self._kernel_names)}, got {got}")

    def _input_names(self, count: int) -> list[str]:
        if self._variadic:
            return [f"{self._inputs[0]}[{i}]" for i in range(count)]
        return list(self._inputs)

    def _host_types(self, arrays: list, names: list[str]) -> list[TensorType | None]:
        types = []
        for array, name in zip(arrays, names):
            if array is None:
                types.append(None)
            else:
                dtype = _layout.host_dtype(array, name)  # first: it raises for what is not a NumPy array
                types.append(TensorType(array.shape, dtype))
        return types

    # -----------------------------------------------------------------------------------------------------------
    # forward
    # -----------------------------------------------------------------------------------------------------------
    def _resolve(self, inputs: list, attrs: dict, kernel: str, aligned: bool) -> _Prepared:
        """Validates one forward signature and prepares its kernel (the slow path, once per signature)."""
        self._check_kernel(kernel)
        names = self._input_names(len(inputs))
        views = [None if x is None else _device.view_of(x, name) for x, name in zip(inputs, names)]
        first = next((v for v in views if v is not None), None)
        if first is None:
            raise TypeError(f"{names[0]}: expected a CUDA device array, got None")
        for view, name in zip(views, names):
            if view is None:
                continue
            if not view.is_contiguous:
                raise ValueError(f"{name}: expected a contiguous row-major array, got strides {view.strides} for "
                                 f"shape {tuple(view.shape)}")
            _layout.check_device(view, first.device, name)
        in_types = [None if v is None else TensorType(v.shape, v.dtype) for v in views]
        out_types = tuple(self.op.infer(in_types, attrs))
        problem = Problem(self.name, tuple(in_types), out_types, attrs, _device.compute_capability(first.device))
        kernel_name, launch = choose_launch(self.op, problem, kernel, aligned, self._no_kernel)
        template = inputs[views.index(first)]
        makers = tuple(_device.allocator(template, t.shape, t.dtype, first.device) for t in out_types)
        nbytes = lambda t: 0 if t is None else _layout.numel(t.shape) * itemsize(t.dtype)  # noqa: E731
        return _Prepared(kernel_name, launch, makers, out_types, first.device, aligned,
                         tuple(map(nbytes, in_types)), tuple(map(nbytes, out_types)))

    def _check_overlap(self, entry: _Prepared, index: int, pointer: int, in_pointers: list[int]) -> None:
        size = entry.out_bytes[index]
        for position, (start, length) in enumerate(zip(in_pointers, entry.in_bytes)):
            if start < pointer + size and pointer < start + length:
                name = self._input_names(len(in_pointers))[position]
                allowed = self._in_place_of.get(index)
                if (start, length) == (pointer, size) and (self._in_place or allowed == name):
                    continue
                argument = "out" if len(entry.out_bytes) == 1 else f"out[{index}]"
                if self._in_place:
                    how = "only the same array, as a whole, can be written in place"
                elif allowed is not None:
                    how = f"only {allowed}, as a whole, can be written in place"
                elif self._in_place_of:
                    how = f"{self.op.outputs[index]} is not written in place"
                else:
                    how = f"{self.name} does not work in place"
                raise ValueError(f"{argument}: must not overlap {name} ({how})")

    def _entry(self, where: str, inputs: list, attr_values: tuple, kernel: str) -> _Prepared:
        """The prepared signature of these arrays and attribute values (the slow path of a call)."""
        keys, address_bits = [], 0
        for index, x in enumerate(inputs):
            if x is None:
                keys.append(None)
                continue
            try:
                key, pointer = _device.signature(x)
            except TypeError:  # not a device array: the error names the argument
                _device.view_of(x, self._input_names(len(inputs))[index])
                raise
            keys.append(key)
            address_bits |= pointer
        aligned = not address_bits & 15
        # Each input's type is part of the key: the signature's native call accepts exactly these types (a torch
        # Parameter and a Tensor of one shape get a call each).
        cache_key = (tuple(map(type, inputs)), tuple(keys), attr_values, tuple(map(type, attr_values)), kernel, aligned)
        try:
            entry = self._cache.get(cache_key)
        except TypeError:  # an unhashable attribute value (a list): validate every call
            cache_key, entry = None, None
        if entry is None:
            values = list(attr_values)
            given = {name: v for name, v in zip(self._params[len(self._inputs):], values) if v is not _MISSING}
            entry = self._resolve(inputs, self.op.validate_attrs(given, where), kernel, aligned)
            if cache_key is not None:
                if len(self._cache) >= _CACHE_LIMIT:
                    self._cache.clear()
                self._cache[cache_key] = entry
        if entry.call is None:
            entry.call = self._prepared_call(inputs, entry)
        return entry

    def _remember(self, key: tuple, call) -> None:
        """Puts ``call`` first among the recent calls of ``key`` (a few per key: loops alternating shapes)."""
        if len(self._recent) >= _CACHE_LIMIT:
            self._recent.clear()
        recent = [call] + [c for c in self._recent.get(key, ()) if c is not call]
        self._recent[key] = recent[:_RECENT_PER_KEY]

    def _make_forward(self):
        face, count, where = self, len(self._inputs), f"{self.name}.forward"

        def forward(*args, kernel="auto", out=None, stream=None, **kwargs):
            if len(args) > len(face._params):
                args, (kernel, out, stream) = face._tail(where, args, {"kernel": kernel, "out": out, "stream": stream})
            extras = face._pop_extras(kwargs) if kwargs and face._extras else None
            # All inputs by position and no keywords (the common loop call): nothing to bind.
            values = face._bind(where, args, kwargs) if kwargs or len(args) < count else args
            if extras or face._forward_impl is not None:
                inputs, attrs = face._split(where, values)
                face._check_kernel(kernel)
                if extras:
                    return face._forward_extras(inputs, attrs, kernel, out, stream, **extras)
                return face._forward_impl(inputs, attrs, kernel, out, stream)
            inputs = _sequence(values[0], face._inputs[0]) if face._variadic else values[:count]
            attr_values = tuple(values[count:])
            try:
                recent_key = (attr_values, tuple(map(type, attr_values)), kernel)
                recent = face._recent.get(recent_key)
            except TypeError:  # an unhashable attribute value (a list): the slow path every call
                recent_key, recent = None, None
            if recent is not None:  # the common loop call: one native call checks the arrays and launches
                for call in recent:
                    result = call.try_call(inputs, out, stream)
                    if result is not NotImplemented:
                        return result
            call = face._entry(where, inputs, attr_values, kernel).call
            if recent_key is not None:
                face._remember(recent_key, call)
            return call(*inputs, out=out, stream=stream)

        forward.__doc__ = (f"{self.name} on device arrays (DeviceArray, torch, CuPy), zero-copy: returns the output as "
                           f"an array of the first input's kind, or writes ``out``.\n\n{self.op.doc}")
        return _named(forward, self.name, "forward", self._signature(dy=False, tail=("kernel", "out", "stream"),
                                                                     extras=self._extras))

    def _pop_extras(self, kwargs: dict) -> dict:
        extras = {}
        for name, default in self._extras.items():
            value = kwargs.pop(name, default)
            if value is not default:
                extras[name] = value
        return extras

    def _make_forward_numpy(self):
        face, where = self, f"{self.name}.forward_numpy"
        host_extras = {k: v for k, v in self._extras.items() if not k.endswith("_out")}

        def forward_numpy(*args, kernel="auto", **kwargs):
            if len(args) > len(face._params):
                args, (kernel,) = face._tail(where, args, {"kernel": kernel})
            extras = {name: kwargs.pop(name) for name in host_extras if name in kwargs}
            inputs, attrs = face._split(where, face._bind(where, args, kwargs))
            names = face._input_names(len(inputs))
            face.op.infer(face._host_types(inputs, names), attrs)
            if face._host_check is not None:
                face._host_check(inputs, attrs)
            face._check_kernel(kernel)
            _device.require_gpu(where)
            on_device = [None if x is None else _layout.to_device(x) for x in inputs]
            if face._variadic:
                on_device = [on_device]
            result = face.forward(*on_device, **attrs, kernel=kernel, **extras)
            return tuple(_host(r) for r in result) if isinstance(result, tuple) else _host(result)

        forward_numpy.__doc__ = f"{self.name} on host arrays (runs on the GPU): NumPy in, NumPy out."
        return _named(forward_numpy, self.name, "forward_numpy",
                      self._signature(dy=False, tail=("kernel",), extras=host_extras))

    def _make_prepare(self):
        face, count, where = self, len(self._inputs), f"{self.name}.prepare"

        def prepare(*args, kernel="auto", **kwargs):
            if len(args) > len(face._params):
                args, (kernel,) = face._tail(where, args, {"kernel": kernel})
            values = face._bind(where, args, kwargs)
            if face._forward_impl is not None:
                raise TypeError(f"{where}: {face.name} has no prepared form (its forward is not one kernel launch)")
            inputs = _sequence(values[0], face._inputs[0]) if face._variadic else values[:count]
            return face._entry(where, inputs, tuple(values[count:]), kernel).call

        prepare.__doc__ = (f"Validates {self.name} for these arrays and attributes and chooses its kernel once; the "
                           f"returned callable, p(*inputs, out=None, stream=None), takes arrays of the same shapes, "
                           f"dtypes and kinds and checks and launches in C++.")
        return _named(prepare, self.name, "prepare", self._signature(dy=False, tail=("kernel",)))

    def _prepared_call(self, inputs: list, entry: _Prepared):
        """The native prepared call (``_runtime.prepared_call``): per call it checks the arrays against this
        signature and launches in C++; what it cannot decide alone (a new kind of output array, an output
        overlapping an input, a wrong array) comes back here, so the errors are the face's."""
        names = self._input_names(len(inputs))
        # What each input must be like, as text: the call must not keep the arrays it was made with alive.
        expected = [None if x is None else f"{type(x).__name__} {_device.signature(x)[0]}" for x in inputs]
        count = len(entry.out_types)

        def input_error(index, array):
            got = None
            if array is not None:
                _device.view_of(array, names[index])  # what is not a device array: a TypeError naming the argument
                key, pointer = _device.signature(array)
                got = f"{type(array).__name__} {key}" + (" at an address not 16-byte aligned" if pointer & 15 else "")
            raise ValueError(f"{names[index]}: expected an array like the prepared one ({expected[index]}), got {got}")

        def check_output(index, array):
            if index is None:  # `array` is the whole `out`
                given = len(array) if isinstance(array, (tuple, list)) else 1
                raise ValueError(f"out: expected {count} array(s) ({', '.join(self.op.outputs)}), got {given}")
            t = entry.out_types[index]
            _layout.checked_view(array, "out" if count == 1 else f"out[{index}]", t.shape, t.dtype, entry.device)
            return _device.array_kind(array)

        def check_overlap(index, pointer, in_pointers):
            self._check_overlap(entry, index, pointer, in_pointers)

        first = next(x for x in inputs if x is not None)
        return _device.runtime().prepared_call(
            entry.launch, self.name, entry.kernel, self._variadic, entry.aligned, inputs,
            [None if x is None else _device.array_kind(x) for x in inputs], entry.in_bytes, entry.out_bytes,
            entry.make_outputs, _device.array_kind(first), input_error, check_output, check_overlap, _device.signature,
            _device.stream_handle)

    # -----------------------------------------------------------------------------------------------------------
    # backward
    # -----------------------------------------------------------------------------------------------------------
    def _make_backward(self):
        face, where = self, f"{self.name}.backward"

        def backward(dy, *args, kernel="auto", out=None, stream=None, **kwargs):
            if len(args) > len(face._params):
                args, (kernel, out, stream) = face._tail(where, args, {"kernel": kernel, "out": out, "stream": stream})
            saved = {name: kwargs.pop(name) for name in face._saved if name in kwargs}
            inputs, attrs = face._split(where, face._bind(where, args, kwargs))
            face._check_kernel(kernel)
            if out is not None:
                out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
                if len(out) < len(inputs) and all(x is None for x in inputs[len(out):]):
                    out += (None,) * (len(inputs) - len(out))  # absent trailing optional inputs need no entry
                if len(out) != len(inputs):
                    raise ValueError(f"out: expected one entry per input ({', '.join(face._input_names(len(inputs)))})"
                                     f", None where a gradient is not wanted in place, got {len(out)}")
            grads = tuple(face._backward_impl(dy, inputs, attrs, kernel, out, stream, **saved))
            if len(grads) != len(inputs):
                raise RuntimeError(f"{where}: returned {len(grads)} gradients for {len(inputs)} inputs")
            return grads

        backward.__doc__ = (f"Gradients of {self.name} on device arrays: a tuple with one entry per forward input "
                            f"(None where an input has no gradient).")
        return _named(backward, self.name, "backward", self._signature(dy=True, tail=("kernel", "out", "stream"),
                                                                       saved=self._saved))

    def _make_backward_numpy(self):
        face, where = self, f"{self.name}.backward_numpy"
        host_saved = {k: v for k, v in self._saved.items() if not k.endswith("_out")}

        def backward_numpy(dy, *args, kernel="auto", **kwargs):
            if len(args) > len(face._params):
                args, (kernel,) = face._tail(where, args, {"kernel": kernel})
            saved = {name: kwargs.pop(name) for name in host_saved if name in kwargs}
            inputs, attrs = face._split(where, face._bind(where, args, kwargs))
            names = face._input_names(len(inputs))
            out_types = dict(zip(face.op.outputs, face.op.infer(face._host_types(inputs, names), attrs)))
            if face._host_check is not None:
                face._host_check(inputs, attrs)
            first = face.op.outputs[0]
            _check_host_output(dy, "dy", out_types[first], "the output's" if len(out_types) == 1 else f"{first}'s")
            for name, value in saved.items():
                if host_saved[name] is None and value is not None:  # a saved forward result: a host array
                    if name in out_types:  # a forward output by name: its type is known
                        _check_host_output(value, name, out_types[name], "the forward's")
                    else:
                        _layout.host_dtype(value, name)
            if face._backward_host_check is not None:
                face._backward_host_check(inputs, attrs, **saved)
            face._check_kernel(kernel)
            _device.require_gpu(where)
            upload = lambda x: _layout.to_device(x) if isinstance(x, np.ndarray) else x  # noqa: E731
            on_device = [upload(x) for x in inputs]
            if face._variadic:
                on_device = [on_device]
            grads = face.backward(upload(dy), *on_device, **attrs, kernel=kernel,
                                  **{name: upload(value) for name, value in saved.items()})
            return tuple(None if g is None else _host(g) for g in grads)

        backward_numpy.__doc__ = f"Gradients of {self.name} on host arrays (runs on the GPU): a tuple per input."
        return _named(backward_numpy, self.name, "backward_numpy",
                      self._signature(dy=True, tail=("kernel",), saved=host_saved))

    def _make_kernels(self):
        face = self

        def kernels() -> list[dict]:
            return selection.kernels(face.op)

        kernels.__doc__ = f"The kernel candidates of {self.name} with their constraints, best first."
        return _named(kernels, self.name, "kernels", inspect.Signature())

    # -----------------------------------------------------------------------------------------------------------
    # Signatures (what help() and inspect.signature show)
    # -----------------------------------------------------------------------------------------------------------
    def _signature(self, dy: bool, tail: tuple, extras: dict | None = None, saved: dict | None = None
                   ) -> inspect.Signature:
        P = inspect.Parameter
        params = [P("dy", P.POSITIONAL_OR_KEYWORD)] if dy else []
        for item in self.op.inputs:
            params.append(P(item.name, P.POSITIONAL_OR_KEYWORD, **({"default": None} if item.optional else {})))
        for attr in self.op.attrs:
            default = {} if attr.default is REQUIRED else {"default": attr.default}
            params.append(P(attr.name, P.POSITIONAL_OR_KEYWORD, **default))
        defaults = {"kernel": "auto", "out": None, "stream": None}
        params += [P(name, P.POSITIONAL_OR_KEYWORD, default=defaults[name]) for name in tail]
        for options in (extras or {}, saved or {}):
            params += [P(name, P.KEYWORD_ONLY, default=default) for name, default in options.items()]
        return inspect.Signature(params)


def choose_launch(opdef: OpDef, problem: Problem, kernel: str, aligned: bool,
                  no_kernel: Callable[[Problem], None] | None = None) -> tuple[str, Callable]:
    """(kernel name, launch) of ``opdef``'s candidate for ``problem``: the one named ``kernel``, or for "auto" the
    selector's choice (``selection.py``, as for plans): the best one that supports the problem and prepares.
    Pointers that are not 16-byte aligned (``aligned`` False: views into other arrays) go to the candidates that
    take any alignment. A face's forward asks this of its op, a face's backward of the backward op (whose launch
    takes the backward op's inputs and outputs). ``no_kernel(problem)``: raises the error naming the argument when
    no candidate supports a valid problem."""
    if kernel != "auto":
        declared = next((c for c in opdef.candidates if c.name == kernel), None)
        if declared is None:
            raise ValueError(f"kernel: '{kernel}' cannot run this problem: {opdef.name} has no kernel '{kernel}' (its "
                             f"kernels: {', '.join(c.name for c in opdef.candidates)})")
        candidate = selection.resolve(declared)
        reason = (selection.dtype_reason(candidate.dtypes, selection.problem_dtype(problem))
                  or candidate.supports(problem))
        if reason:
            raise ValueError(f"kernel: '{kernel}' cannot run this problem: {reason}")
        return kernel, candidate.prepare(problem)
    try:
        choice = selection.choose(selection.rank(opdef, problem, aligned=aligned), problem, catch=RuntimeError)
        return choice.candidate.name, choice.launch
    except selection.NoKernelPrepared as error:
        failures = [f"{name}: {message.partition(': ')[2]}" for name, message in error.fallbacks]
    if not failures and no_kernel is not None:
        no_kernel(problem)
    if not aligned:
        failures.append("the inputs are not 16-byte aligned: only the candidates that take any alignment apply")
    raise RuntimeError(f"{opdef.name}: no kernel can run this problem ({'; '.join(failures) or 'none applies'})")


def _named(function, op: str, name: str, signature: inspect.Signature):
    function.__name__ = name
    function.__qualname__ = f"{op}.{name}"
    function.__signature__ = signature
    return function


def _sequence(value, argument: str) -> list:
    if not isinstance(value, (list, tuple)) or not value:
        raise TypeError(f"{argument}: expected a non-empty list or tuple of arrays, got {type(value).__name__}")
    return list(value)


def _check_host_output(array, argument: str, expected: TensorType, whose: str) -> None:
    """A host array in the place of a forward output (its gradient ``dy``, or its saved value)."""
    dtype = _layout.host_dtype(array, argument)
    if tuple(np.shape(array)) != tuple(expected.shape):
        raise ValueError(f"{argument}: expected shape {tuple(expected.shape)} ({whose}), got {tuple(np.shape(array))}")
    if dtype != expected.dtype:
        raise TypeError(f"{argument}: expected dtype {expected.dtype} ({whose}), got {dtype}")


def _host(array) -> np.ndarray:
    return _device.as_device_array(array, "result").numpy()
