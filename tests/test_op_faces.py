"""The op face convention (CONTRIBUTING.md, "The op face"), checked for every op the IR knows: ge2.ops.<op> has
forward_numpy / forward / backward_numpy / backward / kernels (and prepare), with the arguments named and ordered
the same way, and backward gives one gradient per forward input."""
from __future__ import annotations

import inspect
import operator

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.dtypes import FLOAT_DTYPES
from graph_executor_v2.ir import TensorType
from graph_executor_v2.ir.graph import output_names
from graph_executor_v2.ops import BACKWARD_OPS, FUSED_OPS, OPS
from graph_executor_v2.testing import assert_close, random_array

F32 = np.float32
TAIL = ["kernel", "out", "stream"]


def _sample(rng, op, index=0):
    """(inputs, attrs) of the op's sample ``index`` (OpDef.samples: the first is the typical problem)."""
    sample = OPS[op].sample_inputs(rng)[index]
    return list(sample.inputs), dict(sample.attrs)


def _sample_ids():
    """(op, sample index) of every sample of every op with a face."""
    rng = np.random.default_rng(0)
    return [(op, index) for op in sorted(set(OPS) - BACKWARD_OPS - FUSED_OPS)
            for index in range(len(OPS[op].sample_inputs(rng)))]


def _flat(op, inputs):
    """The forward inputs as separate arrays, as OpDef callables take them: a variadic input expands, absent
    optional inputs are None."""
    if isinstance(inputs[0], list):
        return list(inputs[0])
    return list(inputs) + [None] * (len(OPS[op].inputs) - len(inputs))


@pytest.mark.parametrize("op", sorted(set(OPS) - BACKWARD_OPS - FUSED_OPS))
def test_face_has_the_five_functions_with_the_convention_signatures(op):
    face = getattr(ge2.ops, op)
    opdef = OPS[op]
    inputs = [i.name for i in opdef.inputs]
    attrs = [a.name for a in opdef.attrs]
    for name in ("forward_numpy", "forward", "backward_numpy", "backward", "kernels", "prepare"):
        assert callable(getattr(face, name, None)), f"ge2.ops.{op}.{name}"

    def positional(function):
        return [p.name for p in inspect.signature(function).parameters.values()
                if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]

    assert positional(face.forward) == inputs + attrs + TAIL
    assert positional(face.forward_numpy) == inputs + attrs + ["kernel"]
    assert positional(face.backward) == ["dy"] + inputs + attrs + TAIL
    assert positional(face.backward_numpy) == ["dy"] + inputs + attrs + ["kernel"]
    assert positional(face.prepare) == inputs + attrs + ["kernel"]
    assert list(inspect.signature(face.kernels).parameters) == []
    for function in (face.forward, face.backward, face.forward_numpy, face.backward_numpy):
        parameters = inspect.signature(function).parameters.values()
        for parameter in parameters:
            assert parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            assert parameter.name == parameter.name.lower(), f"{op}.{function.__name__}: {parameter.name}"
            assert not parameter.name.endswith("_out") or function in (face.forward, face.backward)
        assert {"dY", "dx_out", "dloss"} & {p.name for p in parameters} == set()
    for item in opdef.inputs:
        default = inspect.signature(face.forward).parameters[item.name].default
        assert (default is None) == item.optional
    for attr in opdef.attrs:
        default = inspect.signature(face.forward).parameters[attr.name].default
        assert default is inspect.Parameter.empty or default == attr.default


@pytest.mark.parametrize("op", sorted(set(OPS) - BACKWARD_OPS - FUSED_OPS))
def test_numpy_faces_validate_before_device_work(rng, op):
    face = getattr(ge2.ops, op)
    inputs, attrs = _sample(rng, op)
    with pytest.raises(ValueError, match=r"^kernel: expected one of auto, "):
        face.forward_numpy(*inputs, **attrs, kernel="no_such_kernel")
    with pytest.raises(ValueError, match=r"^dy: expected shape "):
        face.backward_numpy(np.zeros((1, 1, 1, 1, 1), F32), *inputs, **attrs)
    with pytest.raises(TypeError, match=r"unexpected argument 'no_such_attribute'"):
        face.forward_numpy(*inputs, no_such_attribute=1)
    with pytest.raises(TypeError, match=r"takes at most \d+ positional argument"):
        every_input = inputs if OPS[op].inputs[0].variadic else _flat(op, inputs)
        face.forward(*every_input, *[attrs.get(a.name, a.default) for a in OPS[op].attrs], "auto", None, None, None)
    first = OPS[op].inputs[0]
    with pytest.raises(TypeError, match=rf"{first.name}"):
        face.forward([[1.0]] if not first.variadic else 1.0, *inputs[1:], **attrs)


