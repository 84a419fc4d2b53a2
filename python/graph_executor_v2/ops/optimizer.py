"""optimizer: fused multi-tensor SGD / Adam / AdamW with device-side schedules, clipping and loss scaling.

This op updates lists of tensors rather than mapping inputs to outputs, so its face differs from the
``forward``/``backward`` convention (which does not fit lists of parameters and states):

* ``OptimizerConfig(...)``: every hyper-parameter, checked once (ValueError/TypeError naming the argument).
* ``ReferenceOptimizer(config)``: the float64 NumPy step (the oracle of the tests and the CPU backend of the
  trainer): ``step(params, grads, states)`` updates host arrays in place.
* ``FusedOptimizerStep(config, slots)``: the GPU step, prepared once from device addresses (``ParamSlot``) or from
  device arrays (``FusedOptimizerStep.from_arrays``); ``launch(stream)`` enqueues one native call per dtype group
  (plus a norm pass and a one-block prologue): no host input and no host synchronisation, so it can be captured
  in a CUDA graph and replayed.
* ``kernels()``: the native kernel table.

One step, in stream order (all of its state lives in a 64-byte device ``Control`` block):

1. ``grad_norm`` (per dtype group; only with clipping, loss scaling or ``skip_nonfinite``): per-chunk sums of squares of the
   unscaled gradients and a non-finite flag.
2. ``finalize`` (one block): global L2 norm (fixed-order reduction: deterministic); with loss scaling or
   ``skip_nonfinite``, an inf/NaN gradient makes the step a no-op for every tensor (``skip_nonfinite`` without loss
   scaling also counts it, ``nonfinite_steps``, and keeps the first such attempt, ``first_nonfinite``: the
   device-side flag a trainer reads with its loss, with no synchronisation of its own); otherwise the device step counter is incremented and the
   learning rate evaluated from it (``constant``, ``linear_warmup``, ``cosine`` with warm-up), with Adam's bias
   corrections; the loss scale is lowered on overflow (``backoff_factor``) and raised after ``growth_interval``
   finite steps (torch.cuda.amp.GradScaler's rule).
3. ``step`` (per dtype group of (grad dtype, low-precision dtype)): g = grad * (1 / loss_scale) * clip_coef, then the
   update in torch.optim's float32 operation order (foreach implementations), and the float16/bfloat16 copy of the
   parameter written in the same pass when asked for.

Semantics (``step`` is 1-based, counted on the device; skipped steps do not count):
* SGD: g += weight_decay * p; buf = g on the first step, else momentum * buf + (1 - dampening) * g;
  g = g + momentum * buf (nesterov) or buf; p -= lr * g.
* Adam: g += weight_decay * p. AdamW: p *= 1 - lr * weight_decay. Then m = lerp(m, g, 1 - beta1),
  v = beta2 * v + (1 - beta2) * g * g, (amsgrad: vmax = max(vmax, v), used for v),
  p += -(lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps).
* Clipping: torch.nn.utils.clip_grad_norm_: coef = min(1, max_norm / (norm + 1e-6)) over every gradient.
* Schedules: constant lr; linear_warmup lr * min(1, step / warmup_steps); cosine: lr * step / warmup_steps up to
  warmup_steps, then min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2, progress =
  min(1, (step - warmup_steps) / (total_steps - warmup_steps)).

Parameters and states are float32 (master weights); gradients float32, float16 or bfloat16.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import _native
from .. import device as _device
from . import _layout

ALGORITHMS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "linear_warmup", "cosine")
GRAD_DTYPES = ("float32", "float16", "bfloat16")
LOW_DTYPES = ("float16", "bfloat16")
DEFAULT_CHUNK_SIZE = 16384  # elements per block: 50M parameters -> ~3000 blocks, enough to fill an H100
_ENTRY_WORDS = 8  # int64 words per tensor-table row (TensorEntry)


def _native_module():
    return _native.load("_ops_optimizer")


def kernels() -> list[dict]:
    """The candidates with their constraints, as the native module reports them."""
    return _native_module().kernels()


# ---------------------------------------------------------------------------------------------------------------
# Hyper-parameters: checked once, where they are made.
# ---------------------------------------------------------------------------------------------------------------
def _number(name, value, low=-math.inf, high=math.inf, low_open=False, high_open=False) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__} ({value!r})")
    value = float(value)
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if not math.isfinite(value) or below or above:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open or high == math.inf else ']'}"
        raise ValueError(f"{name}: expected a finite value in {interval}, got {value!r}")
    return value


def _integer(name, value, low) -> int:
    if not _layout.is_int(value):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} ({value!r})")
    if value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value}")
    return int(value)


def _flag(name, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} ({value!r})")
    return bool(value)


@dataclass(frozen=True)
class OptimizerConfig:
    """Every hyper-parameter of one optimizer step. ``algorithm``: "sgd", "adam" (L2 weight decay added to the
    gradient) or "adamw" (decoupled weight decay). ``max_norm``: None, or clip to this global gradient norm.
    ``loss_scaling``: dynamic loss scaling (float16 training): gradients arrive multiplied by the device-side loss
    scale, which starts at ``init_scale``. ``skip_nonfinite``: a step whose gradients hold an inf or NaN changes
    nothing and is counted (loss scaling drops such steps by itself, as overflows). ``weight_decay`` defaults as in
    torch.optim: 0.01 for AdamW, 0 else."""

    algorithm: str
    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float | None = None
    amsgrad: bool = False
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 0
    min_lr: float = 0.0
    max_norm: float | None = None
    loss_scaling: bool = False
    skip_nonfinite: bool = False
    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self):
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen dataclass)
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm: expected one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        put("lr", _number("lr", self.lr, 0.0))
        put("momentum", _number("momentum", self.momentum, 0.0))
        put("dampening", _number("dampening", self.dampening, 0.0, 1.0))
        put("nesterov", _flag("nesterov", self.nesterov))
        if self.nesterov and (self.momentum <= 0.0 or self.dampening != 0.0):
            raise ValueError(f"nesterov: needs momentum > 0 and dampening 0, got momentum {self.momentum} and "
                             f"dampening {self.dampening}")
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ValueError(f"betas: expected a pair (beta1, beta2), got {self.betas!r}")
        put("betas", tuple(_number(f"betas[{i}]", b, 0.0, 1.0, high_open=True) for i, b in enumerate(self.betas)))
        put("eps", _number("eps", self.eps, 0.0, low_open=True))
        if self.weight_decay is None:
            put("weight_decay", 0.01 if self.algorithm == "adamw" else 0.0)
        put("weight_decay", _number("weight_decay", self.weight_decay, 0.0))
        put("amsgrad", _flag("amsgrad", self.amsgrad))
        if self.amsgrad and self.algorithm == "sgd":
            raise ValueError("amsgrad: only Adam and AdamW have it, got algorithm 'sgd'")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        put("warmup_steps", _integer("warmup_steps", self.warmup_steps, 0))
        put("total_steps", _integer("total_steps", self.total_steps, 0))
        put("min_lr", _number("min_lr", self.min_lr, 0.0, self.lr))
        if self.schedule == "linear_warmup" and self.warmup_steps < 1:
            raise ValueError(f"warmup_steps: linear_warmup needs warmup_steps >= 1, got {self.warmup_steps}")
        if self.schedule == "cosine" and self.total_steps <= self.warmup_steps:
            raise ValueError(f"total_steps: cosine needs total_steps > warmup_steps ({self.warmup_steps}), got "
                             f"{self.total_steps}")
        if self.max_norm is not None:
            put("max_norm", _number("max_norm", self.max_norm, 0.0, low_open=True))
        put("loss_scaling", _flag("loss_scaling", self.loss_scaling))
        put("skip_nonfinite", _flag("skip_nonfinite", self.skip_nonfinite))
        put("init_scale", _number("init_scale", self.init_scale, 0.0, low_open=True))
        put("growth_factor", _number("growth_factor", self.growth_factor, 1.0, low_open=True))
        put("backoff_factor", _number("backoff_factor", self.backoff_factor, 0.0, 1.0, low_open=True,
                                      high_open=True))
        put("growth_interval", _integer("growth_interval", self.growth_interval, 1))

    @property
    def state_names(self) -> tuple[str, ...]:
        """The float32 state buffers each parameter needs, in table order."""
        if self.algorithm == "sgd":
            return ("momentum_buffer",) if self.momentum else ()
        return ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if self.amsgrad else ())

    @property
    def needs_norm(self) -> bool:
        return self.max_norm is not None or self.loss_scaling or self.skip_nonfinite


# ---------------------------------------------------------------------------------------------------------------
# float64 references: the oracle and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def scheduled_lr(config: OptimizerConfig, step: int) -> float:
    """The learning rate of (1-based) ``step``."""
    if config.schedule == "constant":
        return config.lr
    if config.schedule == "linear_warmup":
        return config.lr * min(1.0, step / config.warmup_steps)
    if step <= config.warmup_steps:
        return config.lr * step / config.warmup_steps
    progress = min(1.0, (step - config.warmup_steps) / (config.total_steps - config.warmup_steps))
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1.0 + math.cos(math.pi * progress))


def global_norm(grads) -> float:
    """The L2 norm over every element of every gradient (float64)."""
    return math.sqrt(sum(float(np.square(np.asarray(g, dtype=np.float64)).sum()) for g in grads))


def clip_coefficient(norm: float, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_'s factor."""
    return min(1.0, max_norm / (norm + 1e-6))


