"""GE2 as an ONNX backend (``onnx.backend.base.Backend``), so ONNX's own conformance runner can test it.

``Backend.prepare(model, device)`` imports the model (``frontend.onnx.load``) and compiles it with ``ExecutorV2``
on the CPU backend (``device="CPU"``: the NumPy references) or on the GPU (``"CUDA"``). ``conformance_report()``
runs every ONNX node test whose op types GE2 claims (``supported_op_types()``) and returns the pass rate and every
failure with its reason; ``python -m graph_executor_v2 onnx-conformance`` prints it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .._optional import require

onnx = require("onnx", "the ONNX conformance runner (ge2.frontend.onnx_backend)")
from onnx.backend.base import Backend, BackendRep  # noqa: E402 (after the check that names the extra)

from ..runtime import ExecutorV2  # noqa: E402
from .onnx import UnsupportedModelError, _dtype_names, load, supported_op_types  # noqa: E402

# ONNX's reference computes float32 exactly: strict FP32, no TF32 convolutions (GE2's default, as PyTorch's)
PRECISION = "highest"
# Kernels in priority order, not by timing: a conformance result (and the expected failures of one kernel, such as
# cuDNN's float16 attention) must not depend on which candidate won a race on this GPU.
AUTOTUNE = False

_DEVICES = {"CPU": "cpu", "CUDA": "cuda"}


class Ge2BackendRep(BackendRep):
    """A compiled model: ``run(inputs)`` takes the inputs in the model's order and returns its outputs in order.

    Inputs that an op needs when the graph is built (a Reshape's shape fed as a graph input) are bound at run time:
    the model is compiled once per distinct value of those inputs, and the compiled executors are kept."""

    def __init__(self, model, device: str, input_names: list[str], output_names: list[str],
                 constant_inputs: frozenset):
        self.model = model
        self.device = device
        self.input_names = input_names
        self.output_names = output_names
        self.constant_inputs = constant_inputs
        self._executors: dict[tuple, ExecutorV2] = {}
        if not constant_inputs:
            self._executors[()] = ExecutorV2(load(model), device=device, precision=PRECISION,
                                                 autotune=AUTOTUNE)

    def _executor_for(self, feeds: dict) -> ExecutorV2:
        """The executor compiled for the values of the constant inputs in ``feeds``; an import that finds more
        inputs it needs as values (one rule reports one at a time) adds them and tries again."""
        while True:
            fixed = {name: np.asarray(feeds[name]) for name in sorted(self.constant_inputs)}
            key = tuple((name, array.dtype.str, array.shape, array.tobytes()) for name, array in fixed.items())
            if key in self._executors:
                return self._executors[key]
            try:
                graph = load(self.model, constant_inputs=fixed)
            except UnsupportedModelError as error:
                if not error.constant_inputs or error.constant_inputs <= self.constant_inputs:
                    raise
                self.constant_inputs = self.constant_inputs | error.constant_inputs
                continue
            executor = self._executors[key] = ExecutorV2(graph, device=self.device, precision=PRECISION,
                                                                 autotune=AUTOTUNE)
            return executor

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            if len(inputs) != len(self.input_names):
                raise ValueError(f"inputs: expected {len(self.input_names)} arrays ({self.input_names}), "
                                 f"got {len(inputs)}")
            feeds = dict(zip(self.input_names, inputs))
        executor = self._executor_for(feeds)
        for name in self.constant_inputs:
            feeds.pop(name)
        declared = {v.name: v.type.shape for v in executor.source_graph.inputs}
        results = executor.run({name: _as_declared(np.ascontiguousarray(value), declared.get(name))
                                for name, value in feeds.items()})
        return tuple(results[name] for name in self.output_names)


class Ge2Backend(Backend):
    @classmethod
    def supports_device(cls, device: str) -> bool:
        if device == "CUDA":
            from ..device import is_available

            return is_available()
        return device == "CPU"

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        if device not in _DEVICES:
            raise ValueError(f"device: expected 'CPU' or 'CUDA', got {device!r}")
        super().prepare(model, device, **kwargs)  # onnx.checker
        try:
            load(model)
            constant_inputs = frozenset()
        except UnsupportedModelError as error:
            if not error.constant_inputs:
                raise
            constant_inputs = error.constant_inputs  # bound at run time, when their values come
        initializers = {i.name for i in model.graph.initializer}
        input_names = [i.name for i in model.graph.input if i.name not in initializers]
        output_names = [o.name for o in model.graph.output]
        return Ge2BackendRep(model, _DEVICES[device], input_names, output_names, constant_inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        raise NotImplementedError("GE2 runs whole models: use prepare(model).run(inputs)")


# ---------------------------------------------------------------------------------------------------------------
# Conformance: the node tests of the op types GE2 claims.
# ---------------------------------------------------------------------------------------------------------------
# Node tests of claimed op types that GE2 does not claim, with the reason: what they check is outside any backend's
# contract with the op, not a property of GE2's translation.
NOT_CLAIMED = {
    r"test_training_dropout(_default)?(_mask)?":
        "training-mode Dropout with a ratio above 0: the expected outputs are NumPy's Mersenne Twister stream for "
        "seed 0 (np.random.seed; uniform >= ratio), and ONNX leaves the random generator to the backend, so only "
        "that generator reproduces them (GE2 imports models for inference and refuses the node; ratio 0, the "
        "identity, is claimed and passes)",
}


def claimed_node_tests() -> list:
    """ONNX's node test cases that GE2 claims: every node of an op type ``load`` translates (``Constant``
    included) and every graph input and output of an element type GE2 has (float32, float16, bfloat16, int32, int64,
    uint8, bool: a test of float64, int8 or float8 data is outside GE2's types, not a failure of its ops), except
    those ``NOT_CLAIMED`` names."""
    from onnx.backend.test.loader import load_model_tests

    not_claimed = re.compile("^(" + "|".join(NOT_CLAIMED) + ")$")

    claimed_ops = set(supported_op_types()) | {"Constant"}
    claimed_types = set(_dtype_names())

    def claimed(case) -> bool:
        graph = case.model.graph
        tensors = list(graph.input) + list(graph.output)
        return ({n.op_type for n in graph.node} <= claimed_ops and not not_claimed.match(case.name)
                and all(t.type.tensor_type.elem_type in claimed_types for t in tensors))

    return [case for case in load_model_tests(kind="node") if case.model is not None and claimed(case)]


@dataclass
class ConformanceReport:
    device: str
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # test name -> first line of the reason

    @property
    def pass_rate(self) -> float:
        total = len(self.passed) + len(self.failed)
        return len(self.passed) / total if total else 0.0

    def format(self) -> str:
        total = len(self.passed) + len(self.failed)
        lines = [f"ONNX node tests of the op types GE2 claims ({self.device}): {len(self.passed)}/{total} passed "
                 f"({100 * self.pass_rate:.1f}%)"]
        lines += [f"  FAIL {name}: {reason}" for name, reason in sorted(self.failed.items())]
        return "\n".join(lines)


def run_case(case, device: str = "CPU") -> None:
    """Runs one ONNX node test case; raises AssertionError (or the import error) when GE2 disagrees."""
    from onnx.backend.test.runner import Runner

    rep = Ge2Backend.prepare(case.model, device)
    for inputs, expected in case.data_sets:
        outputs = [np.asarray(x) for x in rep.run([_as_array(x) for x in inputs])]
        # ONNX's own comparison (what its test runner applies: shapes, dtypes, the case's tolerances, two ulps
        # for bfloat16)
        Runner.assert_similar_outputs([_as_array(x) for x in expected], outputs, case.rtol, case.atol)


def conformance_report(device: str = "CPU") -> ConformanceReport:
    report = ConformanceReport(device)
    for case in claimed_node_tests():
        try:
            run_case(case, device)
            report.passed.append(case.name)
        except Exception as error:  # every failure is reported, whatever raised it
            report.failed[case.name] = _reason(error)
    return report


def _as_declared(array: np.ndarray, shape) -> np.ndarray:
    """A scalar fed as shape (1,) (or the reverse), as ONNX's test data sometimes does, gets the declared shape."""
    if shape is not None and array.shape != tuple(shape) and array.size == 1 and all(d == 1 for d in shape):
        return array.reshape(shape)
    return array


def _reason(error: Exception) -> str:
    if isinstance(error, UnsupportedModelError):
        return "; ".join(f"{op_type}: {reason}" for _, op_type, reason in error.problems)
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: " + " | ".join(lines[:3])


def _as_array(value):
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return np.asarray(value)
