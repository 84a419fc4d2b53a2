"""run() of a captured plan as one launch: the feed and fetch copies as memcpy nodes of the CUDA graph
(``backends/cuda.py``, ``CopyingGraph``; issue 22, section 5).

On the CPU, a fake runtime plays CUDA with host memory: its "graph" performs the copies with ``ctypes.memmove``
around a body that computes the plan's outputs from its input slots, so staging, address changes and refusals are
tested here, and ExecutorV2.run's path for a captured plan runs on a CPU plan given that fake graph. The GPU tests check the real graphs: numbers against float64 NumPy over many runs with fresh inputs,
every kind of feed and result, addresses that change between runs, and what explain() says.
"""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.runtime.backends.cuda import CopyingGraph
from graph_executor_v2.runtime.backends.reference import ReferenceBackend
from graph_executor_v2.testing import assert_close, mlp, random_array

SIZES = (128, 256, 11)


# --- the CPU: CopyingGraph on a fake runtime -----------------------------------------------------------------------
class FakeEvent:
    def __init__(self, timing=False):
        self.recorded = 0

    def record(self, stream):
        self.recorded += 1

    def synchronize(self):
        pass


class FakeLaunchedGraph:
    """What ``with_copies`` returns: copies (destination, source, bytes) around ``body``, replayed on the host."""

    def __init__(self, before, after, body, refuse):
        self.before, self.after, self.body, self.refuse = list(before), list(after), body, refuse
        self.replays, self.set_copies = 0, []

    def set_copy(self, index, destination, source, nbytes):
        if self.refuse:
            return False
        copies, position = ((self.before, index) if index < len(self.before)
                            else (self.after, index - len(self.before)))
        copies[position] = (destination, source, nbytes)
        self.set_copies.append(index)
        return True

    def replay(self, stream):
        self.replays += 1
        for destination, source, nbytes in self.before:
            ctypes.memmove(destination, source, nbytes)
        self.body()
        for destination, source, nbytes in self.after:
            ctypes.memmove(destination, source, nbytes)


class FakeCapturedGraph:
    def __init__(self, body):
        self.body, self.refuse, self.built, self.replays = body, False, [], 0

    def replay(self, stream):  # the plan alone (Plan.replay, or a run that copies outside the graph)
        self.replays += 1
        self.body()

    def with_copies(self, before, after):
        self.built.append(FakeLaunchedGraph(before, after, self.body, self.refuse))
        return self.built[-1]


def fake_runtime():
    return SimpleNamespace(Event=FakeEvent, pinned_empty=lambda nbytes: np.full(nbytes, 0xFF, np.uint8))


def slot_of(array):
    """A fake device slot: host memory with the attributes CopyingGraph reads."""
    return SimpleNamespace(ptr=array.ctypes.data, nbytes=array.nbytes, dtype=array.dtype.name, shape=array.shape,
                           array=array)


@pytest.fixture
def doubling_plan():
    """(x slot, empty slot, y slot, graph): a plan computing y = 2 x (float32, 4 x 3) with an empty second input."""
    x = np.full((4, 3), np.nan, np.float32)
    empty = np.zeros((0, 3), np.float32)
    y = np.full((4, 3), np.nan, np.float32)

    def body():
        y[...] = 2 * x

    return slot_of(x), slot_of(empty), slot_of(y), FakeCapturedGraph(body)


def test_host_feeds_and_results_go_through_staging_and_come_back_as_new_arrays(doubling_plan, rng):
    x_slot, empty_slot, y_slot, graph = doubling_plan
    copying = CopyingGraph(fake_runtime(), graph, [x_slot, empty_slot], [y_slot], (True, True), (True,))
    results = []
    for _ in range(3):
        x = rng.standard_normal((4, 3)).astype(np.float32)
        copying.stage([x, np.zeros((0, 3), np.float32)])
        assert copying.launch([None, None], [None], stream=7)
        results.append((x, copying.host_result(0, None, "out['y']")))
    assert len(graph.built) == 1 and graph.built[0].replays == 3 and graph.built[0].set_copies == []
    assert len(graph.built[0].before) == 1  # the empty input has no copy
    assert copying.finished.recorded == 3
    for x, y in results:  # every result is its own array: a later run never overwrites an earlier result
        np.testing.assert_array_equal(y, 2 * x)
    out = np.full((4, 3), np.nan, np.float32)
    assert copying.host_result(0, out, "out['y']") is out
    np.testing.assert_array_equal(out, results[-1][1])
    with pytest.raises(ValueError, match=r"out\['y'\]: expected a C-contiguous NumPy array"):
        copying.host_result(0, np.zeros((3, 4), np.float32).T, "out['y']")