def update_reference(config: OptimizerConfig, step: int, lr: float, param, grad, state: dict) -> None:
    """One update of one parameter (float64 math) in place: ``param`` and the arrays of ``state`` (named as
    ``config.state_names``) are written; ``grad`` is the unscaled, clipped gradient."""
    p = np.asarray(param, dtype=np.float64)
    g = np.asarray(grad, dtype=np.float64)
    if config.algorithm == "sgd":
        if config.weight_decay:
            g = g + config.weight_decay * p
        if config.momentum:
            previous = state["momentum_buffer"].astype(np.float64)
            buffer = g if step == 1 else config.momentum * previous + (1.0 - config.dampening) * g
            state["momentum_buffer"][...] = buffer
            g = g + config.momentum * buffer if config.nesterov else buffer
        param[...] = p - lr * g
        return
    beta1, beta2 = config.betas
    if config.weight_decay:
        if config.algorithm == "adamw":
            p = p * (1.0 - lr * config.weight_decay)
        else:
            g = g + config.weight_decay * p
    m = beta1 * state["exp_avg"].astype(np.float64) + (1.0 - beta1) * g
    v = beta2 * state["exp_avg_sq"].astype(np.float64) + (1.0 - beta2) * g * g
    state["exp_avg"][...] = m
    state["exp_avg_sq"][...] = v
    if config.amsgrad:
        v = np.maximum(state["max_exp_avg_sq"].astype(np.float64), v)
        state["max_exp_avg_sq"][...] = v
    denom = np.sqrt(v) / math.sqrt(1.0 - beta2 ** step) + config.eps
    param[...] = p - (lr / (1.0 - beta1 ** step)) * m / denom


