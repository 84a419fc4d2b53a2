"""ONNX Resize as linear maps: the modes GE2's resize kernel does not run (cubic, antialiased downsampling,
exclude_outside, the half_pixel_symmetric and tf_crop_and_resize coordinates) interpolate each axis separately, so
each resized axis is a matrix product with an [out, in] weight matrix computed here, in float64, when the model is
imported. The weights follow the ONNX operator's definition: the source coordinate of every output position, the
interpolation coefficients of its neighbours (edge values beyond the input, or none with exclude_outside), and for
tf_crop_and_resize the output positions outside the input, which take extrapolation_value."""
from __future__ import annotations

import math

import numpy as np


def _source(position: int, scale: float, in_length: int, out_length: int, coordinates: str, roi) -> float:
    """ONNX's x_original of output ``position``; ``scale`` the axis's scale (its length_resized is in_length *
    scale, unrounded), ``roi`` (start, end) for tf_crop_and_resize."""
    resized_length = scale * in_length
    if coordinates == "half_pixel":
        return (position + 0.5) / scale - 0.5
    if coordinates == "half_pixel_symmetric":  # the centre of the input maps to the centre of the output
        offset = in_length / 2 * (1 - out_length / resized_length)
        return offset + (position + 0.5) / scale - 0.5
    if coordinates == "pytorch_half_pixel":
        return (position + 0.5) / scale - 0.5 if resized_length != 1 else -0.5
    if coordinates == "align_corners":
        return position * (in_length - 1) / (resized_length - 1) if resized_length != 1 else 0.0
    if coordinates == "asymmetric":
        return position / scale
    if coordinates == "tf_crop_and_resize":  # in the roi's type (float32), so that ties round as in ONNX
        start, end = roi
        if resized_length == 1:
            return (end - start) * (in_length - 1) / 2 + start * (in_length - 1)
        return position * (end - start) * (in_length - 1) / (resized_length - 1) + start * (in_length - 1)
    raise ValueError(f"coordinates: unknown transformation {coordinates!r}")


def _cubic(distance: float, a: float) -> float:
    """The cubic convolution kernel (Keys) with coefficient ``a`` at ``distance``."""
    distance = abs(distance)
    if distance <= 1:
        return (a + 2) * distance ** 3 - (a + 3) * distance ** 2 + 1
    if distance < 2:
        return a * distance ** 3 - 5 * a * distance ** 2 + 8 * a * distance - 4 * a
    return 0.0


def _coefficients(fraction: float, scale: float, mode: str, nearest_mode: str, cubic_a: float,
                  antialias: bool) -> tuple[int, np.ndarray]:
    """(the offset of the first neighbour from floor(x), the neighbours' coefficients) for a source coordinate
    floor(x) + ``fraction``, fraction in (0, 1]. Antialiasing widens the kernel by 1 / scale when downsampling."""
    if mode == "nearest":
        if fraction == 1:
            return 0, np.array([0.0, 1.0])
        up = {"round_prefer_floor": fraction > 0.5, "round_prefer_ceil": fraction >= 0.5, "floor": False,
              "ceil": True}[nearest_mode]
        return 0, np.array([0.0, 1.0]) if up else np.array([1.0, 0.0])
    stretch = min(scale, 1.0) if antialias else 1.0
    support = 1 if mode == "linear" else 2  # the kernel's half width at scale 1
    first = math.floor(-support / stretch) + 1
    offsets = np.arange(first, 1 - first + 1)
    if mode == "linear":
        coefficients = np.clip(1 - np.abs((offsets - fraction) * stretch), 0, 1)
    else:
        coefficients = np.array([_cubic((offset - fraction) * stretch, cubic_a) for offset in offsets])
    return int(first), coefficients / coefficients.sum() if antialias else coefficients


def interpolation_weights(in_length: int, out_length: int, scale: float, *, mode: str, coordinates: str,
                          nearest_mode: str = "round_prefer_floor", cubic_a: float = -0.75,
                          exclude_outside: bool = False, antialias: bool = False,
                          roi: tuple[float, float] = (0.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """(weights [out_length, in_length] float64, inside [out_length] bool) of one axis: output = weights @ input
    where ``inside``; elsewhere (tf_crop_and_resize's positions outside the input) the extrapolation value."""
    weights = np.zeros((out_length, in_length))
    inside = np.ones(out_length, bool)
    for position in range(out_length):
        source = _source(position, scale, in_length, out_length, coordinates, roi)
        if coordinates == "tf_crop_and_resize" and not 0 <= source <= in_length - 1:
            inside[position] = False
            continue
        base = math.floor(source)
        fraction = source - base
        if fraction == 0:  # the neighbour on the left is preferred: x = (x - 1) + 1
            base, fraction = base - 1, 1.0
        first, coefficients = _coefficients(fraction, scale, mode, nearest_mode, cubic_a, antialias)
        neighbours = base + first + np.arange(len(coefficients))
        if exclude_outside:
            coefficients = np.where((neighbours >= 0) & (neighbours < in_length), coefficients, 0.0)
            coefficients = coefficients / coefficients.sum()
        np.add.at(weights[position], np.clip(neighbours, 0, in_length - 1), coefficients)  # edge values beyond
    return weights, inside