def test_device_addresses_that_change_repoint_the_memcpy_nodes(doubling_plan, rng):
    x_slot, empty_slot, y_slot, graph = doubling_plan
    copying = CopyingGraph(fake_runtime(), graph, [x_slot, empty_slot], [y_slot], (False, False), (False,))
    feeds = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(2)]
    outs = [np.full((4, 3), np.nan, np.float32) for _ in range(2)]
    for x, y in [(feeds[0], outs[0]), (feeds[0], outs[0]), (feeds[1], outs[0]), (feeds[1], outs[1])]:
        copying.stage([None, None])
        assert copying.launch([x.ctypes.data, 0], [y.ctypes.data], stream=0)
        np.testing.assert_array_equal(y, 2 * x)
    launched = graph.built[0]
    assert launched.set_copies == [0, 1]  # the feed moved once, then the result: nothing else was touched
    assert copying.finished.recorded == 0  # no staging buffer: nothing waits for the launch


def test_a_refused_address_launches_nothing(doubling_plan, rng):
    x_slot, empty_slot, y_slot, graph = doubling_plan
    copying = CopyingGraph(fake_runtime(), graph, [x_slot, empty_slot], [y_slot], (False, False), (True,))
    x = rng.standard_normal((4, 3)).astype(np.float32)
    assert copying.launch([x.ctypes.data, 0], [None], stream=0)
    graph.built[0].refuse = True
    other = x + 1
    assert not copying.launch([other.ctypes.data, 0], [None], stream=0)
    assert graph.built[0].replays == 1
    np.testing.assert_array_equal(copying.host_result(0, None, "out['y']"), 2 * x)


class HostCopyingBackend(ReferenceBackend):
    """The CPU backend with CUDA's face for a captured plan's run(): its CopyingGraph on the fake runtime."""

    asynchronous = True

    def copying_graph(self, graph, input_slots, output_slots, host_inputs, host_outputs):
        return CopyingGraph(fake_runtime(), graph, [slot_of(s) for s in input_slots],
                            [slot_of(s) for s in output_slots], host_inputs, host_outputs)


def test_executor_run_of_a_captured_plan_is_one_launch_of_its_copying_graph(rng):
    """ExecutorV2.run's path for a captured plan, driven on the CPU: the fake graph runs the plan's steps between
    its copies; host feeds and results, new arrays and out=, against float64 NumPy."""
    g, reference = mlp(rng, SIZES, "float32", "relu", batch=16)
    executor = ge2.ExecutorV2(g, device="cpu")
    plan = executor.plans[0]

    def body():
        for step in plan.steps:
            step.launch(step.ins, step.outs, None)

    executor._backend = HostCopyingBackend()
    plan.cuda_graph = FakeCapturedGraph(body)
    results, out = [], np.full((16, SIZES[-1]), np.nan, np.float32)
    for step in range(4):
        x = random_array(rng, (16, SIZES[0]), "float32")
        if step % 2:
            assert executor.run({"x": x}, out={"y": out})["y"] is out
            results.append((x, out.copy()))
        else:
            results.append((x, executor.run({"x": x})["y"]))
    for x, y in results:
        assert_close(y, reference(x), "float32", max(SIZES))
    ((kind, copying),) = plan.copying_graphs.items()
    assert kind == ((True,), (True,))
    assert len(plan.cuda_graph.built) == 1 and copying.launched.replays == 4
    assert "run(): 1 host / 0 device feed(s), 1 host / 0 device result(s): one launch" in executor.explain()
    assert plan.cuda_graph.replays == 0
    plan.copying_graphs[kind] = "copies outside the graph (refused)"  # that kind of run then copies outside it
    x = random_array(rng, (16, SIZES[0]), "float32")
    assert_close(executor.run({"x": x})["y"], reference(x), "float32", max(SIZES))
    assert plan.cuda_graph.replays == 1 and copying.launched.replays == 4
    assert "1 host / 0 device result(s): copies outside the graph (refused)" in executor.explain()