class ReferenceOptimizer:
    """The whole step in float64 NumPy, with the same state as the device Control block: ``step`` (applied steps),
    ``loss_scale``, ``good_steps``, ``grad_norm``, ``lr``, ``skipped``, ``nonfinite_steps``, ``first_nonfinite``."""

    def __init__(self, config: OptimizerConfig):
        if not isinstance(config, OptimizerConfig):
            raise TypeError(f"config: expected an OptimizerConfig, got {type(config).__name__}")
        self.config = config
        self.step_count = 0
        self.loss_scale = config.init_scale if config.loss_scaling else 1.0
        self.good_steps = 0
        self.grad_norm = 0.0
        self.lr = 0.0
        self.skipped = False
        self.nonfinite_steps = 0
        self.first_nonfinite = 0

    def step(self, params, grads, states) -> None:
        """``params``: float arrays updated in place (float32 masters); ``grads``: as they arrive (multiplied by
        ``loss_scale`` when loss scaling); ``states``: one dict per parameter of ``config.state_names`` arrays."""
        config = self.config
        if not len(params) == len(grads) == len(states):
            raise ValueError(f"params, grads, states: expected equal lengths, got {len(params)}, {len(grads)}, "
                             f"{len(states)}")
        unscaled = [np.asarray(g, dtype=np.float64) / self.loss_scale for g in grads]
        finite = all(np.isfinite(g).all() for g in unscaled)
        self.grad_norm = global_norm(unscaled) if config.needs_norm else 0.0
        self.skipped = (config.loss_scaling or config.skip_nonfinite) and not finite
        if self.skipped and not config.loss_scaling:
            self.nonfinite_steps += 1
            if not self.first_nonfinite:
                self.first_nonfinite = self.step_count + self.nonfinite_steps
        if not self.skipped:
            self.step_count += 1
            self.lr = scheduled_lr(config, self.step_count)
            coef = clip_coefficient(self.grad_norm, config.max_norm) if config.max_norm is not None else 1.0
            for param, grad, state in zip(params, unscaled, states):
                update_reference(config, self.step_count, self.lr, param, grad * coef, state)
        if config.loss_scaling:
            if self.skipped:
                self.loss_scale *= config.backoff_factor
                self.good_steps = 0
            elif self.good_steps + 1 == config.growth_interval:
                self.loss_scale *= config.growth_factor
                self.good_steps = 0
            else:
                self.good_steps += 1