def test_kernel_tables_list_the_candidates():
    if not ge2._native.is_built("_ops_elementwise"):
        pytest.skip("native modules are not built")
    for op in sorted(set(OPS) - BACKWARD_OPS - FUSED_OPS):
        opdef = OPS[op]
        assert [k["name"] for k in getattr(ge2.ops, op).kernels()] == [c.name for c in opdef.candidates], op


def _assert_outputs(op, got, expected, how, dtype="float32"):
    """The face's result (one array, or a tuple for several outputs) against the reference outputs, with the
    tolerance of ``dtype`` (the problem's compute dtype)."""
    got = got if isinstance(got, tuple) else (got,)
    names = output_names(OPS[op], len(expected))  # the OpDef's, or y0, y1, ... for variadic outputs
    assert len(got) == len(expected) == len(names), f"{op} {how}"
    for name, array, want in zip(names, got, expected):
        array = array if isinstance(array, np.ndarray) else ge2.device.as_device_array(array).numpy()
        assert array.shape == want.shape and array.dtype == want.dtype, f"{op} {how}: {name}"
        if np.issubdtype(want.dtype, np.integer):  # indices
            np.testing.assert_array_equal(array, want, err_msg=f"{op} {how}: {name}")
        else:
            assert_close(array, want, dtype, 8, what=f"{op} {how}: {name}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(set(OPS) - BACKWARD_OPS - FUSED_OPS))
def test_forward_numpy_matches_the_reference_and_backward_gives_one_gradient_per_input(rng, op):
    face, opdef = getattr(ge2.ops, op), OPS[op]
    inputs, attrs = _sample(rng, op)
    full = opdef.validate_attrs(attrs, op)
    expected = opdef.run_reference(_flat(op, inputs), full)
    _assert_outputs(op, face.forward_numpy(*inputs, **attrs), expected, "forward_numpy")
    # dy: the gradient of the first output (the others, if any, are saved results with no gradient of their own);
    # a 0-d array for a reduced loss
    dy = np.asarray(random_array(rng, expected[0].shape, expected[0].dtype.name))
    saved = {}
    if "save_preact" in inspect.signature(face.forward_numpy).parameters:  # an activation's backward reads Z
        saved["preact"] = face.forward_numpy(*inputs, **attrs, save_preact=True)[1]
    grads = face.backward_numpy(dy, *inputs, **attrs, **saved)
    assert isinstance(grads, tuple) and len(grads) == len(_flat(op, inputs)), op
    out_grads = [dy.astype(np.float64)] + [None] * (len(expected) - 1)
    references = (opdef.reference_backward(_flat(op, inputs), expected, out_grads, full)
                  if opdef.reference_backward is not None else [None] * len(grads))  # predicates: no gradient
    for index, (grad, reference, x) in enumerate(zip(grads, references, _flat(op, inputs))):
        if reference is None or x is None:
            assert grad is None, f"{op}: input {index} has no gradient"
            continue
        assert grad.shape == np.shape(x), f"{op}: gradient {index}"
        assert_close(grad, reference, "float32", 8, what=f"{op} gradient {index}")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["DeviceArray", "torch"])
