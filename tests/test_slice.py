"""slice: ONNX normalization against Python slicing, references against closed forms, validation, inference and the
CPU executor (CPU); every dtype x slice bit-exact forward and backward, poisoned outputs, random slices, strided and
misaligned inputs, plan candidates and torch interop (GPU)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ir import Graph
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, Problem
from graph_executor_v2.ops import slice as sl

from data_movement import ALL_DTYPES, assert_same_bits, device, random_values

INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)

# (x shape, starts, ends, axes, steps): outer-axis blocks (one memcpy), every other column, whole rows with a row
# step (vectors), negative steps, empty slices, size-1 axes, rank 0, 1 and 5, sentinels, the ONNX clamping corner.
CASES = [
    ((10, 20), (2,), (8,), (0,), None),
    ((10, 20), (0, 1), (10, 20), None, (1, 2)),
    ((64, 128), (0,), (128,), (1,), (2,)),
    ((30, 64), (3,), (29,), (0,), (2,)),
    ((33, 48), (1, 8), (32, 40), None, None),
    ((7, 9, 11), (-1, 8, -2), (-8, 0, 1), None, (-1, -3, -2)),
    ((6, 40), (5,), (INT64_MIN,), (0,), (-1,)),
    ((5, 6), (3,), (3,), (1,), None),
    ((5, 6), (10,), (20,), (0,), None),
    ((2, 3, 4, 5, 6), (1, 0, -1), (2, 4, -100), (0, 2, 4), (1, 2, -1)),
    ((1, 40, 1), (0, 5), (1, 37), (0, 1), (1, 3)),
    ((9,), (-2,), (INT64_MIN,), None, (-1,)),
    ((9,), (0,), (INT64_MAX,), None, (4,)),
    ((4, 5), (-10,), (-10,), (1,), (-1,)),
    ((), (), (), None, None),
    ((3, 0, 4), (1,), (3,), (0,), None),
    ((4, 6, 8), (0, 0, 0), (4, 6, 8), None, None),
    ((3, 50, 16), (-1,), (INT64_MIN,), (1,), (-7,)),
]


# ---------------------------------------------------------------------------------------------------------------
# CPU: ONNX normalization and references against closed forms
# ---------------------------------------------------------------------------------------------------------------
def test_axis_slice_matches_python_slicing_and_the_onnx_corners():
    values = list(range(-9, 10)) + [INT64_MIN, INT64_MAX, -(2**31), 2**31 - 1]
    for extent, start, end, step in itertools.product(range(7), values, values, (1, 2, 3, -1, -2, -3)):
        first, count = sl.axis_slice(extent, start, end, step)
        taken = [first + i * step for i in range(count)]
        # As in ONNX Runtime: a start below -extent is clamped to 0 for negative steps as well (Python lands on -1
        # and takes nothing), and an INT_MAX end means "no end" (Python would clamp it to extent - 1).
        python_start = 0 if step < 0 and start < -extent else start
        python_end = None if end in (INT64_MAX, 2**31 - 1) else end
        expected = list(range(extent)[slice(python_start, python_end, step)])
        assert taken == expected, (extent, start, end, step)


def test_reference_closed_form():
    x = np.arange(24).reshape(2, 3, 4)
    y = sl.reference(x, starts=(1, -1), ends=(3, -100), axes=(2, 1), steps=(1, -2))
    np.testing.assert_array_equal(y, x[:, [2, 0]][:, :, [1, 2]])
    np.testing.assert_array_equal(sl.reference(x, (0,), (1,)), x[:1])
    np.testing.assert_array_equal(sl.reference(np.arange(5), (-10,), (-10,), steps=(-1,)), [0])  # the ONNX corners
    np.testing.assert_array_equal(sl.reference(np.arange(5), (3,), (INT64_MAX,), steps=(-1,)), [3, 2, 1, 0])
    assert sl.reference(x, (5,), (9,), axes=(-1,)).shape == (2, 3, 0)
    assert sl.reference(np.float32(2.0), (), ()).shape == ()


def test_reference_is_exact_for_every_dtype(rng):
    for dtype in ALL_DTYPES:
        x = random_values(rng, (5, 7), dtype)
        y = OPS["slice"].run_reference([x], {"starts": (4, 1), "ends": (-6, 7), "axes": None, "steps": (-2, 3)})[0]
        assert_same_bits(y, x[4::-2, 1:7:3], dtype)


@pytest.mark.parametrize("shape, starts, ends, axes, steps", [c for c in CASES if np.prod(c[0]) > 0])
def test_reference_backward_is_the_adjoint(rng, shape, starts, ends, axes, steps):
    attrs = {"starts": starts, "ends": ends, "axes": axes, "steps": steps}
    x = rng.standard_normal(shape)
    y = OPS["slice"].reference([x], attrs)[0]
    dy = rng.standard_normal(y.shape)
    (dx,) = OPS["slice"].reference_backward([x], [y], [dy], attrs)
    assert dx.shape == x.shape
    np.testing.assert_allclose(np.sum(dy * y), np.sum(dx * x), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(sl.reference(dx, starts, ends, axes, steps), dy)
    assert np.count_nonzero(dx) == np.count_nonzero(dy)  # everything off the slice is zero


# ---------------------------------------------------------------------------------------------------------------
# CPU: validation (every error names its argument), inference, graphs on the CPU executor
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(starts=(0,), ends=(1,), steps=(0,)), ValueError, r"steps: a step of 0 is not allowed"),
        (dict(starts=(0, 1), ends=(1,)), ValueError, r"ends: expected 2 entries \(one per start\), got 1"),
        (dict(starts=(0,), ends=(1,), axes=(0, 1)), ValueError, r"axes: expected 1 entries"),
        (dict(starts=(0,), ends=(1,), steps=(1, 1)), ValueError, r"steps: expected 1 entries"),
        (dict(starts=(0, 0), ends=(1, 1), axes=(1, -1)), ValueError, r"axes: each axis may be sliced once"),
        (dict(starts=(0,), ends=(1,), axes=(2,)), ValueError, r"axes: axis 2 is out of range for rank 2"),
        (dict(starts=(0,), ends=(1,), axes=(-3,)), ValueError, r"axes: axis -3 is out of range for rank 2"),
        (dict(starts=(0, 0, 0), ends=(1, 1, 1)), ValueError, r"starts: expected at most 2 entries"),
        (dict(starts=(0.5,), ends=(1,)), ValueError, r"attribute 'starts' must hold only ints"),
        (dict(starts=0, ends=(1,)), TypeError, r"attribute 'starts' expected tuple, got int"),
        (dict(starts=(0,), ends=(None,)), ValueError, r"attribute 'ends' must hold only ints"),
        (dict(starts=(0,), ends=(1,), axes=(True,)), ValueError, r"attribute 'axes' must hold only ints"),
    ],
)
def test_forward_numpy_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        sl.forward_numpy(np.ones((3, 4), np.float32), **kwargs)


def test_other_validation_errors():
    x = np.ones((3, 4), np.float32)
    with pytest.raises(TypeError, match=r"x: expected a NumPy array, got list"):
        sl.forward_numpy([[1.0]], (0,), (1,))
    with pytest.raises(TypeError, match=r"x: expected one of float32.*got 'float64'"):
        sl.forward_numpy(np.ones((3, 4)), (0,), (1,))
    with pytest.raises(ValueError, match=r"dy: expected shape \(2, 4\) \(the output's\), got \(3, 4\)"):
        sl.backward_numpy(x, x, (1,), (3,))
    with pytest.raises(TypeError, match=r"x: expected a NumPy array"):
        sl.backward_numpy(x, [[1.0]], (0,), (3,))
    with pytest.raises(ValueError, match=r"x: expected rank <= 8"):
        sl.geometry((1,) * 9, (0,), (1,))
    with pytest.raises(TypeError, match=r"x: expected a CUDA device array"):
        sl.forward(x, (0,), (1,))


def test_no_gpu_is_a_clear_error():
    if ge2.device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        sl.forward_numpy(np.ones((3, 4), np.float32), (0,), (1,))


def test_geometry_describes_every_axis():
    result = sl.geometry((7, 9, 11), starts=(-1, 2), ends=(INT64_MIN, 9), axes=(2, 0), steps=(-3, 2))
    assert result == sl.Geometry(starts=(2, 0, 10), steps=(2, 1, -3), shape=(3, 9, 4))  # 2,4,6 and 10,7,4,1


def test_opdef_infers_and_validates():
    t = TensorType
    attrs = lambda starts, ends, axes=None, steps=None: {"starts": starts, "ends": ends, "axes": axes,  # noqa: E731
                                                         "steps": steps}
    infer = OPS["slice"].infer
    assert infer([t((10, 20), "float16")], attrs((1,), (-1,), (1,), (2,))) == [t((10, 9), "float16")]
    assert infer([t(("n", 20), "int32")], attrs((0,), (10,), (1,))) == [t(("n", 10), "int32")]
    assert infer([t(("n", 20), "int32")], attrs((0, 5), (INT64_MAX, 6))) == [t(("n", 1), "int32")]
    # a count that does not depend on the extent: x[0:1], x[2:7:2], x[-1:], x[-4:-1]; a symbolic length where
    # 0 <= start <= end <= extent holds for every n >= 1 (ir/dims.py); a length that may be negative is refused
    for starts, ends, steps, count in (((0,), (1,), None, 1), ((2,), (7,), (2,), 3), ((-1,), (INT64_MAX,), None, 1),
                                       ((-4,), (-1,), None, 3), ((5,), (2,), None, 0),
                                       ((1,), (INT64_MAX,), None, "n-1"), ((0,), (-1,), (2,), "n//2"),
                                       ((0,), ("n",), None, "n"), (("n",), ("2*n",), None, 0)):
        assert infer([t(("n", 20), "int32")], attrs(starts, ends, (0,), steps)) == [t((count, 20), "int32")]
    assert infer([t(("n+1", 3), "int32")], attrs((1,), ("n+1",))) == [t(("n", 3), "int32")]
    assert infer([t(("n+1", 3), "int32")], attrs((0,), ("n",))) == [t(("n", 3), "int32")]
    assert infer([t((64, 3), "int32")], attrs(("n",), ("2*n",))) == [t(("n", 3), "int32")]  # x[n:2n], trusted
    for starts, ends, steps in (((1,), (-1,), None), ((0,), (3,), (-1,)), ((-2,), (3,), None),
                                ((2,), (INT64_MAX,), None)):
        with pytest.raises(ValueError, match=r"its length depends on the sizes in a way GE2 does not infer"):
            infer([t(("n", 20), "int32")], attrs(starts, ends, (0,), steps))
    with pytest.raises(ValueError, match=r"steps: a step of 0"):
        infer([t((4,), "float32")], attrs((0,), (4,), None, (0,)))
    candidates = selection.candidates(OPS["slice"])
    assert [c.name for c in candidates] == ["strided"] and candidates[0].always_works


def test_graph_builder_and_cpu_executor(rng):
    g = Graph("slices")
    x = g.input("x", (6, 10), "bfloat16")
    y = g.slice(x, starts=(-1, 1), ends=(INT64_MIN, 10), steps=(-2, 3))
    z = g.slice(y, starts=(1,), ends=(2,), axes=(-1,))
    assert y.type == TensorType((3, 3), "bfloat16") and z.type == TensorType((3, 1), "bfloat16")
    with pytest.raises(ValueError, match=r"node 's' \(slice\): steps: a step of 0"):
        g.slice(x, starts=(0,), ends=(1,), steps=(0,), name="s")
    with pytest.raises(ValueError, match=r"attribute 'starts' must hold only ints"):
        g.slice(x, starts=("0",), ends=(1,))
    g.output(y, "y")
    g.output(z, "z")
    value = random_values(rng, (6, 10), "bfloat16")
    out = ge2.ExecutorV2(g, device="cpu").run({"x": value})
    assert_same_bits(out["y"], value[::-2, 1::3], "bfloat16", "y")
    assert_same_bits(out["z"], value[::-2, 1::3][:, 1:2], "bfloat16", "z")


def test_matches_onnxruntime(rng):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only
    for _ in range(200):
        rank = int(rng.integers(1, 4))
        shape = tuple(int(e) for e in rng.integers(0, 7, size=rank))
        count = int(rng.integers(1, rank + 1))
        axes = tuple(int(a) for a in rng.permutation(rank)[:count])
        steps = tuple(int(s) * int(rng.choice((-1, 1))) for s in rng.integers(1, 4, size=count))
        sentinels = (INT64_MIN, INT64_MAX, -(2**31), 2**31 - 1)
        starts = tuple(int(v) if rng.random() < 0.8 else int(rng.choice(sentinels))
                       for v in rng.integers(-9, 10, size=count))
        ends = tuple(int(v) if rng.random() < 0.8 else int(rng.choice(sentinels))
                     for v in rng.integers(-9, 10, size=count))
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
        constants = [helper.make_tensor(name, TensorProto.INT64, (count,), values)
                     for name, values in (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))]
        node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
        graph = helper.make_graph([node], "slice", inputs, outputs, initializer=constants)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8  # what opset 13 needs; newer onnx writes versions older runtimes refuse
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        x = rng.standard_normal(shape).astype(np.float32)
        expected = session.run(None, {"x": x})[0]
        np.testing.assert_array_equal(sl.reference(x, starts, ends, axes, steps), expected,
                                      err_msg=f"{shape} starts {starts} ends {ends} axes {axes} steps {steps}")


def test_kernels_report_constraints():
    if not ge2._native.is_built("_ops_slice"):
        pytest.skip("_ops_slice is not built")
    assert [k["name"] for k in sl.kernels()] == ["strided"]


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _check_forward_and_backward(rng, poisoned, x, starts, ends, axes, steps, dtype, what):
    expected = sl.reference(x, starts, ends, axes, steps)
    out = poisoned(expected.shape, dtype)
    assert sl.forward(device(x), starts, ends, axes, steps, out=out) is out
    assert_same_bits(out.numpy(), expected, dtype, f"forward {what}")
    dy = random_values(rng, expected.shape, dtype)
    dx = poisoned(x.shape, dtype)
    assert sl.backward(device(dy), device(x), starts, ends, axes, steps, out=dx)[0] is dx
    assert_same_bits(dx.numpy(), sl.reference_backward(dy, x.shape, starts, ends, axes, steps), dtype,
                     f"backward {what}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape, starts, ends, axes, steps", CASES)
def test_every_dtype_and_slice(rng, poisoned, dtype, shape, starts, ends, axes, steps):
    x = random_values(rng, shape, dtype)
    _check_forward_and_backward(rng, poisoned, x, starts, ends, axes, steps, dtype,
                                f"{shape} starts {starts} ends {ends} axes {axes} steps {steps}")


@pytest.mark.gpu
def test_random_slices(rng, poisoned):
    for _ in range(80):
        rank = int(rng.integers(1, 6))
        shape = tuple(int(e) for e in rng.integers(1, 9, size=rank))
        if rng.random() < 0.5:
            shape = shape[:-1] + (int(rng.integers(16, 300)),)
        count = int(rng.integers(1, rank + 1))
        axes = tuple(int(a) for a in rng.permutation(rank)[:count])
        steps = tuple(int(s) * int(rng.choice((-1, 1))) for s in rng.integers(1, 4, size=count))
        starts = tuple(int(rng.integers(-shape[a] - 2, shape[a] + 2)) for a in axes)
        ends = tuple(int(rng.integers(-shape[a] - 2, shape[a] + 2)) for a in axes)
        dtype = str(rng.choice(ALL_DTYPES))
        x = random_values(rng, shape, dtype)
        _check_forward_and_backward(rng, poisoned, x, starts, ends, axes, steps, dtype,
                                    f"{dtype} {shape} starts {starts} ends {ends} axes {axes} steps {steps}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_large_slices(rng, dtype):
    # Every other column (the benchmark's case), a row block, a reversed column block: many blocks per launch.
    x = random_values(rng, (1024, 4098), dtype)
    for starts, ends, axes, steps in [((0,), (4098,), (1,), (2,)), ((100,), (900,), (0,), None),
                                      ((-9,), (INT64_MIN,), (1,), (-1,)), ((3, 8), (1000, 4000), None, (3, 1))]:
        assert_same_bits(sl.forward_numpy(x, starts, ends, axes, steps), sl.reference(x, starts, ends, axes, steps),
                         dtype, f"forward {starts} {ends} {axes} {steps}")
        dy = random_values(rng, sl.reference(x, starts, ends, axes, steps).shape, dtype)
        assert_same_bits(sl.backward_numpy(dy, x, starts, ends, axes, steps)[0],
                         sl.reference_backward(dy, x.shape, starts, ends, axes, steps), dtype,
                         f"backward {starts} {ends} {axes} {steps}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape, starts, ends, axes, steps", [
    ((6, 50304), (0,), (50257,), (1,), None),  # GPT-2's logits crop: aligned rows in, rows 2 bytes apart out (f16)
    ((5, 5003), (1,), (5000,), (1,), None),  # both sides off 16-byte alignment, each row by another amount
    ((3, 2, 4101), (1, 0, 7), (3, 2, 4100), None, None),  # outer dims above the rows, one of them sliced
    ((4, 4099), (3, 5), (INT64_MAX, 4099), (0, 1), (-1, 1)),  # a reversed outer axis
])
def test_long_unaligned_rows(rng, poisoned, dtype, shape, starts, ends, axes, steps):
    # Rows of at least 4 KB that are unit-stride but not 16-byte aligned take the row kernel (16-byte stores fed by
    # shifted aligned loads, the ragged bytes one by one), for every element size.
    x = random_values(rng, shape, dtype)
    _check_forward_and_backward(rng, poisoned, x, starts, ends, axes, steps, dtype,
                                f"{shape} starts {starts} ends {ends} axes {axes} steps {steps}")


@pytest.mark.gpu
def test_plan_candidate_and_cuda_executor(rng, poisoned):
    x = random_values(rng, (12, 70), "float16")
    attrs = {"starts": (1, -1), "ends": (11, INT64_MIN), "axes": None, "steps": (3, -2)}
    expected = OPS["slice"].reference([x], attrs)[0]
    problem = Problem("slice", (TensorType(x.shape, "float16"),), (TensorType(expected.shape, "float16"),), attrs)
    out, x_device = poisoned(expected.shape, "float16"), device(x)
    OPS["slice"].candidates[0].prepare(problem)([x_device.ptr], [out.ptr], 0)
    assert_same_bits(out.numpy(), expected, "float16", "candidate")
    g = Graph("slice")
    g.output(g.slice(g.input("x", x.shape, "float16"), **attrs), "y")
    assert_same_bits(ge2.ExecutorV2(g, device="cuda").run({"x": x})["y"], expected, "float16", "executor")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "int64"])
def test_torch_strided_and_misaligned(rng, dtype):
    torch = pytest.importorskip("torch")
    host = random_values(rng, (40, 3 * 64 + 1), dtype)
    as_int = getattr(torch, f"int{8 * host.itemsize}")
    base = torch.from_numpy(host.view(f"i{host.itemsize}")).cuda().view(getattr(torch, dtype))
    to_host = lambda t: t.cpu().view(as_int).numpy().view(host.dtype)  # noqa: E731
    for view, view_host in [(base[:, 1:], host[:, 1:]), (base[1:, ::3], host[1:, ::3]), (base.t(), host.T),
                            (base[:, 1:129].reshape(40, 2, 64), host[:, 1:129].reshape(40, 2, 64))]:
        for starts, ends, axes, steps in [((1,), (INT64_MAX,), (-1,), None), ((-1, 0), (INT64_MIN, 60), None, (-2, 1))]:
            expected = sl.reference(view_host, starts, ends, axes, steps)
            y = sl.forward(view, starts, ends, axes, steps)
            assert isinstance(y, torch.Tensor) and y.is_contiguous()
            assert_same_bits(to_host(y), expected, dtype, f"forward of a {tuple(view.stride())} view")
            dy_host = random_values(rng, expected.shape, dtype)
            dy = torch.from_numpy(dy_host.view(f"i{host.itemsize}")).cuda().view(getattr(torch, dtype))
            (dx,) = sl.backward(dy.t().contiguous().t() if dy.dim() == 2 else dy, view, starts, ends, axes, steps)
            assert_same_bits(to_host(dx), sl.reference_backward(dy_host, view.shape, starts, ends, axes, steps), dtype,
                             "backward of a strided dy")
