"""Activation functions and their derivatives in NumPy (float64): the oracle for every fused activation.

GELU is the tanh form (what cuBLASLt's epilogue computes); ``gelu_erf`` is the exact form.
"""
from __future__ import annotations

import math

import numpy as np

ACTIVATIONS = ("none", "relu", "gelu", "gelu_erf", "silu", "leaky_relu", "sigmoid", "tanh")
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def sigmoid(z):
    """1 / (1 + e^-z) without overflow, relatively exact also far below 0 (sigmoid(-80) is 1.8e-35, not 0)."""
    with np.errstate(over="ignore"):
        e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _erf(z):
    return np.vectorize(math.erf, otypes=[np.float64])(z)


def apply(act: str, z: np.ndarray, slope: float = 0.01) -> np.ndarray:
    if act == "none":
        return z
    if act == "relu":
        return np.maximum(z, 0.0)
    if act == "gelu":
        return 0.5 * z * (1.0 + np.tanh(_SQRT_2_OVER_PI * (z + _GELU_CUBIC * z**3)))
    if act == "gelu_erf":
        return 0.5 * z * (1.0 + _erf(z / math.sqrt(2.0)))
    if act == "silu":
        return z * sigmoid(z)
    if act == "leaky_relu":
        return np.where(z > 0, z, slope * z)
    if act == "sigmoid":
        return sigmoid(z)
    if act == "tanh":
        return np.tanh(z)
    raise ValueError(f"act: expected one of {', '.join(ACTIVATIONS)}, got {act!r}")


def derivative(act: str, z: np.ndarray, slope: float = 0.01) -> np.ndarray:
    """d act(z) / dz at the pre-activation z."""
    if act == "none":
        return np.ones_like(z)
    if act == "relu":
        return (z > 0).astype(z.dtype)
    if act == "gelu":
        inner = _SQRT_2_OVER_PI * (z + _GELU_CUBIC * z**3)
        t = np.tanh(inner)
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * z * z)
    if act == "gelu_erf":
        return 0.5 * (1.0 + _erf(z / math.sqrt(2.0))) + z * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    if act == "silu":
        s = sigmoid(z)
        return s * (1.0 + z * (1.0 - s))
    if act == "leaky_relu":
        return np.where(z > 0, 1.0, slope).astype(z.dtype)
    if act == "sigmoid":
        s = sigmoid(z)
        return s * (1.0 - s)
    if act == "tanh":
        return 1.0 - np.tanh(z) ** 2
    raise ValueError(f"act: expected one of {', '.join(ACTIVATIONS)}, got {act!r}")
