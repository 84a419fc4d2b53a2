"""The documentation's examples run: every Python block of README.md and docs/*.md, as written, each in a process of
its own (in a temporary directory). A block's first line says what it needs beyond the base install
("# needs: ..."); one that needs "an NVIDIA GPU" runs in the GPU suite (marker ``gpu``), one that needs PyTorch skips
without it naming the extra, and one that needs the launcher runs under ``graph_executor_v2.distributed.run``."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)


def _blocks():
    for path in DOCUMENTS:
        text = path.read_text()
        for match in BLOCK.finditer(text):
            code = textwrap.dedent(match.group(2))
            line = text.count("\n", 0, match.start()) + 1
            needs = code.splitlines()[0].lower() if code.strip() else ""
            marks = [pytest.mark.gpu] if "an nvidia gpu" in needs else []
            yield pytest.param(code, needs, id=f"{path.relative_to(ROOT)}:{line}", marks=marks)


BLOCKS = list(_blocks())


def test_the_documents_have_python_blocks():
    assert len(BLOCKS) >= 6, [block.id for block in BLOCKS]


@pytest.mark.parametrize("code, needs", BLOCKS)
def test_block_runs_as_written(code, needs, tmp_path):
    assert needs.startswith("# needs:"), "the block's first line says what it needs: '# needs: ...'"
    if "pytorch" in needs:
        pytest.importorskip("torch", reason="the block needs PyTorch: pip install graph_executor_v2[torch]")
    script = tmp_path / "train.py"
    script.write_text(code)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MPLBACKEND": "Agg"}
    command = [sys.executable, str(script)]
    if "launcher" in needs:  # one rank per GPU, or two on the CPU backend
        from graph_executor_v2 import device

        ranks = device.device_count() or 2
        command = [sys.executable, "-m", "graph_executor_v2.distributed.run", "--nproc-per-node", str(ranks),
                   "--master-port", "0", str(script)]
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"exit code {result.returncode}:\n{output[-4000:]}"
