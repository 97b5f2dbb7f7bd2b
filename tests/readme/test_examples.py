"""The README's examples run as written: every Python block of "In a notebook" (through a
real kernel, magics included, one cell per block) and of "Monitoring a training run from
Python" (as a script), in an empty directory. An example that drifts from the code fails
here, not on a newcomer's first try."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from msmon_nb.events.runs import load_runs

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def blocks(section: str) -> list[str]:
    """The ```python blocks of the README section headed ``## <section>``."""
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    found = re.findall(r"^```python\n(.*?)^```", body, flags=re.M | re.S)
    assert found, f"no python block under '## {section}'"
    return found


def test_in_a_notebook_runs_as_written(tmp_path):
    cells = blocks("In a notebook")
    assert cells[0].strip() == "%load_ext msmon_nb"
    assert any(c.startswith("%%msmonitor") for c in cells)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()  # raises on any cell's error
    (run,) = load_runs(tmp_path / "summary")
    loss = run.scalars("train/loss")
    assert loss.steps.tolist() == list(range(200))  # one step per batch of the loader
    assert len(run.scalars("train/grad_norm").values) == 200
    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert printed.startswith(run.name) and " 199 " in printed, printed


def test_monitoring_from_python_runs_as_written(tmp_path):
    (code,) = blocks("Monitoring a training run from Python")
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = load_runs(tmp_path / "summary")
    assert len(runs) == 3  # the watched loop, Model.train, the explicit steps
    for run in runs:
        assert {"train/loss", "train/grad_norm"} <= set(run.tags()), run.name
    assert str([r.name for r in runs]) in proc.stdout
