"""A GPT-2-style decoder written with ``ge2.nn``: token and position embeddings, pre-norm blocks (causal
multi-head attention on the ``attention`` op, a GELU (tanh) MLP, residual adds), a final LayerNorm and an output
head tied to the token embedding. Initialised as GPT-2 (normal(0, 0.02); residual projections scaled by
1/sqrt(2 * layers)).

``GPT.loss_graph(batch)`` is the training graph: inputs ``ids`` and ``targets`` (int64 [batch, context]), output
``loss`` (mean cross-entropy over every position, in nats). ``torch_gpt(config)`` is the same model in PyTorch,
``torch_gpt_block(config, attention)`` one of its blocks (with SDPA or GPT-2's written-out attention).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import nn
from .._optional import require
from ..ir.graph import Graph


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256  # bytes
    context: int = 128
    layers: int = 4
    heads: int = 4
    width: int = 256

    def __post_init__(self):
        for name in ("vocab", "context", "layers", "heads", "width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.width % self.heads:
            raise ValueError(f"heads: {self.heads} must divide width {self.width}")


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.width)
        self.attn = nn.MultiheadAttention(config.width, config.heads, causal=True)
        self.ln_2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(nn.Linear(config.width, 4 * config.width), nn.GELU("tanh"),
                                 nn.Linear(4 * config.width, config.width))

    def forward(self, g, x):
        x = g.add(x, self.attn(g, self.ln_1(g, x)))
        return g.add(x, self.mlp(g, self.ln_2(g, x)))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig = GPTConfig()):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab, config.width)
        self.wpe = nn.Embedding(config.context, config.width)
        self.blocks = nn.Sequential(*[Block(config) for _ in range(config.layers)])
        self.ln_f = nn.LayerNorm(config.width)
        self._init_like_gpt2()

    def _init_like_gpt2(self) -> None:
        residual_scale = 1.0 / math.sqrt(2 * self.config.layers)
        for name, parameter in self.named_parameters():
            if name.endswith("bias") or ".ln_" in name or name.startswith("ln_f"):
                continue
            std = 0.02 * (residual_scale if name.endswith(("out_proj.weight", "mlp.2.weight")) else 1.0)
            parameter.data = (nn._generator.standard_normal(parameter.shape) * std).astype(np.float32)

    def forward(self, g, ids):
        batch, context = ids.type.shape
        if context > self.config.context:
            raise ValueError(f"ids: context {context} exceeds the model's {self.config.context}")
        positions = g.param(g.unique_name("positions"), np.arange(context, dtype=np.int64))
        x = g.add(self.wte(g, ids), self.wpe(g, positions))  # [batch, context, width] + [context, width]
        x = self.ln_f(g, self.blocks(g, x))
        rows = g.reshape(x, shape=(batch * context, self.config.width))
        return g.gemm(rows, self.wte.weight.value(g), trans_b=True)  # logits [batch * context, vocab], tied head

    def loss_graph(self, batch: int, name: str = "gpt") -> Graph:
        """The training graph: ids, targets -> loss (mean next-byte cross-entropy)."""
        g = Graph(name)
        self._name_parameters()
        context = self.config.context
        ids = g.input("ids", (batch, context), "int64")
        targets = g.input("targets", (batch, context), "int64")
        logits = self(g, ids)
        g.output(g.cross_entropy(logits, g.reshape(targets, shape=(batch * context,))), "loss")
        return g


ATTENTION_FORMS = ("sdpa", "written_out")


def torch_gpt_block(config: GPTConfig, attention: str = "sdpa"):
    """One pre-norm block of ``torch_gpt`` in PyTorch (GE2's parameter names: ``ln_1``, ``attn.in_proj_weight`` /
    ``attn.in_proj_bias`` (the fused QKV projection), ``attn.out_proj``, ``ln_2``, ``mlp.0``, ``mlp.2``), mapping
    [batch, seq, width] to the same. ``attention``: "sdpa" (``F.scaled_dot_product_attention(is_causal=True)``) or
    "written_out", GPT-2 / nanoGPT's explicit form: ``softmax(masked_fill(q @ k^T / sqrt(head_dim), tril == 0,
    -inf)) @ v``, with the mask a non-persistent buffer of ``config.context`` rows. Initialised as PyTorch's
    layers are (the packed QKV projection as torch.nn.MultiheadAttention's: Xavier-uniform weight, zero bias).
    Needs PyTorch."""
    if attention not in ATTENTION_FORMS:
        raise ValueError(f"attention: expected one of {', '.join(ATTENTION_FORMS)}, got {attention!r}")
    torch = require("torch", "ge2.models.torch_gpt_block")
    F = torch.nn.functional

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            width = config.width
            self.in_proj_weight = torch.nn.Parameter(torch.nn.init.xavier_uniform_(torch.empty(3 * width, width)))
            self.in_proj_bias = torch.nn.Parameter(torch.zeros(3 * width))
            self.out_proj = torch.nn.Linear(width, width)
            if attention == "written_out":
                causal = torch.tril(torch.ones(config.context, config.context)).view(1, 1, config.context, -1)
                self.register_buffer("causal", causal, persistent=False)

        def forward(self, x):
            batch, seq, width = x.shape
            heads = config.heads
            qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias).view(batch, seq, 3, heads, width // heads)
            q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # [batch, heads, seq, head_dim]
            if attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                scores = scores.masked_fill(self.causal[:, :, :seq, :seq] == 0, float("-inf"))
                y = F.softmax(scores, dim=-1) @ v
            return self.out_proj(y.transpose(1, 2).reshape(batch, seq, width))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            width = config.width
            self.ln_1 = torch.nn.LayerNorm(width)
            self.attn = Attention()
            self.ln_2 = torch.nn.LayerNorm(width)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(approximate="tanh"),
                                           torch.nn.Linear(4 * width, width))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    return Block()


def torch_gpt(config: GPTConfig):
    """The same GPT in PyTorch (its own layers, blocks of ``torch_gpt_block`` with ``F.scaled_dot_product_attention``),
    with GE2's parameter names, so ``load_state_dict({name: torch.from_numpy(array) for name, array in
    model.state_dict().items()})`` gives it a GE2 model's weights: the reference of the parity tests and the
    benchmark. ``forward(ids, targets)`` returns the mean cross-entropy (computed in float32 under autocast). It is
    initialised as PyTorch's layers are, not as GPT-2: load a GE2 model's weights for parity. Needs PyTorch."""
    torch = require("torch", "ge2.models.torch_gpt")
    F = torch.nn.functional

    class TorchGPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = torch.nn.Embedding(config.vocab, config.width)
            self.wpe = torch.nn.Embedding(config.context, config.width)
            self.blocks = torch.nn.ModuleList([torch_gpt_block(config) for _ in range(config.layers)])
            self.ln_f = torch.nn.LayerNorm(config.width)

        def forward(self, ids, targets):
            positions = torch.arange(ids.shape[1], device=ids.device)
            x = self.wte(ids) + self.wpe(positions)
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # the tied head
            return F.cross_entropy(logits.float().reshape(-1, config.vocab), targets.reshape(-1))

    return TorchGPT()