@pytest.mark.parametrize("op", sorted(set(OPS) - BACKWARD_OPS - FUSED_OPS))
def test_forward_on_device_arrays_and_the_prepared_call(rng, to_device, poisoned, op, kind):
    """forward and the prepared call (its checks and launch in C++: DeviceArray fields read directly, torch tensors
    through their methods) on device arrays of each kind, against the reference, outputs poisoned first."""
    face, opdef = getattr(ge2.ops, op), OPS[op]
    inputs, attrs = _sample(rng, op)
    expected = opdef.run_reference(_flat(op, inputs), opdef.validate_attrs(attrs, op))
    as_kind = lambda array: array  # noqa: E731
    if kind == "torch":
        torch = pytest.importorskip("torch")
        as_kind = torch.from_dlpack  # zero-copy torch views of the DeviceArrays
    upload = lambda x: None if x is None else as_kind(to_device(x))  # noqa: E731
    on_device = [[upload(x) for x in inputs[0]]] if isinstance(inputs[0], list) else [upload(x) for x in inputs]

    def poisoned_outputs():  # an array, or a tuple of arrays for several outputs
        arrays = tuple(as_kind(poisoned(e.shape, e.dtype.name)) for e in expected)
        return arrays if len(arrays) > 1 else arrays[0]

    def written(result, out):  # the very arrays of ``out`` come back
        if not isinstance(out, tuple):
            return result is out
        return isinstance(result, tuple) and len(result) == len(out) and all(map(operator.is_, result, out))

    out = poisoned_outputs()
    assert written(face.forward(*on_device, **attrs, out=out), out)
    _assert_outputs(op, out, expected, "forward(out=)")
    if op in ("transpose", "reshape", "slice", "embedding", "cross_entropy"):
        with pytest.raises(TypeError, match="has no prepared form"):
            face.prepare(*on_device, **attrs)
        return
    prepared = face.prepare(*on_device, **attrs)
    out = poisoned_outputs()
    assert written(prepared(*on_device, out=out), out)
    _assert_outputs(op, out, expected, "prepared")
    _assert_outputs(op, prepared(*on_device), expected, "prepared, new output")
    wrong = [upload(np.zeros((3, 3, 3), F32))]
    variadic = opdef.inputs[0].variadic  # concat, fp8_scale_update: the one argument is the list of arrays
    wrong = [wrong + on_device[0][1:]] if variadic else wrong + on_device[1:]
    with pytest.raises(ValueError, match="expected an array like the prepared one"):
        prepared(*wrong)


# ---------------------------------------------------------------------------------------------------------------
# Every sample of every op (OpDef.samples), through every face: the op's own description of its problems
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op,index", _sample_ids())
def test_every_sample_of_every_op_through_every_face(rng, to_device, poisoned, op, index):
    """On the CPU: the sample's types infer, the reference runs, and the op's FLOP and byte counts are sane (bytes at
    least every output written once). On the GPU, also: forward_numpy, forward into poisoned outputs and the
    prepared call against the reference, and backward_numpy against reference_backward."""
    opdef = OPS[op]
    inputs, attrs = _sample(rng, op, index)
    flat = _flat(op, inputs)
    full = opdef.validate_attrs(attrs, op)
    in_types = [None if x is None else TensorType(np.shape(x), np.asarray(x).dtype.name) for x in flat]
    out_types = opdef.infer(in_types, full)
    expected = opdef.run_reference(flat, full)
    assert [(e.shape, e.dtype.name) for e in expected] == [(tuple(t.shape), t.dtype) for t in out_types], op
    flops, moved = opdef.flop_count(in_types, out_types, full), opdef.byte_count(in_types, out_types, full)
    assert flops >= 0 and moved >= sum(e.nbytes for e in expected), op
    if not ge2.is_available():
        return
    floats = [np.asarray(x).dtype.name for x in flat if x is not None and np.asarray(x).dtype.name in FLOAT_DTYPES]
    dtype = min(floats, key=["bfloat16", "float16", "float32"].index, default="float32")  # the loosest tolerance
    face = getattr(ge2.ops, op)
    _assert_outputs(op, face.forward_numpy(*inputs, **attrs), expected, f"sample {index}: forward_numpy", dtype)
    upload = lambda x: None if x is None else to_device(x)  # noqa: E731
    on_device = [[upload(x) for x in inputs[0]]] if isinstance(inputs[0], list) else [upload(x) for x in inputs]
    out = tuple(poisoned(e.shape, e.dtype.name) for e in expected)
    face.forward(*on_device, **attrs, out=out if len(out) > 1 else out[0])
    _assert_outputs(op, out, expected, f"sample {index}: forward(out=)", dtype)
    if op not in ("transpose", "reshape", "slice", "embedding", "cross_entropy"):  # forwards of more than one launch
        _assert_outputs(op, face.prepare(*on_device, **attrs)(*on_device), expected, f"sample {index}: prepared",
                        dtype)
    if opdef.reference_backward is None:
        return
    dy = np.asarray(random_array(rng, expected[0].shape, expected[0].dtype.name))
    saved = {}
    if "save_preact" in inspect.signature(face.forward_numpy).parameters:  # an activation's backward reads Z
        saved["preact"] = face.forward_numpy(*inputs, **attrs, save_preact=True)[1]
    grads = face.backward_numpy(dy, *inputs, **attrs, **saved)
    references = opdef.reference_backward(flat, expected, [dy.astype(np.float64)] + [None] * (len(expected) - 1),
                                          full)
    for position, (grad, reference) in enumerate(zip(grads, references)):
        if reference is None or flat[position] is None:
            assert grad is None, f"{op} sample {index}: input {position} has no gradient"
        else:
            assert_close(grad, reference, dtype, 8, what=f"{op} sample {index}: gradient {position}")