# ---------------------------------------------------------------------------------------------------------------
# Device step
# ---------------------------------------------------------------------------------------------------------------
class ParamSlot(NamedTuple):
    """One parameter as device addresses: ``param`` (float32 master), ``grad`` (``grad_dtype``), ``states`` (one
    float32 buffer per ``config.state_names``, in that order), ``numel``, and optionally ``low`` (``low_dtype``:
    the float16/bfloat16 copy the step writes; 0 for none)."""

    param: int
    grad: int
    states: tuple
    numel: int
    grad_dtype: str = "float32"
    low: int = 0
    low_dtype: str | None = None


@dataclass
class _Group:
    grad_dtype: str
    low_dtype: str | None
    tensors: object  # DeviceArray int64 (n, 8)
    chunks: object  # DeviceArray int64 (c, 2)
    num_chunks: int
    partial_offset: int


def _chunk_table(numels, chunk_size) -> np.ndarray:
    rows = [(index, start) for index, numel in enumerate(numels) for start in range(0, numel, chunk_size)]
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)


class FusedOptimizerStep:
    """The optimizer step on the GPU, prepared once (device tables built and uploaded here) and launched every
    step with ``launch(stream)``. Owns its device tables, the norm partials and the 64-byte Control block (step
    counter, loss scale, last norm, lr); the caller owns the parameters, gradients, states and copies, which must
    stay alive and in place.

    The trainer's backward must seed the loss gradient with the device loss scale when ``config.loss_scaling``:
    ``control_address("loss_scale")`` is its float32 address."""

    def __init__(self, config: OptimizerConfig, slots, device: int = 0, chunk_size: int = DEFAULT_CHUNK_SIZE):
        if not isinstance(config, OptimizerConfig):
            raise TypeError(f"config: expected an OptimizerConfig, got {type(config).__name__}")
        chunk_size = _integer("chunk_size", chunk_size, 1)
        slots = [ParamSlot(*slot) for slot in slots]
        if not slots:
            raise ValueError("slots: expected at least one parameter, got none")
        _device.require_gpu("optimizer.FusedOptimizerStep")
        self.config = config
        self.chunk_size = chunk_size
        self.device = device
        native = _native_module()
        states_needed = len(config.state_names)
        grouped: dict[tuple, list[ParamSlot]] = {}
        for index, slot in enumerate(slots):
            where = f"slots[{index}]"
            if slot.grad_dtype not in GRAD_DTYPES:
                raise TypeError(f"{where}.grad_dtype: expected one of {', '.join(GRAD_DTYPES)}, got "
                                f"{slot.grad_dtype!r}")
            if slot.low_dtype is not None and slot.low_dtype not in LOW_DTYPES:
                raise TypeError(f"{where}.low_dtype: expected float16, bfloat16 or None, got {slot.low_dtype!r}")
            if bool(slot.low) != (slot.low_dtype is not None):
                raise ValueError(f"{where}.low: give both low and low_dtype, or neither")
            _integer(f"{where}.numel", slot.numel, 0)
            if len(slot.states) != states_needed:
                raise ValueError(f"{where}.states: expected {states_needed} buffers {config.state_names}, got "
                                 f"{len(slot.states)}")
            if slot.numel and not (slot.param and slot.grad and all(slot.states)):
                raise ValueError(f"{where}: null device address for param, grad or a state")
            grouped.setdefault((slot.grad_dtype, slot.low_dtype), []).append(slot)
        runtime = _device.runtime()
        self._groups: list[_Group] = []
        total_chunks = 0
        for (grad_dtype, low_dtype), members in grouped.items():
            table = np.zeros((len(members), _ENTRY_WORDS), dtype=np.uint64)
            for row, slot in enumerate(members):
                states = list(slot.states) + [0] * (3 - len(slot.states))
                table[row, :7] = [slot.param, slot.grad, *states, slot.low, slot.numel]
            chunks = _chunk_table([slot.numel for slot in members], chunk_size)
            if len(chunks) == 0:
                continue
            self._groups.append(_Group(grad_dtype, low_dtype, runtime.DeviceArray.from_numpy(table.view(np.int64),
                                                                                             device),
                                       runtime.DeviceArray.from_numpy(chunks, device), len(chunks), total_chunks))
            total_chunks += len(chunks)
        self.num_chunks = total_chunks
        self._partials = runtime.DeviceArray.empty([max(1, total_chunks)], "float32", device)
        self._layout = {name: (offset, dtype) for name, (offset, dtype) in native.control_layout().items()}
        self._control = runtime.DeviceArray.empty([native.control_bytes() // 8], "int64", device)
        self.set_state(step=0, loss_scale=config.init_scale if config.loss_scaling else 1.0, good_steps=0)
        self._calls = self._prepare_calls(native)

    @classmethod
    def from_arrays(cls, config: OptimizerConfig, params, grads, states, low_params=None,
                    chunk_size: int = DEFAULT_CHUNK_SIZE) -> "FusedOptimizerStep":
        """From device arrays (DeviceArray, torch, CuPy): ``params`` float32, ``grads`` float32/float16/bfloat16 of
        the same sizes, ``states`` one sequence of float32 arrays per parameter (``config.state_names``),
        ``low_params`` None or one float16/bfloat16 array (or None) per parameter. All contiguous."""
        if not len(params) == len(grads) == len(states):
            raise ValueError(f"params, grads, states: expected equal lengths, got {len(params)}, {len(grads)}, "
                             f"{len(states)}")
        if low_params is not None and len(low_params) != len(params):
            raise ValueError(f"low_params: expected {len(params)} entries, got {len(low_params)}")
        slots, device = [], None
        for index, (param, grad, state) in enumerate(zip(params, grads, states)):
            p = _contiguous(param, f"params[{index}]")
            g = _contiguous(grad, f"grads[{index}]")
            if p.dtype != "float32":
                raise TypeError(f"params[{index}]: expected float32 (master weights), got {p.dtype}")
            device = p.device if device is None else device
            _layout.check_device(p, device, f"params[{index}]")
            numel = _layout.numel(p.shape)
            _same_size(g, numel, device, f"grads[{index}]")
            state_ptrs = tuple(_layout.checked_view(buffer, f"states[{index}][{position}]", p.shape, "float32",
                                                    device).ptr for position, buffer in enumerate(state))
            low, low_dtype = 0, None
            if low_params is not None and low_params[index] is not None:
                view = _contiguous(low_params[index], f"low_params[{index}]")
                _same_size(view, numel, device, f"low_params[{index}]")
                low, low_dtype = view.ptr, view.dtype
            slots.append(ParamSlot(p.ptr, g.ptr, state_ptrs, numel, g.dtype, low, low_dtype))
        return cls(config, slots, device=device or 0, chunk_size=chunk_size)

    def _prepare_calls(self, native):
        config = self.config
        algorithm = "sgd" if config.algorithm == "sgd" else "adam"
        beta1, beta2 = config.betas
        calls = []
        if config.needs_norm:
            for group in self._groups:
                calls.append((native.grad_norm, (group.tensors.ptr, group.chunks.ptr, group.num_chunks,
                                                 self.chunk_size, group.grad_dtype, self._control.ptr,
                                                 self._partials.ptr + 4 * group.partial_offset,
                                                 config.loss_scaling)))
        calls.append((native.finalize, (self._control.ptr, self._partials.ptr,
                                        self.num_chunks if config.needs_norm else 0, config.loss_scaling,
                                        config.skip_nonfinite, config.max_norm or 0.0, config.schedule, config.lr, config.min_lr,
                                        config.warmup_steps, config.total_steps, algorithm, beta1, beta2,
                                        config.weight_decay, config.growth_factor, config.backoff_factor,
                                        config.growth_interval)))
        for group in self._groups:
            calls.append((native.step, (group.tensors.ptr, group.chunks.ptr, group.num_chunks, self.chunk_size,
                                        algorithm, group.grad_dtype, group.low_dtype or "", self._control.ptr,
                                        beta1, beta2, config.eps, config.weight_decay, config.algorithm == "adamw",
                                        config.amsgrad, config.momentum, config.dampening, config.nesterov,
                                        config.loss_scaling, config.max_norm is not None)))
        return calls

    def launch(self, stream=None) -> None:
        """Enqueues one optimizer step on ``stream`` (None: the legacy default stream). No host synchronisation."""
        handle = _device.stream_handle(stream)
        for call, arguments in self._calls:
            call(*arguments, handle)

    def control_address(self, name: str) -> int:
        """Device address of a Control field (``step`` int64, ``loss_scale`` float32, ``grad_norm``, ``lr``, ...)."""
        if name not in self._layout:
            raise ValueError(f"name: expected one of {', '.join(self._layout)}, got {name!r}")
        return self._control.ptr + self._layout[name][0]

    def read_state(self, stream=None) -> dict:
        """The Control block as Python numbers (synchronizes): step, good_steps, loss_scale, grad_norm, lr,
        skipped, nonfinite_steps, first_nonfinite."""
        raw = self._control.numpy(_device.stream_handle(stream)).view(np.uint8)
        return {name: _field(raw, offset, dtype) for name, (offset, dtype) in self._layout.items()
                if name != "nonfinite"}

    def set_state(self, step: int, loss_scale: float, good_steps: int = 0, nonfinite_steps: int = 0) -> None:
        """Writes the step counter, loss scale and count of dropped non-finite steps (a checkpoint's values;
        synchronous); ``first_nonfinite`` starts again at 0. The momentum buffer of SGD is re-initialized from the
        gradient only when the step counter is 0 before the step."""
        raw = np.zeros(self._control.size * 8, dtype=np.uint8)
        for name, value in (("step", _integer("step", step, 0)), ("good_steps", _integer("good_steps", good_steps,
                                                                                               0)),
                            ("loss_scale", _number("loss_scale", loss_scale, 0.0, low_open=True)),
                            ("nonfinite_steps", _integer("nonfinite_steps", nonfinite_steps, 0))):
            offset, dtype = self._layout[name]
            raw[offset:offset + np.dtype(dtype).itemsize] = np.asarray([value], dtype=dtype).view(np.uint8)
        self._control.copy_from_numpy(raw.view(np.int64))


def _field(raw: np.ndarray, offset: int, dtype: str):
    value = raw[offset:offset + np.dtype(dtype).itemsize].view(dtype)[0]
    return value.item()


class BufferCopies:
    """Copies between device buffers, prepared once (a table of (source, destination, bytes) rows uploaded here) and
    enqueued by ``launch(stream)`` as one kernel: a training step's buffer updates (batch norm's running statistics,
    FP8 delayed scaling's histories and scales) without a memcpy node per buffer in the captured step. The caller
    keeps the buffers alive and in place."""

    def __init__(self, copies, device: int = 0):
        rows = [tuple(copy) for copy in copies]
        for index, row in enumerate(rows):
            if len(row) != 3 or not all(isinstance(v, (int, np.integer)) and v >= 0 for v in row) or not all(row[:2]):
                raise ValueError(f"copies[{index}]: expected (source, destination, bytes), two device addresses and "
                                 f"a size >= 0, got {row!r}")
        table = np.zeros((len(rows), 4), np.uint64)
        for index, (source, destination, nbytes) in enumerate(rows):
            table[index, :3] = source, destination, nbytes
        self.count = len(rows)
        self._table = _device.runtime().DeviceArray.from_numpy(table.view(np.int64), device) if rows else None

    def launch(self, stream=None) -> None:
        """Enqueues every copy on ``stream`` (None: the legacy default stream)."""
        if self.count:
            _native_module().copy_buffers(self._table.ptr, self.count, _device.stream_handle(stream))


def _contiguous(array, argument):
    view = _device.view_of(array, argument)
    if not view.is_contiguous:
        raise ValueError(f"{argument}: expected a contiguous array, got strides {view.strides} for shape "
                         f"{tuple(view.shape)}")
    return view


def _same_size(view, numel, device, argument):
    _layout.check_device(view, device, argument)
    if _layout.numel(view.shape) != numel:
        raise ValueError(f"{argument}: expected {numel} elements (the parameter's), got {_layout.numel(view.shape)}")
