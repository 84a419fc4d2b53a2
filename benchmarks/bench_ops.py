"""Op benchmarks, GE2 vs PyTorch, one process, one GPU. Every case checks GE2 against PyTorch before timing and
reports effective bandwidth (the bytes the op must move over its time) next to each time.

Cases live in benchmarks/op_cases/<op>.py: each defines ``cases(torch)`` returning a list of dicts with
  name:      row label, e.g. "softmax fwd f16 16384x4096"
  ge2:       zero-argument callable running the GE2 op (inputs prepared, outputs preallocated where possible)
  torch:     zero-argument callable running the PyTorch equivalent
  check:     zero-argument callable raising AssertionError if GE2's result disagrees with PyTorch's
  bytes:     bytes the op must move (each input read once, each output written once)
  target:    optional target, e.g. {"tb_s": 2.4} or {"speedup": 1.5} (reported, never asserted)
Run: python benchmarks/bench_ops.py [name-filter ...]
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import median_ms, torch_cuda, write_results  # noqa: E402

COPY_BYTES = 256 << 20  # large enough that the L2 cache does not count


def copy_ceiling_tb_s(torch) -> float:
    """Read + write TB/s of a device-to-device copy on this GPU: the ceiling a bandwidth-bound op can reach
    (about 3.0 on an H100, 4.1 on an H200), measured in this process rather than assumed."""
    source = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    destination = torch.empty_like(source)
    return 2 * COPY_BYTES / (median_ms(lambda: destination.copy_(source)) * 1e-3) / 1e12


def main(filters: list[str]) -> None:
    torch = torch_cuda()
    ceiling_tb_s = copy_ceiling_tb_s(torch)
    print(f"device-to-device copy ceiling: {ceiling_tb_s:.2f} TB/s", flush=True)
    rows = []
    for path in sorted((Path(__file__).parent / "op_cases").glob("[!_]*.py")):
        module = importlib.import_module(f"op_cases.{path.stem}")
        for case in module.cases(torch):
            if filters and not any(f in case["name"] for f in filters):
                continue
            try:
                case["check"]()
            except AssertionError as error:  # a wrong result is reported, never timed
                rows.append({"case": case["name"], "met": f"CHECK FAILED: {error}"})
                print(f"{case['name']:<48} CHECK FAILED: {error}", flush=True)
                continue
            ge2_ms = median_ms(case["ge2"])
            torch_ms = median_ms(case["torch"])
            ge2_tb_s = case["bytes"] / (ge2_ms * 1e-3) / 1e12
            target = case.get("target", {})
            met = ""
            if "tb_s" in target:
                met = "yes" if ge2_tb_s >= target["tb_s"] else "NO"
            elif "speedup" in target:
                met = "yes" if torch_ms / ge2_ms >= target["speedup"] else "NO"
            elif "copy_fraction" in target:
                met = "yes" if ge2_tb_s >= target["copy_fraction"] * ceiling_tb_s else "NO"
            rows.append({
                "case": case["name"], "ge2_ms": ge2_ms, "torch_ms": torch_ms, "speedup": torch_ms / ge2_ms,
                "ge2_tb_s": ge2_tb_s, "torch_tb_s": case["bytes"] / (torch_ms * 1e-3) / 1e12,
                "copy_fraction": ge2_tb_s / ceiling_tb_s, "target": ", ".join(f"{k}>={v}" for k, v in target.items()),
                "met": met,
            })
            print(f"{case['name']:<48} ge2 {ge2_ms:8.4f} ms {ge2_tb_s:6.2f} TB/s | torch {torch_ms:8.4f} ms "
                  f"| x{torch_ms / ge2_ms:5.2f} {met}", flush=True)
    columns = [("case", "case"), ("ge2_ms", "GE2 ms"), ("ge2_tb_s", "GE2 TB/s"), ("torch_ms", "PyTorch ms"),
               ("torch_tb_s", "PyTorch TB/s"), ("speedup", "speedup"), ("copy_fraction", "of copy ceiling"),
               ("target", "target"), ("met", "met")]
    print(write_results("ops", rows, columns, f"GE2 ops vs PyTorch (medians, L2 flushed; copy ceiling "
                                              f"{ceiling_tb_s:.2f} TB/s, measured)"))


if __name__ == "__main__":
    main(sys.argv[1:])