# ---------------------------------------------------------------------------------------------------------------
# The generated forward and prepared call on stand-in device arrays: the call path with no GPU
# ---------------------------------------------------------------------------------------------------------------
class StandInArray:
    """What the faces read of a GE2 DeviceArray (view_tuple, ptr), at a made-up address."""

    __module__ = "graph_executor_v2.stand_in"

    def __init__(self, shape, ptr, dtype="float32", contiguous=True):
        self.shape, self.ptr, self.dtype, self.contiguous = tuple(shape), ptr, dtype, contiguous

    def view_tuple(self):
        strides = tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))
        return self.ptr, self.shape, self.dtype, strides, 0, self.contiguous


@pytest.fixture
def axpy(monkeypatch):
    """A face for y = alpha * a (+ b) with two candidates that record their launches instead of running."""
    from graph_executor_v2.ops import Attr, Candidate, Face, Input, OpDef, _face

    launches, prepared = [], []

    def candidate(name, priority, always_works):
        def prepare(problem):
            prepared.append(name)
            return lambda ins, outs, stream: launches.append((name, list(ins), list(outs), stream))

        too_big = lambda problem: "at most 100 elements" if problem.in_types[0].numel > 100 else None  # noqa
        return Candidate(name, priority, name, (lambda p: None) if always_works else too_big, prepare, always_works)

    opdef = OpDef("face_test_axpy", (Input("a"), Input("b", optional=True)), ("y",), (Attr("alpha", float, 1.0),),
                  infer=lambda in_types, attrs: [in_types[0]], reference=lambda inputs, attrs: [inputs[0]],
                  candidates=(candidate("fast", 20, False), candidate("any", 10, True)))
    made = []

    def allocator(template, shape, dtype, device):
        return lambda: made.append(StandInArray(shape, 0x90000 + 0x1000 * len(made), dtype)) or made[-1]

    monkeypatch.setattr(ge2.device, "compute_capability", lambda device: (9, 0))
    monkeypatch.setattr(ge2.device, "allocator", allocator)
    face = Face(opdef, lambda dy, inputs, attrs, kernel, out, stream: (None, None), in_place=True)
    yield face, launches, prepared
    _face.FACES.pop(opdef.name)


def test_forward_launches_the_best_candidate_once_prepared(axpy):
    face, launches, prepared = axpy
    a, b, y = StandInArray((4, 5), 0x10000), StandInArray((4, 5), 0x20000), StandInArray((4, 5), 0x30000)
    assert face.forward(a, b, 2.0, out=y) is y
    assert face.forward(a, b, alpha=2.0, out=y, stream=7) is y
    assert face.forward(a, b, alpha=2.0, out=y, stream=7) is y
    assert prepared == ["fast"]  # once per signature, attributes by position or by keyword alike
    assert launches[-1] == ("fast", [0x10000, 0x20000], [0x30000], 7)
    new = face.forward(a)  # no b, a new output
    assert isinstance(new, StandInArray) and new.shape == (4, 5)
    assert launches[-1] == ("fast", [0x10000, 0], [new.ptr], 0)
    assert face.forward(a, b, out=a) is a  # in place: the whole of an input
    face.forward(StandInArray((4, 5), 0x10004), out=y)  # not 16-byte aligned: the candidate that takes any
    assert launches[-1][0] == "any"
    face.forward(a, out=y)  # aligned again: the aligned signature's call, not the last one tried
    assert launches[-1] == ("fast", [0x10000, 0], [0x30000], 0)
    for shape in ((4, 5), (2, 3), (4, 5)):  # alternating shapes with the same attributes: each its own call
        face.forward(StandInArray(shape, 0x10000))
        assert launches[-1][0] == "fast" and launches[-1][1] == [0x10000, 0]

    class SubclassArray(StandInArray):  # a subclass of the same signature (as torch's Parameter is of Tensor)
        __module__ = StandInArray.__module__

    # b of the subclass, after (a, b) of the base type with the same attributes: its own call, not the base's error
    assert face.forward(a, SubclassArray((4, 5), 0x60000), alpha=2.0, out=y) is y
    assert launches[-1] == ("fast", [0x10000, 0x60000], [0x30000], 0)
    face.forward(StandInArray((11, 11), 0x40000))  # too big for "fast"
    assert launches[-1][0] == "any"


