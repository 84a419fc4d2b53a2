"""transpose and reshape: references against closed forms, validation, inference and the CPU executor (CPU); every
dtype x kernel x shape bit-exact against the reference, backward, poisoned outputs, strided and misaligned inputs,
views, streams and torch interop (GPU)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ir import Graph
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, Problem
from graph_executor_v2.ops import transpose as tr

from data_movement import ALL_DTYPES, assert_same_bits, device, random_values

KERNELS = ("tiled_packed", "tiled", "strided")

# (x shape, perm): 2-d tiles (multiples of 32/64 and not), batched last-two-axes, inner axis kept, size-1 axes,
# small tile axes (strided), rank 0, 1, 5 and 8, empty arrays.
CASES = [
    ((64, 64), (1, 0)),
    ((33, 65), (1, 0)),
    ((130, 66), (1, 0)),
    ((8, 8), (1, 0)),
    ((1000, 3), (1, 0)),
    ((3, 1000), (-1, 0)),
    ((257, 1031), (1, 0)),
    ((4, 96, 40), (0, 2, 1)),
    ((3, 5, 70, 34), (0, 1, 3, 2)),
    ((6, 40, 10, 24), (0, 2, 1, 3)),
    ((5, 1, 7), (2, 1, 0)),
    ((1, 40, 1, 36), (3, 2, 1, 0)),
    ((9, 2, 40, 34), (0, 3, 2, 1)),
    ((3, 4, 5, 6, 7), (4, 2, 0, 3, 1)),
    ((2, 3, 4, 50, 60), (0, 1, 2, 4, 3)),
    ((2, 3, 2, 3, 2, 3, 2, 3), (7, 6, 5, 4, 3, 2, 1, 0)),
    ((2, 3, 2, 3, 2, 3, 2, 3), (0, 2, 4, 6, 1, 3, 5, 7)),
    ((7,), (0,)),
    ((), ()),
    ((0, 5), (1, 0)),
    ((4, 0, 3), (2, 0, 1)),
    ((16, 24), (0, 1)),
]


# ---------------------------------------------------------------------------------------------------------------
# CPU: references against closed forms
# ---------------------------------------------------------------------------------------------------------------
def test_reference_transpose_closed_form():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(tr.reference_transpose(x, (1, 0)), [[0, 3], [1, 4], [2, 5]])
    cube = np.arange(24).reshape(2, 3, 4)
    y = tr.reference_transpose(cube, (2, 0, 1))
    assert y.shape == (4, 2, 3)
    for i, j, k in itertools.product(range(4), range(2), range(3)):
        assert y[i, j, k] == cube[j, k, i]
    np.testing.assert_array_equal(tr.reference_transpose(cube, (-1, 0, -2)), tr.reference_transpose(cube, (2, 0, 1)))


def test_reference_is_exact_for_every_dtype(rng):
    for dtype in ALL_DTYPES:
        x = random_values(rng, (3, 4, 5), dtype)
        y = tr.TRANSPOSE.run_reference([x], {"perm": (1, 2, 0)})[0]
        assert_same_bits(y, np.transpose(x, (1, 2, 0)), dtype)
        z = tr.RESHAPE.run_reference([x], {"shape": (5, -1)})[0]
        assert_same_bits(z, x.reshape(5, 12), dtype)
    big = np.array([2**62 + 1, -(2**62) - 3], dtype=np.int64)
    assert tr.reference_transpose(big, (0,)).tolist() == big.tolist()


def test_reference_reshape_closed_form():
    x = np.arange(12.0)
    np.testing.assert_array_equal(tr.reference_reshape(x, (3, -1)), [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    assert tr.reference_reshape(x, (2, 1, 6)).shape == (2, 1, 6)
    assert tr.reference_reshape(np.zeros((0, 4)), (-1, 2)).shape == (0, 2)
    assert tr.reference_reshape(np.float32(3.0), (1, 1)).shape == (1, 1)


@pytest.mark.parametrize("shape, perm", [c for c in CASES if np.prod(c[0]) > 0])
def test_reference_backward_is_the_adjoint(rng, shape, perm):
    # For a linear map f, <dy, f(x)> = <f^T(dy), x>: the backward is the adjoint, and the inverse permutation.
    x = rng.standard_normal(shape)
    y = tr.TRANSPOSE.reference([x], {"perm": perm})[0]
    dy = rng.standard_normal(y.shape)
    (dx,) = tr.TRANSPOSE.reference_backward([x], [y], [dy], {"perm": perm})
    assert dx.shape == x.shape
    np.testing.assert_allclose(np.sum(dy * y), np.sum(dx * x), rtol=1e-12)
    np.testing.assert_array_equal(tr.reference_transpose(dx, perm), dy)
    (dx_reshape,) = tr.RESHAPE.reference_backward([x], [x.reshape(-1)], [dy.reshape(-1)], {"shape": (-1,)})
    np.testing.assert_array_equal(dx_reshape, dy.reshape(-1).reshape(shape))


def test_inverse_perm():
    for perm in itertools.permutations(range(4)):
        inverse = tr.inverse_perm(perm)
        assert tuple(perm[i] for i in inverse) == (0, 1, 2, 3)


# ---------------------------------------------------------------------------------------------------------------
# CPU: validation (every error names its argument), inference, graphs on the CPU executor
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "perm, rank, error, match",
    [
        ((1, 0, 2), 2, ValueError, r"perm: expected 2 axes \(the rank of x\), got 3"),
        ((0, 0), 2, ValueError, r"perm: expected a permutation of 0..1, got \(0, 0\) \(axis 0 appears"),
        ((0, -2), 2, ValueError, r"perm: expected a permutation of 0..1.*axis 0 appears"),
        ((0, 2), 2, ValueError, r"perm: axis 2 is out of range for rank 2"),
        ((0, -3), 2, ValueError, r"perm: axis -3 is out of range for rank 2"),
        ((0, 1.0), 2, TypeError, r"perm: expected ints, got float"),
        ((True, 0), 2, TypeError, r"perm: expected ints, got bool"),
        ("10", 2, TypeError, r"perm: expected a list or tuple of ints, got str"),
        (tuple(range(9)), 9, ValueError, r"x: expected rank <= 8, got rank 9"),
    ],
)
def test_check_perm_errors(perm, rank, error, match):
    with pytest.raises(error, match=match):
        tr.check_perm(perm, rank)


@pytest.mark.parametrize(
    "in_shape, shape, match",
    [
        ((2, 3), (4, -1), r"shape: cannot reshape \(2, 3\) \(6 elements\) into \(4, -1\)"),
        ((2, 3), (7,), r"shape: cannot reshape \(2, 3\) \(6 elements\) into \(7,\)"),
        ((2, 3), (-1, -1), r"shape: at most one -1 may be inferred"),
        ((2, 3), (-2, -3), r"shape: expected extents >= 0 and at most one -1"),
        ((0, 4), (-1, 0), r"shape: cannot reshape \(0, 4\) \(0 elements\) into \(-1, 0\)"),
        ((2,), (1,) * 9, r"shape: expected rank <= 8"),
    ],
)
def test_reshape_shape_errors(in_shape, shape, match):
    with pytest.raises(ValueError, match=match):
        tr.reshape_shape(in_shape, shape)


def test_forward_numpy_validates_before_device_work():
    x = np.ones((2, 3), np.float32)
    assert not hasattr(ge2.ops, "permute")
    with pytest.raises(ValueError, match=r"perm: expected 2 axes"):
        tr.forward_numpy(x, (0, 1, 2))
    with pytest.raises(ValueError, match=r"kernel: expected one of auto, tiled_packed, tiled, strided"):
        tr.forward_numpy(x, (1, 0), kernel="tiles")
    with pytest.raises(ValueError, match=r"shape: cannot reshape"):
        ge2.ops.reshape.forward_numpy(x, (5,))
    with pytest.raises(TypeError, match=r"x: expected a NumPy array, got list"):
        tr.forward_numpy([[1.0]], (1, 0))
    with pytest.raises(TypeError, match=r"x: expected one of float32, .*got 'float64'"):
        tr.forward_numpy(np.ones((2, 2)), (1, 0))
    with pytest.raises(ValueError, match=r"perm: expected 2 axes"):
        tr.backward_numpy(x.T, x, (0,))
    with pytest.raises(ValueError, match=r"dy: expected shape \(3, 2\)"):
        tr.backward_numpy(x, x, (1, 0))
    with pytest.raises(ValueError, match=r"dy: expected shape \(6,\)"):
        ge2.ops.reshape.backward_numpy(x, x, (-1,))
    with pytest.raises(TypeError, match=r"x: expected a CUDA device array"):
        tr.forward(x, (1, 0))


def test_no_gpu_is_a_clear_error():
    if ge2.device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        tr.forward_numpy(np.ones((2, 3), np.float32), (1, 0))


def test_opdefs_infer_and_validate():
    t = TensorType
    assert OPS["transpose"].infer([t(("n", 3, 5), "float16")], {"perm": (2, 0, 1)}) == [t((5, "n", 3), "float16")]
    assert OPS["transpose"].infer([t((2, 3), "int64")], {"perm": (-1, 0)}) == [t((3, 2), "int64")]
    assert OPS["reshape"].infer([t((4, 6), "bfloat16")], {"shape": (-1, 3, 2)}) == [t((4, 3, 2), "bfloat16")]
    assert OPS["reshape"].infer([t(("n", 6), "float32")], {"shape": (12, 2)}) == [t((12, 2), "float32")]
    # Symbolic dims: a -1 is the quotient of the symbolic element counts; symbolic targets pass through.
    assert OPS["reshape"].infer([t(("n", 6), "float32")], {"shape": (-1, 2)}) == [t(("3*n", 2), "float32")]
    assert OPS["reshape"].infer([t(("b", "s", 8), "float32")], {"shape": ("b", -1, 2, 4)}) == [
        t(("b", "s", 2, 4), "float32")]
    assert OPS["reshape"].infer([t((6, 8), "float32")], {"shape": ("b", 4)}) == [t(("b", 4), "float32")]
    with pytest.raises(ValueError, match=r"shape: cannot reshape \('n', 6\) into \(-1, 4\)"):
        OPS["reshape"].infer([t(("n", 6), "float32")], {"shape": (-1, 4)})
    with pytest.raises(ValueError, match=r"perm: expected 3 axes"):
        OPS["transpose"].infer([t((2, 3, 4), "float32")], {"perm": (1, 0)})
    assert [c.name for c in OPS["transpose"].candidates] == list(KERNELS)
    assert [c.always_works for c in selection.candidates(OPS["transpose"])] == [False, False, True]
    assert [c.name for c in OPS["reshape"].candidates] == ["copy"]
    assert OPS["reshape"].candidates[0].always_works


def test_graph_builders_and_errors():
    g = Graph()
    x = g.input("x", (4, 6), "float16")
    y = g.transpose(x, perm=(1, 0))
    z = g.reshape(y, shape=(3, -1))
    assert y.type == TensorType((6, 4), "float16") and z.type == TensorType((3, 8), "float16")
    with pytest.raises(ValueError, match=r"node 'bad' \(transpose\): perm: expected a permutation"):
        g.transpose(x, perm=(0, 0), name="bad")
    with pytest.raises(ValueError, match=r"attribute 'perm' must hold only ints"):
        g.transpose(x, perm=(0, "1"))
    with pytest.raises(ValueError, match=r"requires attribute 'perm'"):
        g.transpose(x)
    with pytest.raises(ValueError, match=r"node 'r' \(reshape\): shape: cannot reshape \(4, 6\)"):
        g.reshape(x, shape=(5, 5), name="r")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_cpu_executor_runs_transposes_and_reshapes(rng, dtype):
    g = Graph("moves")
    x = g.input("x", (2, 3, 4), dtype)
    y = g.transpose(g.reshape(x, shape=(6, 4)), perm=(1, 0))
    z = g.reshape(g.transpose(x, perm=(2, 0, 1)), shape=(-1,))
    g.output(y, "y")
    g.output(z, "z")
    value = random_values(rng, (2, 3, 4), dtype)
    out = ge2.ExecutorV2(g, device="cpu").run({"x": value})
    assert_same_bits(out["y"], value.reshape(6, 4).T, dtype, "y")
    assert_same_bits(out["z"], np.transpose(value, (2, 0, 1)).reshape(-1), dtype, "z")


def test_kernels_report_constraints():
    if not ge2._native.is_built("_ops_transpose"):
        pytest.skip("_ops_transpose is not built")
    assert [k["name"] for k in tr.kernels()] == list(KERNELS)
    native = tr._native_module()
    reason = lambda kernel, shape, perm, dtype="float16", x=256, y=256: native.unsupported_reason(  # noqa: E731
        kernel, list(shape), [int(s) for s in tr._layout.contiguous_strides(shape)], list(perm), dtype, x, y)
    assert reason("tiled_packed", (8192, 8192), (1, 0)) == ""
    assert reason("tiled", (8192, 8192), (1, 0), "float32") == ""
    assert "2-byte dtype" in reason("tiled_packed", (64, 64), (1, 0), "float32")
    assert "even" in reason("tiled_packed", (33, 64), (1, 0))
    assert "4-byte aligned" in reason("tiled_packed", (64, 64), (1, 0), x=258)
    assert ">= 8" in reason("tiled", (1000, 3), (1, 0))
    assert "stays innermost" in reason("tiled", (32, 2048, 16, 128), (0, 2, 1, 3))
    assert "plain copy" in reason("tiled", (5, 1, 7), (1, 0, 2))  # size-1 axes fold away: nothing moves
    assert reason("tiled", (3, 5, 1, 40, 8), (2, 0, 1, 4, 3)) == ""  # batch axes 3 x 5 fold into one
    assert reason("strided", (3, 4), (1, 0)) == ""
    with pytest.raises(ValueError, match="perm: expected a permutation"):
        reason("strided", (3, 4), (0, 0))


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _supported(kernel, shape, perm, dtype, x=256, y=256):
    native = tr._native_module()
    strides = list(tr._layout.contiguous_strides(shape))
    axes = tr.check_perm(perm, len(shape))  # the native module takes normalized (non-negative) axes
    return native.unsupported_reason(kernel, list(shape), strides, list(axes), dtype, x, y) == ""


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shape, perm", CASES)
def test_forward_every_dtype_and_kernel(rng, poisoned, dtype, shape, perm):
    x = random_values(rng, shape, dtype)
    expected = tr.reference_transpose(x, perm)
    ran = 0
    for kernel in ("auto",) + KERNELS:
        if kernel != "auto" and not _supported(kernel, shape, perm, dtype):
            with pytest.raises(ValueError, match=f"kernel: '{kernel}' cannot run this problem"):
                tr.forward(device(x), perm, kernel=kernel, out=poisoned(expected.shape, dtype))
            continue
        out = poisoned(expected.shape, dtype)
        result = tr.forward(device(x), perm, kernel=kernel, out=out)
        assert result is out
        assert_same_bits(out.numpy(), expected, dtype, f"{kernel} {shape} perm {perm}")
        ran += 1
    assert ran >= 2  # auto and strided at least


def _check_every_supported_kernel(rng, to_device, shape, perm, dtype):
    """Every kernel that takes the problem moves random values of ``shape`` exactly as the reference does."""
    x = random_values(rng, shape, dtype)
    expected = tr.reference_transpose(x, perm)
    for kernel in KERNELS:
        if _supported(kernel, shape, perm, dtype):
            y = tr.forward(to_device(x), perm, kernel=kernel)
            assert_same_bits(y.numpy(), expected, dtype, f"{kernel} {dtype} {shape} perm {perm}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int64"])
def test_tiled_kernels_on_large_and_ragged_shapes(rng, to_device, dtype):
    # Several waves of blocks, partial tiles on both axes, batch axes; packed tiles need even extents; long rows kept
    # whole but not 16-byte aligned (the strided kernel's row path).
    for shape, perm in [((1026, 2050), (1, 0)), ((1025, 2047), (1, 0)), ((3, 514, 258), (0, 2, 1)),
                        ((130, 2, 3, 96), (3, 1, 2, 0)), ((4, 4096, 64), (0, 2, 1)), ((3, 4, 4099), (1, 0, 2))]:
        _check_every_supported_kernel(rng, to_device, shape, perm, dtype)


@pytest.mark.gpu
def test_random_permutations_against_reference(rng, to_device):
    for _ in range(60):
        rank = int(rng.integers(1, 7))
        shape = tuple(int(e) for e in rng.integers(1, 9, size=rank))
        if rng.random() < 0.5:  # one longer axis, so tiles are exercised too
            shape = tuple(e * 13 if k == rank - 1 else e for k, e in enumerate(shape))
        perm = tuple(int(p) for p in rng.permutation(rank))
        dtype = str(rng.choice(ALL_DTYPES))
        _check_every_supported_kernel(rng, to_device, shape, perm, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_forward_numpy_and_backward(rng, poisoned, to_device, dtype):
    for shape, perm in [((37, 70), (1, 0)), ((2, 3, 40, 48), (0, 2, 3, 1)), ((5,), (0,))]:
        x = random_values(rng, shape, dtype)
        assert_same_bits(tr.forward_numpy(x, perm), tr.reference_transpose(x, perm), dtype)
        dy = random_values(rng, tr.reference_transpose(x, perm).shape, dtype)
        (expected,) = tr.TRANSPOSE.reference_backward([x], [None], [dy], {"perm": perm})
        out = poisoned(shape, dtype)
        assert tr.backward(to_device(dy), to_device(x), perm, out=out)[0] is out
        assert_same_bits(out.numpy(), expected, dtype, f"backward {shape} perm {perm}")
        assert_same_bits(tr.backward_numpy(dy, x, perm)[0], expected, dtype)
        flat = random_values(rng, (int(np.prod(shape)),), dtype)
        assert_same_bits(ge2.ops.reshape.backward_numpy(flat, x, (-1,))[0], flat.reshape(shape), dtype)
        assert_same_bits(ge2.ops.reshape.forward_numpy(x, (-1,)), x.reshape(-1), dtype)


@pytest.mark.gpu
def test_reshape_is_a_view_of_contiguous_arrays(rng, poisoned, to_device):
    x = to_device(random_values(rng, (4, 6), "float16"))
    view = ge2.ops.reshape.forward(x, (3, -1))
    assert view.ptr == x.ptr and view.shape == (3, 8)
    (dx,) = ge2.ops.reshape.backward(view, x, (3, -1))
    assert dx.ptr == x.ptr and dx.shape == (4, 6)
    out = poisoned((2, 12), "float16")
    assert ge2.ops.reshape.forward(x, (2, 12), out=out) is out and out.ptr != x.ptr
    assert_same_bits(out.numpy(), x.numpy().reshape(2, 12), "float16")
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 12\), got \(24,\)"):
        ge2.ops.reshape.forward(x, (2, 12), out=poisoned((24,), "float16"))
    with pytest.raises(ValueError, match=r"out: must not overlap x"):
        ge2.ops.reshape.forward(x, (24,), out=ge2.ops.reshape.forward(x, (24,)))


@pytest.mark.gpu
def test_plan_candidates_launch_on_raw_pointers(rng, poisoned, to_device):
    for dtype, shape, perm in [("float16", (96, 130), (1, 0)), ("float32", (3, 40, 72), (2, 0, 1)),
                               ("int32", (6, 10, 12, 16), (0, 2, 1, 3))]:
        x = random_values(rng, shape, dtype)
        expected = tr.reference_transpose(x, perm)
        problem = Problem("transpose", (TensorType(shape, dtype),), (TensorType(expected.shape, dtype),),
                          {"perm": perm})
        for candidate in OPS["transpose"].candidates:
            if candidate.supports(problem) is not None:
                continue
            out, x_device = poisoned(expected.shape, dtype), to_device(x)
            candidate.prepare(problem)([x_device.ptr], [out.ptr], 0)
            assert_same_bits(out.numpy(), expected, dtype, f"candidate {candidate.name}")
        problem = Problem("reshape", (TensorType(shape, dtype),), (TensorType((x.size,), dtype),), {"shape": (-1,)})
        out, x_device = poisoned((x.size,), dtype), to_device(x)
        OPS["reshape"].candidates[0].prepare(problem)([x_device.ptr], [out.ptr], 0)
        assert_same_bits(out.numpy(), x.reshape(-1), dtype, "reshape copy")


@pytest.mark.gpu
def test_cuda_executor_matches_cpu(rng):
    g = Graph("moves")
    x = g.input("x", (8, 48, 40), "bfloat16")
    y = g.reshape(g.transpose(x, perm=(0, 2, 1)), shape=(-1, 48))
    g.output(g.transpose(y, perm=(1, 0)), "y")
    value = random_values(rng, (8, 48, 40), "bfloat16")
    expected = ge2.ExecutorV2(g, device="cpu").run({"x": value})["y"]
    assert_same_bits(ge2.ExecutorV2(g, device="cuda").run({"x": value})["y"], expected, "bfloat16")


@pytest.mark.gpu
def test_stream_argument(rng, to_device):
    runtime = ge2.device.runtime()
    stream = runtime.Stream()
    x = random_values(rng, (256, 384), "float16")
    y = tr.forward(to_device(x), (1, 0), stream=stream)
    stream.synchronize()
    assert_same_bits(y.numpy(), x.T, "float16")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int64"])
def test_torch_strided_misaligned_and_interop(rng, dtype):
    torch = pytest.importorskip("torch")
    torch_dtype = getattr(torch, dtype)
    host = random_values(rng, (70, 2 * 66 + 1), dtype)
    as_int = getattr(torch, f"int{8 * host.itemsize}")
    base = torch.from_numpy(host.view(f"i{host.itemsize}")).cuda().view(torch_dtype)

    def check(x_torch, x_host, perm, what):
        expected = tr.reference_transpose(x_host, perm)
        for kernel in ("auto",) + KERNELS:
            shape, strides = list(x_torch.shape), list(x_torch.stride())
            native = tr._native_module()
            if kernel != "auto" and native.unsupported_reason(kernel, shape, strides, list(perm), dtype,
                                                              x_torch.data_ptr(), 256):
                continue
            y = tr.forward(x_torch, perm, kernel=kernel)
            assert isinstance(y, torch.Tensor) and y.is_contiguous() and y.dtype == torch_dtype
            assert_same_bits(y.cpu().view(as_int).numpy().view(host.dtype), expected, dtype, f"{what} {kernel}")

    check(base[:, 1::2], host[:, 1::2], (1, 0), "every other column")  # odd offset: misaligned, strided
    check(base[:, 1:67], host[:, 1:67], (1, 0), "offset by one element")  # misaligned rows
    check(base[3:, :64].t(), host[3:, :64].T, (1, 0), "a transposed view")  # unit stride on axis 0
    check(base[:64, :128].reshape(64, 2, 64), host[:64, :128].reshape(64, 2, 64), (2, 1, 0), "a 3-d view")
    view = ge2.ops.reshape.forward(base[:, 1:67], (-1,))  # strided: gathered, then viewed
    assert view.is_contiguous()
    assert_same_bits(view.cpu().view(as_int).numpy().view(host.dtype), host[:, 1:67].reshape(-1), dtype,
                     "reshape of a strided view")
    contiguous = base[:4].contiguous()
    assert ge2.ops.reshape.forward(contiguous, (2, -1)).data_ptr() == contiguous.data_ptr()
    other = torch.float32 if dtype != "float32" else torch.float16
    with pytest.raises(TypeError, match=r"out: expected dtype"):
        tr.forward(contiguous, (1, 0), out=torch.empty(contiguous.shape[::-1], dtype=other,
                                                                    device="cuda"))
