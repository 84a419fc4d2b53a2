"""Element types GE2 knows, by name, their NumPy host types, type promotion and the C++ compute types of
generated kernels.

bfloat16 host arrays are NumPy arrays of ``ml_dtypes.bfloat16`` (NumPy has no bfloat16 of its own), FP8 ones of
``ml_dtypes.float8_e4m3fn`` and ``ml_dtypes.float8_e5m2``; the same names are used everywhere (torch spells them
alike): ``float32 float16 bfloat16 int32 int64 uint8 bool float8_e4m3fn float8_e5m2``. ``bool`` is the dtype of
masks (comparisons, logical ops, ``where``'s condition): one byte per element, 0 or 1, NumPy's ``bool_``.

``FLOAT_DTYPES`` are the float dtypes kernels compute in. The FP8 dtypes (``FLOAT8_DTYPES``: Hopper's E4M3 with no
infinities, largest finite 448, and E5M2, largest finite 57344) are storage: ``cast`` and ``quantize_fp8`` write
them, ``scaled_gemm`` reads them; an op that is not written for them rejects them.

Type promotion follows PyTorch (``result_type``): bool < integers < floating types by category; within a
category the wider type wins, float16 with bfloat16 gives float32 and uint8 with a signed integer the signed
one. Python scalars and 0-d tensors only decide the category, as in PyTorch: ``int32[n] + 2.5`` is float32,
``float16[n] + 2.5`` float16, ``float16[n] * float32[]`` float16. FP8 dtypes do not promote (nor in PyTorch).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
INT_DTYPES = ("int32", "int64", "uint8")
FLOAT8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",) + FLOAT8_DTYPES

# The largest finite value of each FP8 format: what a saturating cast clamps to, and the scale's target.
FLOAT8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}

_NUMPY = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}
_ITEMSIZE = {name: dtype.itemsize for name, dtype in _NUMPY.items()}

# The C++ type generated kernels compute in (OpDef.scalar): 16-bit floats compute in float32.
_COMPUTE_CTYPE = {"float32": "float", "float16": "float", "bfloat16": "float", "int32": "int", "int64": "long long",
                  "uint8": "unsigned char", "bool": "bool"}


def normalize(dtype, argument: str = "dtype") -> str:
    """Accepts a GE2 name, a NumPy dtype, a torch dtype or a CuPy dtype and returns the GE2 name."""
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
    elif hasattr(dtype, "is_floating_point") and str(dtype).startswith("torch."):
        name = str(dtype).removeprefix("torch.")
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise TypeError(f"{argument}: expected one of {', '.join(ALL_DTYPES)}, got {dtype!r}") from None
    if name not in _NUMPY:
        raise TypeError(f"{argument}: expected one of {', '.join(ALL_DTYPES)}, got {name!r}")
    return name


def to_numpy(name: str) -> np.dtype:
    return _NUMPY[normalize(name)]


def itemsize(name: str) -> int:
    return _ITEMSIZE[name]


def is_float(name: str) -> bool:
    return name in FLOAT_DTYPES


def is_float8(name: str) -> bool:
    return name in FLOAT8_DTYPES


def saturate_to_float8(x, dtype: str) -> np.ndarray:
    """``x`` rounded to the FP8 ``dtype`` as GE2's kernels and cuBLASLt do it: to nearest even, saturating at the
    largest finite value (infinities included; ml_dtypes' own cast overflows to NaN or infinity instead), NaN kept.
    Returned in float64, every value exactly representable in ``dtype``. Each element is rounded once: float64
    values go through float32 first only when they are float32 values already (the kernels' inputs are)."""
    limit = FLOAT8_MAX[dtype]
    clipped = np.clip(np.asarray(x, dtype=np.float64), -limit, limit)  # np.clip keeps NaN
    return clipped.astype(np.float32).astype(_NUMPY[dtype]).astype(np.float64)


def is_integer(name: str) -> bool:
    return name in INT_DTYPES


# ---------------------------------------------------------------------------------------------------------------
# Type promotion (PyTorch's rule)
# ---------------------------------------------------------------------------------------------------------------
def _category(name: str) -> int:
    return 0 if name == "bool" else 1 if is_integer(name) else 2


_INT_RANK = {"uint8": 0, "int32": 1, "int64": 2}  # every pair's promotion is the higher of the two here
_FLOAT_RANK = {"float16": 0, "bfloat16": 0, "float32": 1}


def promote_types(a: str, b: str) -> str:
    """The dtype two tensors of dtypes ``a`` and ``b`` promote to (``torch.promote_types``)."""
    a, b = normalize(a, "a"), normalize(b, "b")
    if a == b:
        return a
    if is_float8(a) or is_float8(b):
        raise TypeError(f"a, b: FP8 dtypes do not promote (as in PyTorch), got {a} and {b}; cast first")
    ca, cb = _category(a), _category(b)
    if ca != cb:
        return a if ca > cb else b
    if ca == 1:
        return max(a, b, key=_INT_RANK.__getitem__)
    return max(a, b, key=_FLOAT_RANK.__getitem__) if _FLOAT_RANK[a] != _FLOAT_RANK[b] else "float32"


def _combine_categories(higher: str | None, lower: str | None) -> str | None:
    """PyTorch's ``combine_categories``: the higher-priority operands' dtype unless the lower ones are of a higher
    category (bool below integers below floats), which then promotes."""
    if higher is None:
        return lower
    if lower is None or is_float(higher):
        return higher
    if higher == "bool" or is_float(lower):
        return promote_types(higher, lower)
    return higher


def result_type(*operands) -> str:
    """The dtype of an op's result over ``operands`` (PyTorch's ``torch.result_type``). An operand is a dtype name
    (a tensor with dims), an object with ``.dtype`` and ``.shape`` (a TensorType or array: 0-d ones rank below
    tensors with dims) or a Python scalar (bool, int or float: lowest priority; an int stands for int64, a float
    for float32, the default float dtype)."""
    tiers: list[str | None] = [None, None, None]  # tensors with dims, 0-d tensors, Python scalars
    for index, operand in enumerate(operands):
        if isinstance(operand, (bool, np.bool_)):
            tier, dtype = 2, "bool"
        elif isinstance(operand, (int, np.integer)):
            tier, dtype = 2, "int64"
        elif isinstance(operand, (float, np.floating)):
            tier, dtype = 2, "float32"
        elif isinstance(operand, str):
            tier, dtype = 0, normalize(operand, f"operands[{index}]")
        elif hasattr(operand, "dtype") and hasattr(operand, "shape"):
            tier, dtype = (1 if len(operand.shape) == 0 else 0), normalize(operand.dtype, f"operands[{index}]")
        else:
            raise TypeError(f"operands[{index}]: expected a dtype name, a tensor type or a Python bool/int/float, "
                            f"got {type(operand).__name__}")
        if is_float8(dtype):
            raise TypeError(f"operands[{index}]: {dtype} is a storage dtype (cast, quantize_fp8, scaled_gemm); "
                            "arithmetic on it is not defined (nor in PyTorch): cast to a float dtype first")
        tiers[tier] = dtype if tiers[tier] is None else promote_types(tiers[tier], dtype)
    result = _combine_categories(tiers[0], _combine_categories(tiers[1], tiers[2]))
    if result is None:
        raise ValueError("operands: expected at least one operand")
    return result


def compute_ctype(in_types) -> str:
    """The C++ type a generated kernel computes a pointwise node in, from its input types (TensorTypes, None for
    an absent optional input): ``"float"`` when they promote (``result_type``) to a floating dtype (16-bit types
    compute in float32), else the promoted dtype's C++ type (``"int"``, ``"long long"``, ``"unsigned char"``,
    ``"bool"``). ``OpDef.scalar`` receives its inputs converted to it."""
    return _COMPUTE_CTYPE[result_type(*(t for t in in_types if t is not None))]