def test_forward_rejects_bad_outputs_and_kernels(axpy):
    face, launches, _ = axpy
    a = StandInArray((4, 5), 0x10000)
    with pytest.raises(ValueError, match=r"out: must not overlap a \(only the same array"):
        face.forward(a, out=StandInArray((4, 5), 0x10010))
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 5\), got \(5, 4\)"):
        face.forward(a, out=StandInArray((5, 4), 0x30000))
    with pytest.raises(TypeError, match=r"out: expected dtype float32, got float16"):
        face.forward(a, out=StandInArray((4, 5), 0x30000, "float16"))
    with pytest.raises(ValueError, match=r"a: expected a contiguous row-major array"):
        face.forward(StandInArray((4, 5), 0x10000, contiguous=False))
    with pytest.raises(ValueError, match=r"kernel: 'fast' cannot run this problem: at most 100 elements"):
        face.forward(StandInArray((11, 11), 0x40000), kernel="fast")
    with pytest.raises(TypeError, match=r"attribute 'alpha' expected float, got str"):
        face.forward(a, alpha="2")
    with pytest.raises(TypeError, match=r"a: expected a CUDA device array"):
        face.forward(np.ones((4, 5), F32))
    with pytest.raises(TypeError, match=r"a: expected a CUDA device array, got None"):
        face.forward(None)
    assert launches == []


def test_prepared_call_checks_its_arrays_and_launches(axpy):
    face, launches, prepared = axpy
    a, b, y = StandInArray((4, 5), 0x10000), StandInArray((4, 5), 0x20000), StandInArray((4, 5), 0x30000)
    run = face.prepare(a, b, alpha=3.0)
    assert run.kernel == "fast" and prepared == ["fast"]
    assert run(StandInArray((4, 5), 0x50000), b, out=y, stream=5) is y
    assert launches[-1] == ("fast", [0x50000, 0x20000], [0x30000], 5)
    assert isinstance(run(a, b), StandInArray)
    with pytest.raises(ValueError, match=r"a: expected an array like the prepared one"):
        run(StandInArray((5, 4), 0x10000), b)
    with pytest.raises(ValueError, match=r"b: expected an array like the prepared one"):
        run(a, None)
    with pytest.raises(ValueError, match=r"out: must not overlap b"):
        run(a, b, out=StandInArray((4, 5), 0x20008))
    with pytest.raises(ValueError, match=r"a: expected an array like the prepared one .* not 16-byte aligned"):
        run(StandInArray((4, 5), 0x10004), b)  # "fast" was chosen for aligned arrays
    only_a = face.prepare(a)
    assert only_a(a, out=y) is y and launches[-1][1] == [0x10000, 0]
    assert prepared == ["fast", "fast"]  # alpha 1.0, no b: another signature
    face._in_place = False
    with pytest.raises(ValueError, match=r"out: must not overlap a \(face_test_axpy does not work in place\)"):
        face.forward(a, b, 2.0, out=a)