# --- the GPU: real graphs ------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_with_copies_runs_the_copies_around_the_graph_and_set_copy_repoints_them():
    runtime = ge2.device.runtime()
    a, b = (runtime.DeviceArray.empty([256], "float32") for _ in range(2))
    stream = runtime.Stream()
    graph = runtime.CudaGraph()
    graph.begin_capture(stream.handle)
    runtime.memcpy_device_to_device(b.ptr, a.ptr, a.nbytes, stream.handle)  # the "plan": b = a
    graph.end_capture()
    feeds = [runtime.pinned_empty(1024).view(np.float32) for _ in range(2)]
    result = runtime.pinned_empty(1024).view(np.float32)
    feeds[0][:], feeds[1][:], result[:] = np.arange(256), -np.arange(256), np.nan
    launched = graph.with_copies([(a.ptr, feeds[0].ctypes.data, 1024)], [(result.ctypes.data, b.ptr, 1024)])
    assert launched.node_count == 3
    launched.replay(stream.handle)
    stream.synchronize()
    np.testing.assert_array_equal(result, np.arange(256))
    assert launched.set_copy(0, a.ptr, feeds[1].ctypes.data, 1024)
    launched.replay(stream.handle)
    stream.synchronize()
    np.testing.assert_array_equal(result, -np.arange(256))
    with pytest.raises(IndexError, match="index: expected < 2 copies, got 2"):
        launched.set_copy(2, a.ptr, b.ptr, 1024)
    with pytest.raises(RuntimeError, match="with_copies: nothing has been captured"):
        runtime.CudaGraph().with_copies([], [])


@pytest.mark.gpu
def test_every_kind_of_run_is_one_launch_with_the_right_numbers(rng):
    """Host and device feeds, host and device results (new arrays and out=), addresses that change from run to run,
    and no synchronisation between runs that return device results (a host feed's staging buffer is reused only
    once the last launch has read it): every result checked against float64 NumPy after the last run."""
    runtime = ge2.device.runtime()
    sizes = (512, 1024, 64)  # enough work per run that the host gets ahead of the GPU between runs
    g, reference = mlp(rng, sizes, "float32", "gelu", batch=1024)
    ex = ge2.ExecutorV2(g, device="cuda")
    shape = (1024, sizes[-1])
    host_out = np.full(shape, np.nan, np.float32)
    kinds = ["host in, host out", "device in, device out", "host in, host out=", "host in, device out=",
             "device in, host out="]
    checks = []  # (x, what, the result: a host array, or a device array read after the last run)
    for step in range(3 * len(kinds)):
        x = random_array(rng, (1024, sizes[0]), "float32")
        kind = kinds[step % len(kinds)]
        feed = x if kind.startswith("host in") else runtime.DeviceArray.from_numpy(x)
        if kind.endswith("out="):
            out = host_out if "host out" in kind else runtime.DeviceArray.empty(list(shape), "float32")
            if "device out" in kind:
                out.poison()
            else:
                out[...] = np.nan
            assert ex.run({"x": feed}, out={"y": out})["y"] is out
            result = out.copy() if "host out" in kind else out  # host_out is reused; each device out is new
        else:
            result = ex.run({"x": feed})["y"]
            assert isinstance(result, np.ndarray if "host out" in kind else runtime.DeviceArray), kind
        checks.append((x, f"run {step}: {kind}", result))
    for x, what, result in checks:
        host = result if isinstance(result, np.ndarray) else result.numpy()
        assert_close(host, reference(x), "float32", max(sizes), what=what)
    plan = ex.plans[0]
    text = ex.explain()
    assert plan.cuda_graph is not None, text
    assert len(plan.copying_graphs) == 4, text  # the first run ran node by node and captured the plan
    for copying in plan.copying_graphs.values():
        assert not isinstance(copying, str), text
        assert copying.launched.node_count == 3, text  # the feed's copy, the plan (a child graph), the result's copy
    assert "run(): 1 host / 0 device feed(s), 1 host / 0 device result(s): one launch" in text


@pytest.mark.gpu
def test_torch_tensors_run_in_one_launch_and_bad_feeds_still_raise(rng):
    torch = pytest.importorskip("torch")
    g, reference = mlp(rng, SIZES, "float16", "relu", batch=32)
    ex = ge2.ExecutorV2(g, device="cuda")
    for _ in range(4):  # a new torch tensor in and out every run: the memcpy nodes follow their addresses
        x = random_array(rng, (32, SIZES[0]), "float16")
        y = ex.run({"x": torch.from_numpy(x).cuda()})["y"]
        assert isinstance(y, torch.Tensor) and y.is_cuda
        assert_close(y.cpu().numpy(), reference(x), "float16", max(SIZES))
    strided = torch.empty((SIZES[0], 32), dtype=torch.float16, device="cuda").t()
    with pytest.raises(ValueError, match="input 'x': expected a contiguous array"):
        ex.run({"x": strided})
    with pytest.raises(ValueError, match=r"out\['y'\]: expected a contiguous array"):
        ex.run({"x": torch.from_numpy(x).cuda()},
               out={"y": torch.empty((SIZES[-1], 32), dtype=torch.float16, device="cuda").t()})
    (copying,) = ex.plans[0].copying_graphs.values()
    assert copying.launched.node_count == 3
