"""The measurement plan_layouts chooses a float32 graph's layout by (issue 22: "from measurement, not assumption"):
a convolution timed in a given layout, as a plan of that one node on CUDA would run it.

``conv_layout_timer(executor_class, precision)`` returns ``measure(node, layout) -> ms``: the node's problem (its
shapes, dtype and attributes; the activations and the weight permuted into ``layout``, KCRS for NCHW and KRSC for
NHWC) becomes a graph of one conv2d, planned by ``executor_class`` (ExecutorV2, which builds its passes with this
timer) on CUDA with no passes and the same precision policy, so the plan's autotuner
chooses its kernel as the real plan will (the autotune cache keeps the races across processes); the chosen kernel's
launch is then timed between CUDA events. One measurement per distinct problem and layout.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node

TO_LAYOUT = {("NCHW", "NHWC"): (0, 2, 3, 1), ("NHWC", "NCHW"): (0, 3, 1, 2)}


def _permuted(shape, perm) -> tuple:
    return tuple(shape[axis] for axis in perm)


def _single_conv(node: Node, layout: str) -> Graph:
    """A graph of ``node``'s conv2d alone in ``layout``, every operand an input."""
    perm = TO_LAYOUT.get((node.attrs["layout"], layout))
    graph = Graph(f"{node.name}_{layout}")
    operands = []
    for index, value in enumerate(node.inputs):
        if value is None:
            operands.append(None)
            continue
        shape = tuple(value.type.shape)
        if perm is not None and index in (0, 1, 3):  # x, w and the residual follow the layout; the bias does not
            shape = _permuted(shape, perm)
        operands.append(graph.input(f"operand{index}", shape, value.type.dtype))
    graph.output(graph.conv2d(*operands, **{**node.attrs, "layout": layout}), "y")
    return graph


def conv_layout_timer(executor_class, precision: str):
    measured: dict[tuple, float] = {}

    def measure(node: Node, layout: str) -> float:
        key = (tuple((None if v is None else (tuple(v.type.shape), v.type.dtype)) for v in node.inputs),
               tuple(sorted((name, repr(value)) for name, value in node.attrs.items())), layout)
        if key not in measured:
            executor = executor_class(_single_conv(node, layout), device="cuda", passes=[], precision=precision,
                                      cuda_graph=False)
            plan = executor.plan()
            (step,) = [step for step in plan.steps if step.label.startswith("conv2d ")]
            stream = executor._stream_handles[step.stream]
            measured[key] = executor._backend.time_ms(lambda: step.launch(step.ins, step.outs, stream), stream)
        return measured[key]

    return measure
