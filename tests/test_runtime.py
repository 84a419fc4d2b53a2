"""_runtime: devices, DeviceArray (host round trips, DLPack, CUDA array interface), streams, events, graph capture."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import dtypes

runtime_built = pytest.mark.skipif(not ge2._native.is_built("_runtime"), reason="_runtime is not built")


# ---------------------------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------------------------
def test_dtype_names_and_bfloat16_host_representation():
    assert dtypes.normalize(np.float16) == "float16"
    assert dtypes.normalize("bfloat16") == "bfloat16"
    assert dtypes.to_numpy("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    assert dtypes.itemsize("bfloat16") == 2 and dtypes.itemsize("int64") == 8
    with pytest.raises(TypeError, match=r"dtype: expected one of float32.*got 'float64'"):
        dtypes.normalize(np.float64)
    with pytest.raises(TypeError, match=r"weights: expected one of"):
        dtypes.normalize("complex64", "weights")


def test_stream_handle_accepts_every_kind():
    class TorchLike:
        cuda_stream = 1234

    class CupyLike:
        ptr = 99

    assert ge2.device.stream_handle(None) == 0
    assert ge2.device.stream_handle(7) == 7
    assert ge2.device.stream_handle(TorchLike()) == 1234
    assert ge2.device.stream_handle(CupyLike()) == 99
    with pytest.raises(TypeError, match="stream: expected None"):
        ge2.device.stream_handle("fast")


def test_view_of_rejects_host_objects():
    with pytest.raises(TypeError, match=r"x: expected a CUDA device array.*got ndarray"):
        ge2.device.view_of(np.zeros(3), "x")
    with pytest.raises(TypeError, match=r"x: expected a CUDA device array.*got list"):
        ge2.device.view_of([1, 2], "x")


@runtime_built
def test_no_gpu_means_zero_devices_and_clear_errors():
    if ge2.device_count() > 0:
        pytest.skip("this machine has a GPU")
    rt = ge2.device.runtime()
    assert rt.device_count() == 0 and not ge2.is_available()
    for call in (lambda: rt.DeviceArray.empty([2], "float32"), lambda: rt.Stream(), lambda: rt.Event(),
                 lambda: rt.device_properties(0), lambda: rt.DeviceArray.from_numpy(np.zeros(2, np.float32))):
        with pytest.raises(RuntimeError, match="no CUDA device is available"):
            call()
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        ge2.device.require_gpu("the demo")


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_device_properties():
    rt = ge2.device.runtime()
    assert rt.device_count() >= 1
    props = rt.device_properties(0)
    assert props["sm_count"] > 0 and props["total_memory"] > 1 << 30
    assert props["compute_capability"][0] >= 7 and isinstance(props["name"], str)
    free, total = rt.memory_info(0)
    assert 0 < free <= total
    with pytest.raises(ValueError, match=r"device: expected an index in \[0, "):
        rt.device_properties(rt.device_count())
    assert rt.runtime_version() >= 12000 and rt.driver_version() >= rt.runtime_version() // 1000 * 1000 - 1000


@pytest.mark.gpu
def test_arrays_and_streams_default_to_the_current_device():
    """A process driving GPU LOCAL_RANK (ge2.distributed.init sets it current) allocates there without naming it."""
    rt = ge2.device.runtime()
    last = rt.device_count() - 1
    previous = rt.current_device()
    rt.set_device(last)
    try:
        assert rt.DeviceArray.empty([4]).device == last
        assert rt.DeviceArray.from_numpy(np.ones(3, np.float32)).device == last
        assert rt.Stream().device == last and rt.Stream.default().device == last
    finally:
        rt.set_device(previous)
    with pytest.raises(ValueError, match=r"device: expected an index in \[0, "):
        rt.DeviceArray.empty([4], "float32", -2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtypes.ALL_DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 3, 4, 5)])
def test_host_round_trip(rng, dtype, shape):
    host = np.asarray(rng.standard_normal(shape) * 50).astype(dtypes.to_numpy(dtype))  # 0-d stays an array
    array = ge2.device.runtime().DeviceArray.from_numpy(host)
    assert array.shape == shape and array.dtype == dtype and array.is_contiguous
    assert array.nbytes == host.nbytes and array.size == host.size and array.itemsize == host.itemsize
    back = array.numpy()
    assert back.dtype == host.dtype and back.shape == host.shape
    bits = lambda a: np.atleast_1d(a).view(np.uint8)  # noqa: E731  (a 0-d array cannot change its itemsize)
    np.testing.assert_array_equal(bits(back), bits(host))  # bit-exact, NaN-safe


@pytest.mark.gpu
def test_poison_zero_reshape_and_copy():
    rt = ge2.device.runtime()
    array = rt.DeviceArray.empty([4, 6], "bfloat16")
    array.poison()
    assert np.isnan(array.numpy().astype(np.float32)).all()
    array.zero()
    assert (array.numpy().astype(np.float32) == 0).all()
    flat = array.reshape([24])
    assert flat.ptr == array.ptr and flat.shape == (24,)
    with pytest.raises(ValueError, match=r"cannot reshape \(4, 6\).*to \(5, 5\)"):
        array.reshape([5, 5])
    with pytest.raises(ValueError, match=r"array.shape: expected \(4, 6\), got \(6, 4\)"):
        array.copy_from_numpy(np.zeros((6, 4), ml_dtypes.bfloat16))
    with pytest.raises(ValueError, match=r"array.dtype: expected bfloat16, got float32"):
        array.copy_from_numpy(np.zeros((4, 6), np.float32))
    source = rt.DeviceArray.from_numpy(np.arange(24, dtype=np.float32))
    target = rt.DeviceArray.empty([24], "float32")
    rt.memcpy_device_to_device(target.ptr, source.ptr, source.nbytes)
    np.testing.assert_array_equal(target.numpy(), np.arange(24, dtype=np.float32))


@pytest.mark.gpu
def test_dlpack_with_torch_both_directions():
    torch = pytest.importorskip("torch")
    rt = ge2.device.runtime()
    for dtype in ("float32", "float16", "bfloat16", "int32", "int64", "uint8"):
        t = (torch.arange(12, device="cuda") * 3).to(getattr(torch, dtype)).reshape(3, 4)
        imported = ge2.device.as_device_array(t)
        assert imported.ptr == t.data_ptr() and imported.shape == (3, 4) and imported.dtype == dtype
        exported = torch.from_dlpack(imported)  # GE2 -> torch, same memory
        assert exported.data_ptr() == t.data_ptr()
        exported.add_(1)
        assert torch.equal(t, exported)
    strided = torch.zeros(4, 6, device="cuda").t()
    view = ge2.device.as_device_array(strided)
    assert view.strides == (1, 6) and not view.is_contiguous
    owned = rt.DeviceArray.from_numpy(np.arange(5, dtype=np.int64))
    shared = torch.utils.dlpack.from_dlpack(owned.__dlpack__())  # legacy unversioned capsule
    del owned  # the capsule keeps the memory alive
    assert shared.cpu().tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(TypeError, match="expected a CUDA array"):
        ge2.device.as_device_array(torch.zeros(3))


@pytest.mark.gpu
def test_cuda_array_interface_with_cupy_both_directions():
    cupy = pytest.importorskip("cupy")
    rt = ge2.device.runtime()
    c = cupy.arange(10, dtype=cupy.float32)
    imported = rt.DeviceArray.from_cuda_array_interface(c)
    assert imported.ptr == c.data.ptr and imported.shape == (10,)
    back = cupy.asarray(imported)  # through DeviceArray.__cuda_array_interface__
    back += 1
    assert float(c[3]) == 4.0
    via_dlpack = cupy.from_dlpack(rt.DeviceArray.from_numpy(np.ones(3, np.float16)))
    assert via_dlpack.dtype == np.float16 and float(via_dlpack.sum()) == 3.0
    with pytest.raises(ValueError, match="no typestr for bfloat16"):
        _ = rt.DeviceArray.empty([2], "bfloat16").__cuda_array_interface__


@pytest.mark.gpu
def test_streams_events_and_foreign_streams():
    rt = ge2.device.runtime()
    stream = rt.Stream()
    assert stream.owned and stream.handle != 0
    array = rt.DeviceArray.empty([1 << 20], "float32")
    start, end = rt.Event(), rt.Event()
    start.record(stream.handle)
    for _ in range(5):
        array.zero(stream.handle)
    end.record(stream.handle)
    end.synchronize()
    assert end.query() and stream.query()
    assert start.elapsed_ms(end) >= 0.0
    other = rt.Stream()
    end.wait_on(other.handle)
    other.synchronize()
    torch = pytest.importorskip("torch")
    ts = torch.cuda.Stream()
    wrapped = rt.Stream.wrap(ts.cuda_stream)
    assert not wrapped.owned and ge2.device.stream_handle(ts) == ts.cuda_stream
    wrapped.synchronize()
    assert rt.Stream.default().handle == 0


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay(rng):
    from graph_executor_v2.ops import gemm

    rt = ge2.device.runtime()
    stream = rt.Stream()
    a = rt.DeviceArray.from_numpy(rng.standard_normal((32, 16)).astype(np.float32))
    b = rt.DeviceArray.from_numpy(rng.standard_normal((16, 8)).astype(np.float32))
    y = rt.DeviceArray.empty([32, 8], "float32")
    gemm.forward(a, b, act="relu", out=y, stream=stream)  # warm up: plans and workspace exist before capture
    stream.synchronize()
    graph = rt.CudaGraph()
    with pytest.raises(ValueError, match="non-default stream"):
        graph.begin_capture(0)
    graph.begin_capture(stream.handle)
    gemm.forward(a, b, act="relu", out=y, stream=stream)
    graph.end_capture()
    assert graph.node_count >= 1
    kinds = graph.node_types  # every node counted once, by kind: the gemm's kernels among them, no host node
    assert sum(kinds.values()) == graph.node_count and kinds.get("kernel", 0) >= 1 and "host" not in kinds, kinds
    new_a = rng.standard_normal((32, 16)).astype(np.float32)
    a.copy_from_numpy(new_a)
    y.poison(stream.handle)  # same stream as the replay: a non-blocking stream does not wait for stream 0
    graph.replay(stream.handle)
    stream.synchronize()
    ge2.testing.assert_close(y.numpy(), gemm.reference(new_a, b.numpy(), act="relu")[0], "float32", 16)


@pytest.mark.gpu
def test_typed_views_share_the_memory_of_an_array(rng):
    rt = ge2.device.runtime()
    arena = rt.DeviceArray.empty([4096], "uint8")
    arena.poison()
    values = rng.standard_normal((8, 16)).astype(np.float16)
    view = arena.view(512, [8, 16], "float16")
    assert view.ptr == arena.ptr + 512 and view.shape == (8, 16) and view.dtype == "float16"
    view.copy_from_numpy(values)
    np.testing.assert_array_equal(arena.numpy()[512:512 + values.nbytes].view(np.float16).reshape(8, 16), values)
    assert (arena.numpy()[:512] == 0xFF).all()
    with pytest.raises(ValueError, match="offset: a view of 4096 bytes at offset 256 does not fit"):
        arena.view(256, [1024], "float32")
    with pytest.raises(ValueError, match="offset: a view of 4 bytes at offset 2"):
        arena.view(2, [1], "float32")
    del arena  # the view keeps the memory alive
    np.testing.assert_array_equal(view.numpy(), values)


@pytest.mark.gpu
def test_cuda_graph_replay_on_the_legacy_stream_after_a_failed_capture(rng):
    from graph_executor_v2.ops import gemm

    rt = ge2.device.runtime()
    stream = rt.Stream()
    a = rt.DeviceArray.from_numpy(rng.standard_normal((64, 32)).astype(np.float32))
    b = rt.DeviceArray.from_numpy(rng.standard_normal((32, 16)).astype(np.float32))
    y = rt.DeviceArray.empty([64, 16], "float32")
    gemm.forward(a, b, out=y, stream=stream)
    stream.synchronize()
    failed = rt.CudaGraph()
    failed.begin_capture(stream.handle)
    with pytest.raises(RuntimeError):
        stream.synchronize()  # not allowed during capture: the capture is invalidated
    failed.abort_capture()
    assert not failed.captured
    graph = rt.CudaGraph()
    graph.begin_capture(stream.handle)
    gemm.forward(a, b, out=y, stream=stream)
    graph.end_capture()
    assert graph.captured
    for _ in range(3):  # captured on a stream of its own, replayed on the legacy one: stream order is the caller's
        new_a = rng.standard_normal((64, 32)).astype(np.float32)
        a.copy_from_numpy(new_a, 0)
        y.poison(0)
        graph.replay(0)
        ge2.testing.assert_close(y.numpy(0), new_a.astype(np.float64) @ b.numpy(), "float32", 32)


@pytest.mark.gpu
def test_arrays_released_during_a_capture_are_freed_after_it(rng):
    """cudaFree during capture invalidates it (the likely cause of an attention capture failing at its next launch:
    Python's garbage collector freeing an old array mid-capture): the memory is freed when the capture ends."""
    rt = ge2.device.runtime()
    stream = rt.Stream()
    kept = rt.DeviceArray.from_numpy(np.zeros(256, np.float32))
    released = [rt.DeviceArray.empty([1 << 20], "float32") for _ in range(3)]
    graph = rt.CudaGraph()
    graph.begin_capture(stream.handle)
    del released[:]  # the last references: the allocations are released inside the capture
    kept.poison(stream.handle)
    graph.end_capture()
    assert graph.captured and (kept.numpy() == 0).all()  # recorded, not run
    graph.replay(stream.handle)
    stream.synchronize()
    assert np.isnan(kept.numpy()).all()
    values = np.arange(8, dtype=np.float32)  # the thread allocates again: it is no longer capturing
    np.testing.assert_array_equal(rt.DeviceArray.from_numpy(values).numpy(), values)


@runtime_built
def test_nvtx_ranges_can_be_opened_and_closed_without_a_profiler():
    rt = ge2.device.runtime()
    rt.nvtx_push("ge2 test range")
    rt.nvtx_pop()