def test_several_outputs_in_place_pairs_and_saved_results(monkeypatch):
    """An op with two outputs (y and a per-column statistic that may be updated in place of input b): forward's
    tuple of outputs, the {output: input} in-place pairs, and backward_numpy checking dy against the first output
    and a saved result against the output it names, before any device work."""
    from graph_executor_v2.ir.types import TensorType
    from graph_executor_v2.ops import Candidate, Face, Input, OpDef, _face

    launches = []
    candidate = Candidate("any", 10, "any", lambda problem: None,
                          lambda problem: lambda ins, outs, stream: launches.append((list(ins), list(outs))), True)
    infer = lambda in_types, attrs: [in_types[0], TensorType(in_types[0].shape[1:], "float32")]  # noqa: E731
    opdef = OpDef("face_test_stats", (Input("a"), Input("b")), ("y", "stat"), (), infer=infer,
                  reference=lambda inputs, attrs: list(inputs), candidates=(candidate,))
    monkeypatch.setattr(ge2.device, "compute_capability", lambda device: (9, 0))
    face = Face(opdef, lambda dy, inputs, attrs, kernel, out, stream, stat=None: (None, None), saved=("stat",),
                in_place={"stat": "b"})
    try:
        a, b = StandInArray((4, 5), 0x10000), StandInArray((5,), 0x20000)
        y, stat = StandInArray((4, 5), 0x30000), StandInArray((5,), 0x40000)
        assert face.forward(a, b, out=(y, stat)) == (y, stat)
        assert face.forward(a, b, out=(y, b)) == (y, b)  # the statistic updated in place of b
        assert launches[-1] == ([0x10000, 0x20000], [0x30000, 0x20000])
        with pytest.raises(ValueError, match=r"out\[1\]: must not overlap a \(only b, as a whole, can be written"):
            face.forward(a, b, out=(y, StandInArray((5,), 0x10000)))
        with pytest.raises(ValueError, match=r"out\[0\]: must not overlap a \(y is not written in place\)"):
            face.forward(a, b, out=(a, stat))
        with pytest.raises(ValueError, match=r"out: expected 2 array\(s\) \(y, stat\), got 1"):
            face.forward(a, b, out=y)
        host_a, host_b = np.ones((4, 5), F32), np.ones(5, F32)
        with pytest.raises(ValueError, match=r"^dy: expected shape \(4, 5\) \(y's\), got \(5,\)"):
            face.backward_numpy(host_b, host_a, host_b)
        with pytest.raises(TypeError, match=r"^dy: expected dtype float32 \(y's\), got float16"):
            face.backward_numpy(host_a.astype(np.float16), host_a, host_b)
        with pytest.raises(ValueError, match=r"^stat: expected shape \(5,\) \(the forward's\), got \(4,\)"):
            face.backward_numpy(host_a, host_a, host_b, stat=np.ones(4, F32))
    finally:
        _face.FACES.pop(opdef.name)


# ---------------------------------------------------------------------------------------------------------------
# The native call path: _runtime.Launch (a candidate's launch, arguments bound once) and the prepared call's
# checks in C++, on stand-ins (no GPU): torch-like arrays take the torch branch (their module is torch's).
# ---------------------------------------------------------------------------------------------------------------
class TorchLikeArray:
    """What the faces read of a torch.Tensor on CUDA (shape, dtype, get_device, is_contiguous, data_ptr)."""

    __module__ = "torch.stand_in"

    def __init__(self, shape, ptr, dtype="float32", device=0, contiguous=True):
        self.shape, self.ptr, self.dtype, self.device, self.contiguous = tuple(shape), ptr, dtype, device, contiguous

    def get_device(self):
        return self.device

    def is_contiguous(self):
        return self.contiguous

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))


def test_native_launch_fills_its_slots_and_keeps_the_launch_contract():
    from graph_executor_v2.ops import in_ptr, in_ptrs, native_launch, out_ptr, out_ptrs, stream_arg

    calls = []
    launch = native_launch(lambda *args: calls.append(args) or "kernel name", in_ptr(1), "f16", out_ptr(0), 3.5,
                           in_ptrs(), out_ptrs(), stream_arg())
    assert launch([0x10, 0x20], [0x30], 7) is None  # the binding's return value is not part of the contract
    assert launch((0x11, 0), (0x31,), 0) is None
    assert calls == [(0x20, "f16", 0x30, 3.5, [0x10, 0x20], [0x30], 7), (0, "f16", 0x31, 3.5, (0x11, 0), (0x31,), 0)]
    with pytest.raises(IndexError, match=r"launch: needs 2 input\(s\) and 1 output\(s\), got 1 and 1"):
        launch([0x10], [0x30], 0)
    with pytest.raises(TypeError, match=r"expected launch\(ins, outs, stream\)"):
        launch([0x10, 0x20], [0x30])

    def failing(*args):
        raise RuntimeError("ge2 op 'test': CUDA error")

    with pytest.raises(RuntimeError, match="ge2 op 'test': CUDA error"):
        native_launch(failing, in_ptr(0))([1], [], 0)
    runtime = ge2.device.runtime()
    with pytest.raises(ValueError, match="kind: expected one of input, output, stream, inputs, outputs, got 'bias'"):
        runtime.LaunchSlot("bias", 0)
    with pytest.raises(ValueError, match="index: expected >= 0, got -1"):
        runtime.LaunchSlot("input", -1)
    with pytest.raises(TypeError, match="function: expected a callable"):
        runtime.Launch(3, ())


