"""optimizer: the float64 references (closed forms, schedules, clipping, loss scaling) on any machine; the fused
multi-tensor kernels against the references and against torch.optim on the GPU."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ops import optimizer as opt
from graph_executor_v2.testing import assert_close

gpu = pytest.mark.gpu


# ---------------------------------------------------------------------------------------------------------------
# Hyper-parameters
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arguments, name", [
    (dict(algorithm="adamw", lr=-1e-3), "lr"),
    (dict(algorithm="adam", lr=1e-3, betas=(1.0, 0.999)), r"betas\[0\]"),
    (dict(algorithm="adam", lr=1e-3, betas=(0.9, -0.1)), r"betas\[1\]"),
    (dict(algorithm="adam", lr=1e-3, betas=(0.9,)), "betas"),
    (dict(algorithm="adamw", lr=1e-3, eps=0.0), "eps"),
    (dict(algorithm="adamw", lr=1e-3, weight_decay=-0.1), "weight_decay"),
    (dict(algorithm="sgd", lr=0.1, momentum=-0.5), "momentum"),
    (dict(algorithm="sgd", lr=0.1, momentum=0.9, dampening=1.5), "dampening"),
    (dict(algorithm="sgd", lr=0.1, nesterov=True), "nesterov"),
    (dict(algorithm="sgd", lr=0.1, amsgrad=True), "amsgrad"),
    (dict(algorithm="rmsprop", lr=0.1), "algorithm"),
    (dict(algorithm="sgd", lr=0.1, schedule="step"), "schedule"),
    (dict(algorithm="sgd", lr=0.1, schedule="linear_warmup"), "warmup_steps"),
    (dict(algorithm="sgd", lr=0.1, schedule="cosine", warmup_steps=10, total_steps=10), "total_steps"),
    (dict(algorithm="sgd", lr=0.1, min_lr=0.2), "min_lr"),
    (dict(algorithm="sgd", lr=0.1, max_norm=0.0), "max_norm"),
    (dict(algorithm="sgd", lr=float("nan")), "lr"),
    (dict(algorithm="sgd", lr=0.1, init_scale=0.0), "init_scale"),
    (dict(algorithm="sgd", lr=0.1, growth_factor=1.0), "growth_factor"),
    (dict(algorithm="sgd", lr=0.1, backoff_factor=1.0), "backoff_factor"),
    (dict(algorithm="sgd", lr=0.1, growth_interval=0), "growth_interval"),
])
def test_bad_hyperparameters_name_the_argument(arguments, name):
    with pytest.raises(ValueError, match=name):
        opt.OptimizerConfig(**arguments)


def test_wrong_types_name_the_argument():
    with pytest.raises(TypeError, match="lr"):
        opt.OptimizerConfig("sgd", "0.1")
    with pytest.raises(TypeError, match="nesterov"):
        opt.OptimizerConfig("sgd", 0.1, momentum=0.9, nesterov=1)
    with pytest.raises(TypeError, match="warmup_steps"):
        opt.OptimizerConfig("sgd", 0.1, schedule="linear_warmup", warmup_steps=2.5)
    with pytest.raises(TypeError, match="config"):
        opt.ReferenceOptimizer({"algorithm": "sgd"})


def test_state_names():
    assert opt.OptimizerConfig("sgd", 0.1).state_names == ()
    assert opt.OptimizerConfig("sgd", 0.1, momentum=0.9).state_names == ("momentum_buffer",)
    assert opt.OptimizerConfig("adamw", 1e-3).weight_decay == 0.01  # torch.optim's defaults
    assert opt.OptimizerConfig("adam", 1e-3).weight_decay == 0.0
    assert opt.OptimizerConfig("adamw", 1e-3, amsgrad=True).state_names == ("exp_avg", "exp_avg_sq",
                                                                           "max_exp_avg_sq")


# ---------------------------------------------------------------------------------------------------------------
# References against closed forms
# ---------------------------------------------------------------------------------------------------------------
def _states(config, shape, dtype=np.float64):
    return {name: np.zeros(shape, dtype=dtype) for name in config.state_names}


def test_schedules_match_closed_forms():
    lr, warmup, total, floor = 0.4, 10, 110, 0.01
    constant = opt.OptimizerConfig("sgd", lr)
    linear = opt.OptimizerConfig("sgd", lr, schedule="linear_warmup", warmup_steps=warmup)
    cosine = opt.OptimizerConfig("sgd", lr, schedule="cosine", warmup_steps=warmup, total_steps=total, min_lr=floor)
    for step in (1, 5, 10, 11, 60, 110, 500):
        assert opt.scheduled_lr(constant, step) == lr
        assert opt.scheduled_lr(linear, step) == pytest.approx(lr * min(step, warmup) / warmup, rel=1e-15)
    assert opt.scheduled_lr(cosine, 5) == pytest.approx(lr * 0.5, rel=1e-15)
    assert opt.scheduled_lr(cosine, 10) == pytest.approx(lr, rel=1e-15)
    assert opt.scheduled_lr(cosine, 60) == pytest.approx((lr + floor) / 2, rel=1e-15)  # half way: cos = 0
    assert opt.scheduled_lr(cosine, 35) == pytest.approx(floor + (lr - floor) * (1 + math.cos(math.pi / 4)) / 2)
    assert opt.scheduled_lr(cosine, 110) == pytest.approx(floor, rel=1e-15)
    assert opt.scheduled_lr(cosine, 500) == pytest.approx(floor, rel=1e-15)


@pytest.mark.parametrize("algorithm", ["adam", "adamw"])
def test_adam_constant_gradient_closed_form(rng, algorithm):
    # With a constant gradient the bias-corrected moments are exactly g and |g|: p_t = p_0 - t * lr * g / (|g| + eps).
    config = opt.OptimizerConfig(algorithm, 1e-2, eps=1e-3, weight_decay=0.0)
    p0 = rng.standard_normal(17)
    g = rng.standard_normal(17)
    param, state = p0.copy(), _states(config, 17)
    for step in range(1, 8):
        opt.update_reference(config, step, config.lr, param, g, state)
    assert_close(param, p0 - 7 * config.lr * g / (np.abs(g) + config.eps), "float64")


def test_adamw_decay_is_decoupled(rng):
    # A zero gradient leaves the moments at 0, so AdamW only shrinks p by (1 - lr * wd) and Adam's L2 term moves it
    # by the Adam update of g = wd * p: lr * g / (|g| + eps), which is lr * sign(p) only up to eps (a p near 0 makes
    # the difference larger than float64's tolerance).
    p0 = rng.standard_normal(9) + 3.0
    adamw = opt.OptimizerConfig("adamw", 1e-2, weight_decay=0.1, eps=1e-12)
    param = p0.copy()
    opt.update_reference(adamw, 1, adamw.lr, param, np.zeros(9), _states(adamw, 9))
    assert_close(param, p0 * (1 - 1e-3), "float64")
    adam = opt.OptimizerConfig("adam", 1e-2, weight_decay=0.1, eps=1e-12)
    param = p0.copy()
    opt.update_reference(adam, 1, adam.lr, param, np.zeros(9), _states(adam, 9))
    decay = 0.1 * p0
    assert_close(param, p0 - 1e-2 * decay / (np.abs(decay) + 1e-12), "float64")


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_closed_form(rng, nesterov):
    # Constant g, dampening 0: buf_t = g * (1 + mu + ... + mu^(t-1)); nesterov steps by g + mu * buf_t.
    mu, lr, steps = 0.9, 0.1, 6
    config = opt.OptimizerConfig("sgd", lr, momentum=mu, nesterov=nesterov)
    p0, g = rng.standard_normal(5), rng.standard_normal(5)
    param, state = p0.copy(), _states(config, 5)
    for step in range(1, steps + 1):
        opt.update_reference(config, step, lr, param, g, state)
    buffers = [sum(mu ** k for k in range(t)) for t in range(1, steps + 1)]
    total = sum(1 + mu * b if nesterov else b for b in buffers)
    assert_close(param, p0 - lr * total * g, "float64")
    assert_close(state["momentum_buffer"], buffers[-1] * g, "float64")


def test_sgd_dampening_and_weight_decay(rng):
    config = opt.OptimizerConfig("sgd", 0.05, momentum=0.5, dampening=0.25, weight_decay=0.1)
    p, g1, g2 = rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(4)
    param, state = p.copy(), _states(config, 4)
    opt.update_reference(config, 1, 0.05, param, g1, state)
    d1 = g1 + 0.1 * p
    p1 = p - 0.05 * d1
    assert_close(param, p1, "float64")
    opt.update_reference(config, 2, 0.05, param, g2, state)
    buffer = 0.5 * d1 + 0.75 * (g2 + 0.1 * p1)
    assert_close(param, p1 - 0.05 * buffer, "float64")


def test_reference_clipping_scales_every_gradient(rng):
    config = opt.OptimizerConfig("sgd", 1.0, max_norm=0.5)
    grads = [rng.standard_normal(n) for n in (3, 1, 40)]
    params = [np.zeros_like(g) for g in grads]
    reference = opt.ReferenceOptimizer(config)
    reference.step(params, grads, [{} for _ in grads])
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
    assert reference.grad_norm == pytest.approx(norm, rel=1e-14)
    for param, grad in zip(params, grads):
        assert_close(param, -grad * 0.5 / (norm + 1e-6), "float64")
    assert opt.clip_coefficient(0.1, 0.5) == 1.0


def test_reference_loss_scaling_skips_and_grows(rng):
    config = opt.OptimizerConfig("sgd", 0.1, loss_scaling=True, init_scale=8.0, growth_interval=2)
    reference = opt.ReferenceOptimizer(config)
    param = rng.standard_normal(6)
    before = param.copy()
    grad = rng.standard_normal(6)
    reference.step([param], [np.where(np.arange(6) == 3, np.inf, grad * 8.0)], [{}])
    assert reference.skipped and reference.step_count == 0 and reference.loss_scale == 4.0
    np.testing.assert_array_equal(param, before)
    reference.step([param], [grad * 4.0], [{}])
    assert_close(param, before - 0.1 * grad, "float64")  # unscaled by 1 / 4
    assert (reference.step_count, reference.loss_scale, reference.good_steps) == (1, 4.0, 1)
    reference.step([param], [grad * 4.0], [{}])
    assert (reference.step_count, reference.loss_scale, reference.good_steps) == (2, 8.0, 0)


def test_reference_skip_nonfinite_drops_and_counts(rng):
    """skip_nonfinite (the trainer's non-finite check): an inf/NaN gradient drops the whole step, counts it and keeps
    the attempt of the first (step + nonfinite_steps); the learning rate schedule does not advance."""
    config = opt.OptimizerConfig("adam", 0.1, skip_nonfinite=True)
    assert config.needs_norm
    reference = opt.ReferenceOptimizer(config)
    params = [rng.standard_normal(4), rng.standard_normal(3)]
    states = [{name: np.zeros(len(p)) for name in config.state_names} for p in params]
    reference.step(params, [rng.standard_normal(4), rng.standard_normal(3)], states)
    before = [p.copy() for p in params] + [s[k].copy() for s in states for k in sorted(s)]
    for bad in (np.nan, np.inf):
        grads = [rng.standard_normal(4), rng.standard_normal(3)]
        grads[1][2] = bad
        reference.step(params, grads, states)
        assert reference.skipped
    after = [p.copy() for p in params] + [s[k].copy() for s in states for k in sorted(s)]
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)
    assert (reference.step_count, reference.nonfinite_steps, reference.first_nonfinite) == (1, 2, 2)
    reference.step(params, [rng.standard_normal(4), rng.standard_normal(3)], states)
    assert not reference.skipped and reference.step_count == 2 and reference.nonfinite_steps == 2
    with pytest.raises(TypeError, match="skip_nonfinite: expected a bool"):
        opt.OptimizerConfig("sgd", 0.1, skip_nonfinite=1)


# ---------------------------------------------------------------------------------------------------------------
# GPU: fused kernels against the float64 reference
# ---------------------------------------------------------------------------------------------------------------
def _host_low(values, dtype):
    return values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16)


class _Problem:
    """Parameters, states and gradients on the device with their float64 twins."""

    def __init__(self, rng, config, sizes, grad_dtype="float32", low_dtype=None, chunk_size=opt.DEFAULT_CHUNK_SIZE):
        runtime = ge2.device.runtime()
        self.rng, self.config, self.sizes, self.grad_dtype = rng, config, sizes, grad_dtype
        self.host_params = [rng.standard_normal(n).astype(np.float32) for n in sizes]
        self.params = [runtime.DeviceArray.from_numpy(p) for p in self.host_params]
        self.host_states = [{name: np.zeros(n, dtype=np.float64) for name in config.state_names} for n in sizes]
        self.states = [[runtime.DeviceArray.from_numpy(np.zeros(n, dtype=np.float32)) for _ in config.state_names]
                       for n in sizes]
        self.grads = [runtime.DeviceArray.empty([n], grad_dtype) for n in sizes]
        self.lows = None
        if low_dtype is not None:
            self.lows = []
            for n in sizes:
                low = runtime.DeviceArray.empty([n], low_dtype)
                low.poison()
                self.lows.append(low)
        self.reference_params = [p.astype(np.float64) for p in self.host_params]
        self.reference = opt.ReferenceOptimizer(config)
        self.fused = opt.FusedOptimizerStep.from_arrays(config, self.params, self.grads, self.states, self.lows,
                                                        chunk_size=chunk_size)

    def step(self, grads=None):
        if grads is None:
            grads = [(self.rng.standard_normal(n)).astype(np.float32) for n in self.sizes]
        rounded = [_round(g, self.grad_dtype) for g in grads]
        for device_grad, grad in zip(self.grads, rounded):
            device_grad.copy_from_numpy(grad)
        self.fused.launch()
        self.reference.step(self.reference_params, [g.astype(np.float64) for g in rounded], self.host_states)

    def check(self, dtype="float32", rtol=None):
        state = self.fused.read_state()
        assert state["step"] == self.reference.step_count
        for index, (param, expected) in enumerate(zip(self.params, self.reference_params)):
            got = param.numpy()
            if rtol is None:
                assert_close(got, expected, dtype, what=f"param {index}")
            else:
                np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol, err_msg=f"param {index}")
            if self.lows is not None:
                np.testing.assert_array_equal(self.lows[index].numpy().astype(np.float32),
                                              _host_low(got, self.lows[index].dtype).astype(np.float32),
                                              err_msg=f"low copy {index}")
        return state


def _round(values, dtype):
    if dtype == "float32":
        return values.astype(np.float32)
    return _host_low(values, dtype)


CONFIGS = {
    "sgd": dict(algorithm="sgd", lr=0.05),
    "sgd_momentum_wd": dict(algorithm="sgd", lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-2),
    "sgd_nesterov": dict(algorithm="sgd", lr=0.05, momentum=0.8, nesterov=True),
    "adam_l2": dict(algorithm="adam", lr=1e-2, weight_decay=1e-2),
    "adamw": dict(algorithm="adamw", lr=1e-2, weight_decay=0.1),
    "adamw_amsgrad": dict(algorithm="adamw", lr=1e-2, amsgrad=True, betas=(0.8, 0.99)),
    "adamw_cosine_clip": dict(algorithm="adamw", lr=1e-2, schedule="cosine", warmup_steps=3, total_steps=12,
                              min_lr=1e-3, max_norm=1.0),
    "sgd_warmup_clip": dict(algorithm="sgd", lr=0.1, momentum=0.9, schedule="linear_warmup", warmup_steps=4,
                            max_norm=2.0),
}


@gpu
@pytest.mark.parametrize("name", CONFIGS)
def test_fused_matches_reference_over_steps(rng, name):
    # Odd sizes, a size-1 tensor and a tensor of several chunks (chunk size 1000).
    config = opt.OptimizerConfig(**CONFIGS[name])
    problem = _Problem(rng, config, [1, 7, 1000, 2500, 333], chunk_size=1000)
    for _ in range(15):
        problem.step()
    # Float32 rounding compounds over 15 steps (Adam divides by sqrt(v)): 1e-4 relative.
    state = problem.check(rtol=1e-4)
    assert state["lr"] == pytest.approx(opt.scheduled_lr(config, 15), rel=1e-6)
    if config.max_norm is not None:
        assert state["grad_norm"] == pytest.approx(problem.reference.grad_norm, rel=1e-5)


@gpu
def test_many_tensors_and_large_tensor(rng):
    # 300 tensors over 3 chunk sizes' worth of rows (> any fixed-size argument table), one tensor of 5 chunks.
    sizes = [int(n) for n in rng.integers(1, 300, size=300)] + [5 * 4096 + 3]
    config = opt.OptimizerConfig("adamw", 1e-2, weight_decay=0.05)
    problem = _Problem(rng, config, sizes, chunk_size=4096)
    assert problem.fused.num_chunks == 300 + 6
    for _ in range(3):
        problem.step()
    problem.check(rtol=1e-5)


@gpu
@pytest.mark.parametrize("grad_dtype, low_dtype", [("float16", "float16"), ("bfloat16", "bfloat16"),
                                                   ("float32", "bfloat16"), ("float16", None)])
def test_mixed_precision_grads_and_low_copies(rng, grad_dtype, low_dtype):
    config = opt.OptimizerConfig("adamw", 1e-2, weight_decay=0.01)
    problem = _Problem(rng, config, [3, 1025, 64], grad_dtype=grad_dtype, low_dtype=low_dtype, chunk_size=512)
    for _ in range(5):
        problem.step()
    problem.check(rtol=1e-5)


@gpu
def test_two_dtype_groups_in_one_step(rng, to_device):
    # A float32-grad parameter and a float16-grad parameter with copies: two groups, one norm, one clip coefficient.
    config = opt.OptimizerConfig("sgd", 1.0, max_norm=0.1)
    g32 = rng.standard_normal(100).astype(np.float32)
    g16 = rng.standard_normal(50).astype(np.float16)
    params = [to_device(np.zeros(100, np.float32)), to_device(np.zeros(50, np.float32))]
    low = ge2.device.runtime().DeviceArray.empty([50], "float16")
    fused = opt.FusedOptimizerStep.from_arrays(config, params, [to_device(g32), to_device(g16)], [[], []],
                                               [None, low])
    fused.launch()
    norm = math.sqrt(float((g32.astype(np.float64) ** 2).sum() + (g16.astype(np.float64) ** 2).sum()))
    coef = 0.1 / (norm + 1e-6)
    # float32 sums of squares: the norm (and so the coefficient) agrees to ~1e-6 relative.
    assert fused.read_state()["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert_close(params[0].numpy(), -coef * g32.astype(np.float64), "float32")
    assert_close(params[1].numpy(), -coef * g16.astype(np.float64), "float32")
    np.testing.assert_array_equal(low.numpy(), params[1].numpy().astype(np.float16))


@gpu
def test_loss_scaling_overflow_skips_and_scale_grows(rng):
    config = opt.OptimizerConfig("adam", 1e-2, loss_scaling=True, init_scale=1024.0, growth_interval=3)
    problem = _Problem(rng, config, [5, 300], grad_dtype="float16", low_dtype="float16", chunk_size=128)
    scale = lambda: problem.fused.read_state()["loss_scale"]  # noqa: E731
    grads = [(rng.standard_normal(n) * scale()).astype(np.float32) for n in problem.sizes]
    problem.step(grads)
    before = [p.numpy() for p in problem.params]
    lows = [low.numpy() for low in problem.lows]
    grads[1][77] = np.inf
    problem.step(grads)
    state = problem.fused.read_state()
    assert (state["skipped"], state["step"], state["loss_scale"], state["good_steps"]) == (1, 1, 512.0, 0)
    for param, low, p0, l0 in zip(problem.params, problem.lows, before, lows):
        np.testing.assert_array_equal(param.numpy(), p0)
        np.testing.assert_array_equal(low.numpy(), l0)
    nan_grads = [(rng.standard_normal(n) * 512).astype(np.float32) for n in problem.sizes]
    nan_grads[0][0] = np.nan
    problem.step(nan_grads)
    assert problem.fused.read_state()["loss_scale"] == 256.0
    for _ in range(3):
        problem.step([(rng.standard_normal(n) * scale()).astype(np.float32) for n in problem.sizes])
    state = problem.check(rtol=1e-5)
    assert (state["skipped"], state["step"], state["loss_scale"], state["good_steps"]) == (0, 4, 512.0, 0)
    assert problem.reference.loss_scale == 512.0


@gpu
def test_device_schedule_at_chosen_steps(rng):
    config = opt.OptimizerConfig("sgd", 0.3, schedule="cosine", warmup_steps=4, total_steps=20, min_lr=0.01)
    problem = _Problem(rng, config, [8])
    seen = {}
    for step in range(1, 25):
        problem.step([np.zeros(8, np.float32)])
        seen[step] = problem.fused.read_state()["lr"]
    for step in (1, 2, 4, 5, 12, 19, 20, 24):
        assert seen[step] == pytest.approx(opt.scheduled_lr(config, step), rel=1e-6), step


@gpu
def test_set_state_and_control_addresses(rng):
    config = opt.OptimizerConfig("adam", 1e-3, loss_scaling=True)
    problem = _Problem(rng, config, [4])
    problem.fused.set_state(step=41, loss_scale=128.0, good_steps=7)
    state = problem.fused.read_state()
    assert (state["step"], state["loss_scale"], state["good_steps"]) == (41, 128.0, 7)
    assert problem.fused.control_address("loss_scale") == problem.fused.control_address("step") + 16
    with pytest.raises(ValueError, match="name"):
        problem.fused.control_address("momentum")
    with pytest.raises(ValueError, match="loss_scale"):
        problem.fused.set_state(step=0, loss_scale=0.0)


def test_buffer_copies_bad_rows_name_the_row():
    for row in ((0, 256, 4), (256, 256), (256, 512, -1)):
        with pytest.raises(ValueError, match=r"copies\[1\]: expected \(source, destination, bytes\)"):
            opt.BufferCopies([(256, 512, 4), row])
    if ge2._native.is_built("_ops_optimizer"):  # the native checks come before any launch
        native = ge2._native.load("_ops_optimizer")
        with pytest.raises(ValueError, match="entries: null device pointer"):
            native.copy_buffers(0, 3, 0)
        with pytest.raises(ValueError, match="count: expected >= 0, got -1"):
            native.copy_buffers(256, -1, 0)


@gpu
def test_buffer_copies_copy_every_row_in_one_launch(rng, to_device):
    """Rows of the sizes a step's buffer updates have (a 4-byte scale, a 64-byte history, batch norm's statistics)
    and unaligned ones (odd sizes and an odd offset: the byte path), each into a poisoned destination with a
    guard byte after it that must stay."""
    sizes = [4, 64, 4096 * 4, 6, 1 << 20 | 3]
    sources = [to_device(rng.integers(0, 256, size, dtype=np.uint8)) for size in sizes]
    destinations = [to_device(np.full(size + 1, 0xA5, np.uint8)) for size in sizes]
    offset_source = to_device(rng.integers(0, 256, 33, dtype=np.uint8))  # read from byte 1: unaligned
    offset_destination = to_device(np.full(32, 0xA5, np.uint8))
    rows = [(s.ptr, d.ptr, size) for s, d, size in zip(sources, destinations, sizes)]
    rows.append((offset_source.ptr + 1, offset_destination.ptr, 32))
    copies = opt.BufferCopies(rows)
    assert copies.count == len(sizes) + 1
    copies.launch()
    for source, destination, size in zip(sources, destinations, sizes):
        got = destination.numpy()
        np.testing.assert_array_equal(got[:size], source.numpy(), err_msg=f"{size} bytes")
        assert got[size] == 0xA5, f"{size} bytes: wrote past the end"
    np.testing.assert_array_equal(offset_destination.numpy(), offset_source.numpy()[1:])
    opt.BufferCopies([]).launch()  # nothing to copy: no launch


@gpu
def test_bad_arrays_name_the_argument(to_device):
    config = opt.OptimizerConfig("adamw", 1e-3)
    p = to_device(np.zeros(8, np.float32))
    g = to_device(np.zeros(8, np.float32))
    s = [to_device(np.zeros(8, np.float32)), to_device(np.zeros(8, np.float32))]
    with pytest.raises(TypeError, match=r"params\[0\]"):
        opt.FusedOptimizerStep.from_arrays(config, [to_device(np.zeros(8, np.float16))], [g], [s])
    with pytest.raises(ValueError, match=r"grads\[0\]"):
        opt.FusedOptimizerStep.from_arrays(config, [p], [to_device(np.zeros(7, np.float32))], [s])
    with pytest.raises(ValueError, match=r"states"):
        opt.FusedOptimizerStep.from_arrays(config, [p], [g], [s[:1]])
    with pytest.raises(TypeError, match=r"states\[0\]\[1\]"):
        opt.FusedOptimizerStep.from_arrays(config, [p], [g], [[s[0], to_device(np.zeros(8, np.float16))]])
    with pytest.raises(ValueError, match="low_params"):
        opt.FusedOptimizerStep.from_arrays(config, [p], [g], [s], [None, None])
    with pytest.raises(TypeError, match="grads"):
        opt.FusedOptimizerStep.from_arrays(config, [p], [np.zeros(8, np.float32)], [s])
    with pytest.raises(ValueError, match="slots"):
        opt.FusedOptimizerStep(config, [])
    with pytest.raises(ValueError, match="chunk_size"):
        opt.FusedOptimizerStep.from_arrays(config, [p], [g], [s], chunk_size=0)


# ---------------------------------------------------------------------------------------------------------------
# GPU: against torch.optim (100 steps, float32, within 1e-6 relative)
# ---------------------------------------------------------------------------------------------------------------
TORCH_CASES = {
    "sgd_momentum": (dict(algorithm="sgd", lr=0.01, momentum=0.9), ("SGD", dict(lr=0.01, momentum=0.9))),
    "sgd_nesterov_wd": (dict(algorithm="sgd", lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-3),
                        ("SGD", dict(lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-3))),
    "sgd_dampening": (dict(algorithm="sgd", lr=0.01, momentum=0.5, dampening=0.3),
                      ("SGD", dict(lr=0.01, momentum=0.5, dampening=0.3))),
    "adam": (dict(algorithm="adam", lr=1e-3, weight_decay=1e-2), ("Adam", dict(lr=1e-3, weight_decay=1e-2))),
    "adamw": (dict(algorithm="adamw", lr=1e-3, weight_decay=0.01, betas=(0.9, 0.95), eps=1e-6),
              ("AdamW", dict(lr=1e-3, weight_decay=0.01, betas=(0.9, 0.95), eps=1e-6))),
    "adamw_amsgrad": (dict(algorithm="adamw", lr=1e-3, amsgrad=True), ("AdamW", dict(lr=1e-3, amsgrad=True))),
}


def _relative_error(got, expected):
    return float((got - expected).abs().max() / expected.abs().max())


@gpu
@pytest.mark.parametrize("name", TORCH_CASES)
@pytest.mark.parametrize("foreach", [True, False])
def test_matches_torch_optim_over_100_steps(name, foreach):
    torch = pytest.importorskip("torch")
    ours, (torch_name, torch_arguments) = TORCH_CASES[name]
    config = opt.OptimizerConfig(**ours)
    generator = torch.Generator(device="cuda").manual_seed(1234)
    sizes = [1, 31, 1000, 4097, 70000]
    torch_params = [torch.randn(n, device="cuda", generator=generator, requires_grad=True) for n in sizes]
    params = [p.detach().clone() for p in torch_params]
    grads = [torch.empty_like(p) for p in params]
    states = [[torch.zeros_like(p) for _ in config.state_names] for p in params]
    fused = opt.FusedOptimizerStep.from_arrays(config, params, grads, states, chunk_size=2048)
    optimizer = getattr(torch.optim, torch_name)(torch_params, foreach=foreach, **torch_arguments)
    for _ in range(100):
        for torch_param, grad in zip(torch_params, grads):
            grad.copy_(torch.randn(grad.shape, device="cuda", generator=generator))
            torch_param.grad = grad.clone()
        optimizer.step()
        fused.launch(torch.cuda.current_stream())
    torch.cuda.synchronize()
    for index, (got, expected) in enumerate(zip(params, torch_params)):
        error = _relative_error(got, expected.detach())
        assert error <= 1e-6, f"param {index}: relative error {error:.2e}"
    for position, state_name in enumerate(config.state_names):
        for index, states_of in enumerate(states):
            expected = optimizer.state[torch_params[index]][state_name]
            error = _relative_error(states_of[position], expected)
            assert error <= 1e-6, f"{state_name} {index}: relative error {error:.2e}"


@gpu
def test_clipping_matches_torch_clip_grad_norm(rng):
    torch = pytest.importorskip("torch")
    sizes = [3, 500, 20000]
    grads = [torch.randn(n, device="cuda") * 3 for n in sizes]
    params = [torch.zeros(n, device="cuda") for n in sizes]
    config = opt.OptimizerConfig("sgd", 1.0, max_norm=0.75)
    fused = opt.FusedOptimizerStep.from_arrays(config, params, grads, [[] for _ in sizes])
    fused.launch(torch.cuda.current_stream())
    holders = [torch.zeros(n, device="cuda", requires_grad=True) for n in sizes]  # clip_grad_norm_ reads .grad
    for holder, grad in zip(holders, grads):
        holder.grad = grad.clone()
    total = torch.nn.utils.clip_grad_norm_(holders, max_norm=0.75)
    clipped = [holder.grad for holder in holders]
    # Both sum float32 squares, in different orders: the norms agree to float32 summation error.
    assert fused.read_state()["grad_norm"] == pytest.approx(total.item(), rel=1e-5)
    for param, grad in zip(params, clipped):
        assert _relative_error(-param, grad) <= 1e-5


@gpu
def test_step_replays_in_a_cuda_graph(rng):
    # Capturable: the whole step (norm, prologue, update) recorded once, replayed with new gradients in place.
    runtime = ge2.device.runtime()
    config = opt.OptimizerConfig("adamw", 1e-2, max_norm=1.0, schedule="linear_warmup", warmup_steps=5)
    problem = _Problem(rng, config, [10, 3000], chunk_size=1024)
    stream = runtime.Stream()
    graph = runtime.CudaGraph()
    problem.step()  # the first step runs eagerly, on stream 0
    problem.fused.read_state()  # waits for it
    graph.begin_capture(stream.handle)
    problem.fused.launch(stream)
    graph.end_capture()
    for _ in range(4):
        grads = [rng.standard_normal(n).astype(np.float32) for n in problem.sizes]
        for device_grad, grad in zip(problem.grads, grads):
            device_grad.copy_from_numpy(grad, stream.handle)
        graph.replay(stream.handle)
        stream.synchronize()
        problem.reference.step(problem.reference_params, [g.astype(np.float64) for g in grads], problem.host_states)
    state = problem.check(rtol=1e-5)
    assert state["lr"] == pytest.approx(opt.scheduled_lr(config, 5), rel=1e-6)


@gpu
def test_skip_nonfinite_on_the_device(rng):
    """The fused step's device-side non-finite flag: a NaN/inf gradient drops the step for every tensor (parameters,
    states and low-precision copies unchanged), counts it in the Control block and keeps its attempt, without loss
    scaling; then steps go on as the reference's."""
    config = opt.OptimizerConfig("adamw", 1e-2, skip_nonfinite=True)
    problem = _Problem(rng, config, [5, 300], grad_dtype="bfloat16", low_dtype="bfloat16", chunk_size=128)
    problem.step()
    before = [p.numpy() for p in problem.params] + [low.numpy() for low in problem.lows]
    for bad in (np.nan, -np.inf):
        grads = [rng.standard_normal(n).astype(np.float32) for n in problem.sizes]
        grads[1][211] = bad
        problem.step(grads)
        state = problem.fused.read_state()
        assert (state["skipped"], state["step"]) == (1, 1)
    for array, expected in zip(list(problem.params) + list(problem.lows), before):
        np.testing.assert_array_equal(array.numpy(), expected)
    assert (state["nonfinite_steps"], state["first_nonfinite"]) == (2, 2)
    assert (problem.reference.nonfinite_steps, problem.reference.first_nonfinite) == (2, 2)
    problem.step()
    state = problem.check(rtol=1e-5)
    assert (state["skipped"], state["step"], state["nonfinite_steps"]) == (0, 2, 2)
    problem.fused.set_state(step=2, loss_scale=1.0, nonfinite_steps=2)
    assert problem.fused.read_state()["first_nonfinite"] == 0
