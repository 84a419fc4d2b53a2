"""The per-element C++ of pointwise ops (``OpDef.scalar``), compiled with NVRTC on the CPU: every op with a scalar
rule, for every compute type its dtypes give, compiles, so a typo fails here and not in a generated kernel on the
GPU. Also the helpers that write the C++ and the compute type of a node."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from pathlib import Path

import pytest

from graph_executor_v2.dtypes import ALL_DTYPES, FLOAT8_DTYPES, compute_ctype
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS
from graph_executor_v2.ops._scalar import expression, literal

# The attribute sets each op's rule is compiled with (the rule's text depends on them); the others' defaults.
ATTR_SETS = {
    "mod": ({}, {"fmod": True}),
    "clip": ({}, {"min": -1.0, "max": 2.0}, {"min": 0.0}, {"max": float("inf")}),
    "leaky_relu": ({}, {"alpha": 0.2}),
    "elu": ({}, {"alpha": 0.5}),
    "cast": tuple({"dtype": dtype} for dtype in ALL_DTYPES if dtype not in FLOAT8_DTYPES),
}


def _input_dtypes(opdef, dtype):
    """One dtype per input: ``dtype`` everywhere, except conditions, which are masks."""
    return ["bool" if i.name == "cond" else dtype for i in opdef.inputs]


def _supported(opdef, attrs):
    """(compute ctype, output ctype) pairs of the dtypes the op accepts."""
    pairs = set()
    for dtype in [d for d in ALL_DTYPES if d not in FLOAT8_DTYPES]:  # FP8: storage, no generated kernel
        in_types = [TensorType((2,), d) for d in _input_dtypes(opdef, dtype)]
        try:
            (out_type,) = opdef.infer(in_types, attrs)
        except (TypeError, ValueError):
            continue
        pairs.add((compute_ctype(in_types), compute_ctype([out_type])))
    return sorted(pairs)


def _nvrtc():
    """libnvrtc from the CUDA toolkit (CUDA_HOME, /usr/local/cuda) or the loader's path; None where there is none."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    candidates = [str(Path(root) / "lib64" / "libnvrtc.so") for root in roots if root]
    found = ctypes.util.find_library("nvrtc")
    for path in candidates + ([found] if found else []):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


NVRTC = _nvrtc()


def _compile(source: str) -> str:
    """NVRTC's log of compiling ``source`` for sm_90, "" when it compiled."""
    program = ctypes.c_void_p()
    assert NVRTC.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"scalar.cu", 0, None, None) == 0
    options = [b"--gpu-architecture=compute_90", b"-std=c++17"]
    status = NVRTC.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    NVRTC.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    NVRTC.nvrtcGetProgramLog(program, log)
    NVRTC.nvrtcDestroyProgram(ctypes.byref(program))
    text = log.value.decode(errors="replace")
    return text if status != 0 else ""


def _cases():
    for name, opdef in sorted(OPS.items()):
        if opdef.scalar is None:
            continue
        for extra in ATTR_SETS.get(name, ({},)):
            attrs = opdef.validate_attrs(extra, name)
            for ctype, out_ctype in _supported(opdef, attrs):
                yield name, attrs, ctype, out_ctype


@pytest.mark.skipif(NVRTC is None, reason="needs libnvrtc from the CUDA toolkit (CUDA_HOME or /usr/local/cuda)")
def test_every_scalar_rule_compiles_with_nvrtc():
    kernels, owners = [], []
    for index, (name, attrs, ctype, out_ctype) in enumerate(_cases()):
        opdef = OPS[name]
        params = [f"in{i}" for i in range(len(opdef.inputs))]
        body = opdef.scalar(params, attrs, ctype)
        signature = ", ".join(f"{ctype} {p}" for p in params)
        kernels.append(f'extern "C" __global__ void k{index}({signature}, {out_ctype}* out) {{\n'
                       f"  *out = ({out_ctype})({body});\n}}\n")
        owners.append(f"{name} {attrs} in {ctype}")
    assert len(owners) > 200, "the pointwise ops should have scalar rules"
    source = "".join(kernels)
    log = _compile(source)
    lines = source.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith('extern "C"')]
    failing = set()
    for match in re.finditer(r"scalar\.cu\((\d+)\): error", log):
        line = int(match.group(1)) - 1
        failing.add(owners[max(i for i, start in enumerate(starts) if start <= line)])
    assert not log, f"scalar rules that do not compile: {sorted(failing)}\n{log[:4000]}"


@pytest.mark.skipif(NVRTC is None, reason="needs libnvrtc from the CUDA toolkit (CUDA_HOME or /usr/local/cuda)")
def test_nvrtc_check_catches_a_typo():
    assert "error" in _compile('extern "C" __global__ void k(float x, float* out) { *out = erfff(x); }')


def test_pointwise_ops_have_scalar_rules():
    expected = {"add", "sub", "mul", "div", "relu", "gelu", "gelu_erf", "silu", "sigmoid", "tanh", "exp", "neg",
                "bias_add", "relu_backward", "gelu_backward", "gelu_erf_backward", "silu_backward",
                "sigmoid_backward", "tanh_backward", "exp_backward"}
    assert expected <= {name for name, opdef in OPS.items() if opdef.scalar is not None}
    assert OPS["gemm"].scalar is None and OPS["softmax"].scalar is None


def test_compute_ctype_promotes_inputs():
    t = lambda dtype, shape=(4,): TensorType(shape, dtype)  # noqa: E731
    assert compute_ctype([t("float16"), t("float16")]) == "float"
    assert compute_ctype([t("bfloat16"), None]) == "float"
    assert compute_ctype([t("int32"), t("int64")]) == "long long"
    assert compute_ctype([t("uint8")]) == "unsigned char"
    assert compute_ctype([t("bool"), t("bool")]) == "bool"
    assert compute_ctype([t("bool"), t("uint8")]) == "unsigned char"
    assert compute_ctype([t("int32"), t("float16", ())]) == "float"  # a 0-d float tensor still makes it float
    assert compute_ctype([t("int32"), t("int64", ())]) == "int"  # ... but does not widen an integer


def test_literals():
    assert literal(0.5, "float") == "0.5f"
    assert literal(2, "float") == "2.0f"
    assert literal(1e-30, "float") == "1e-30f"
    assert literal(float("inf"), "float") == "__int_as_float(0x7f800000)"
    assert literal(float("-inf"), "float") == "-__int_as_float(0x7f800000)"
    assert literal(-3, "int") == "(-3)"
    assert literal(3, "long long") == "3LL"
    assert literal(True, "bool") == "true"
    with pytest.raises(ValueError, match="value: expected an integer"):
        literal(0.5, "int")


def test_expression_inlines_single_uses_and_wraps_repeated_ones():
    assert expression("a + b", ("a", "b"), ["x * 2", "b"], "float") == "((x * 2) + (b))"
    # an argument's own text is never substituted again (here "b" inside the first argument)
    assert expression("a - b", ("a", "b"), ["b", "a"], "int") == "((b) - (a))"
    wrapped = expression("x < 0 ? 0 : x", ("x",), ["expf(v)"], "float")
    assert wrapped == "([](float x) { return x < 0 ? 0 : x; }(expf(v)))"
    with pytest.raises(ValueError, match="args: expected 2"):
        expression("a + b", ("a", "b"), ["x"], "float")