def test_c_launch_of_an_op_module_reports_its_errors():
    """An op module's C launch (bind_*: arguments converted once) through the runtime's Launch: its C++ exceptions
    come back as the face's exception types, with no GPU needed to reach the argument checks."""
    if not ge2._native.is_built("_ops_gemm"):
        pytest.skip("native modules are not built")
    from graph_executor_v2.ops import gemm, native_launch, softmax

    bind = gemm._native_module().bind_forward
    launch = native_launch(bind(0, 4, 4, "float32", False, False, 1.0, 0.0, "relu", 0.01, False, "tiled"))
    with pytest.raises(ValueError, match=r"m, n, k: every dimension must be >= 1, got 0, 4, 4"):
        launch([0x1000, 0x2000, 0, 0], [0x3000], 0)
    launch = native_launch(bind(2, 4, 4, "float32", False, False, 1.0, 0.0, "relu", 0.01, False, "tiled"))
    with pytest.raises(ValueError, match=r"a: null device pointer"):
        launch([0, 0x2000, 0, 0], [0x3000], None)
    with pytest.raises(IndexError, match=r"launch: needs"):
        native_launch(softmax._native_module().bind_forward("softmax", 1, 4, 1, "float32", "strided"))([], [], 0)
    with pytest.raises(ValueError, match=r"kernel: expected one of"):
        bind(2, 4, 4, "float32", False, False, 1.0, 0.0, "relu", 0.01, False, "fastest")
    with pytest.raises(TypeError, match=r"an op module's C launch takes the call's addresses only"):
        native_launch(bind(2, 4, 4, "float32", False, False, 1.0, 0.0, "relu", 0.01, False, "tiled"), 1)


def test_prepared_call_reads_torch_arrays_in_cpp(axpy, monkeypatch):
    """The torch branch of the native checks: shape, dtype, device and contiguity per call, data_ptr() for the
    address; an output kind seen once is remembered, and a new one is validated by the face first."""
    face, launches, _ = axpy
    made = []
    monkeypatch.setattr(ge2.device, "allocator", lambda template, shape, dtype, device: lambda: made.append(
        TorchLikeArray(shape, 0x90000 + 0x1000 * len(made), dtype, device)) or made[-1])
    a, b, y = TorchLikeArray((4, 5), 0x10000), TorchLikeArray((4, 5), 0x20000), TorchLikeArray((4, 5), 0x30000)
    run = face.prepare(a, b, alpha=2.0)
    assert run(TorchLikeArray((4, 5), 0x50000), b, out=y, stream=3) is y
    assert launches[-1] == ("fast", [0x50000, 0x20000], [0x30000], 3)
    new = run(a, b)
    assert isinstance(new, TorchLikeArray) and launches[-1][2] == [new.ptr]
    assert run(a, b, out=StandInArray((4, 5), 0x60000)).ptr == 0x60000  # another kind of output: validated, kept
    assert run(a, b, out=y) is y and launches[-1][2] == [0x30000]
    for wrong in (TorchLikeArray((5, 4), 0x10000), TorchLikeArray((4, 5), 0x10000, "float16"),
                  TorchLikeArray((4, 5), 0x10000, device=1), TorchLikeArray((4, 5), 0x10000, contiguous=False),
                  StandInArray((4, 5), 0x10000)):  # shape, dtype, device, contiguity, kind
        with pytest.raises(ValueError, match=r"a: expected an array like the prepared one \(TorchLikeArray"):
            run(wrong, b)
    with pytest.raises(TypeError, match=r"a: expected a CUDA device array"):
        run(np.ones((4, 5), F32), b)
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 5\), got \(5, 4\)"):
        run(a, b, out=TorchLikeArray((5, 4), 0x30000))
    with pytest.raises(ValueError, match=r"out: expected 1 array\(s\) \(y\), got 2"):
        run(a, b, out=(y, y))
    with pytest.raises(ValueError, match=r"out: must not overlap b"):
        run(a, b, out=TorchLikeArray((4, 5), 0x20010))
    with pytest.raises(TypeError, match=r"takes the inputs, out= and stream=, got 'alpha'"):
        run(a, b, alpha=1.0)
    with pytest.raises(TypeError, match=r"the prepared call takes 2 input\(s\), got 3"):
        run(a, b, b)
    with pytest.raises(TypeError, match="stream: expected None"):
        run(a, b, out=y, stream="fast")
    assert "<prepared face_test_axpy with kernel fast>" == repr(run)
