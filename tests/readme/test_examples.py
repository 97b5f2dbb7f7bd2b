"""The manual's examples run as written: every Python block of the README and of every page
under ``docs/``, each page's blocks in order in an empty directory, through a real Jupyter
kernel (one cell per block) when a block uses a ``%`` magic, else as one script. An example
that drifts from the code fails here, not on a newcomer's first try.

A block that cannot run here (it needs Ascend, a GPU, a second process or a long run) says
so in the Markdown, ``<!-- no-exec: needs Ascend -->`` on the line before its fence, and
``NOT_RUN`` below lists it with that reason: a block is never skipped silently, and adding
one shows in this file's diff.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
import yaml
from nbclient import NotebookClient

from msmon_nb.config import MonitorConfig
from msmon_nb.events.runs import load_runs
from tests.readme.manual import NO_EXEC_REASON, ROOT, blocks, name, pages, python_blocks

# (page, reason) of every block marked no-exec, in page order
NOT_RUN: list[tuple[str, str]] = [
    (
        "docs/guide/distributed.md",
        "needs msrun: two worker processes (tests/distributed/test_msrun.py runs this loop, "
        "in tests/distributed/dp_train.py)",
    ),
]


def runnable(page: Path) -> list[str]:
    return [b.code for b in python_blocks(page) if b.no_exec is None]


def run_page(page: Path, cwd: Path) -> tuple[str, list]:
    """Run ``page``'s blocks in ``cwd``; what they printed, and the notebook's cells (if any)."""
    code = runnable(page)
    if any(c.lstrip().startswith("%") for c in code):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(c) for c in code]
        NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
        ).execute()  # raises on any cell's error, naming the cell
        printed = "".join(
            o.get("text", "") for c in nb.cells for o in c.outputs if o.get("name") == "stdout"
        )
        return printed, nb.cells
    script = cwd / "example.py"
    script.write_text("\n".join(code))
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{name(page)}:\n{proc.stderr[-3000:]}"
    return proc.stdout, []


def check_readme(cwd: Path, printed: str, cells: list) -> None:
    runs = load_runs(cwd / "summary")
    assert len(runs) == 3  # %%msmonitor, the watched loop, Model.train
    for run in runs:
        assert {"train/loss", "train/grad_norm"} <= set(run.tags()), run.name
    steps = sorted(len(run.scalars("train/loss").steps) for run in runs)
    assert steps == [100, 100, 100], steps  # 100 batches, in each of the three ways
    assert str([r.name for r in runs]) in printed, printed


def check_notebook(cwd: Path, printed: str, cells: list) -> None:
    assert cells[0].source.strip() == "%load_ext msmon_nb"
    assert any(c.source.startswith("%%msmonitor") for c in cells)
    (run,) = load_runs(cwd / "summary")
    loss = run.scalars("train/loss")
    assert loss.steps.tolist() == list(range(200))  # one step per batch of the loader
    assert len(run.scalars("train/grad_norm").values) == 200
    last = "".join(o.get("text", "") for o in cells[-1].outputs)
    assert last.startswith(run.name) and " 199 " in last, last


def check_python_api(cwd: Path, printed: str, cells: list) -> None:
    runs = load_runs(cwd / "summary")
    assert len(runs) == 3  # the watched loop, Model.train, the explicit steps
    for run in runs:
        assert {"train/loss", "train/grad_norm"} <= set(run.tags()), run.name
    assert str([r.name for r in runs]) in printed
    # "Reading runs from Python": the first run, its loss read back
    first = runs[0]
    assert f"{first.name} {len(first.scalars('train/loss').steps)} " in printed, printed


# what each page's example must have done, beyond running without an error
CHECKS: dict[str, Callable[[Path, str, list], None]] = {
    "README.md": check_readme,
    "docs/guide/notebook.md": check_notebook,
    "docs/guide/python-api.md": check_python_api,
}
RUN = [name(p) for p in pages() if runnable(p)]


def test_every_page_with_examples_is_run_and_checked():
    assert set(CHECKS) <= set(RUN), f"no runnable block left in {sorted(set(CHECKS) - set(RUN))}"
    # a new page with examples runs below on its own; this names the ones checked more
    assert {"README.md", "docs/guide/notebook.md", "docs/guide/python-api.md"} <= set(RUN)


@pytest.mark.parametrize("page", RUN)
def test_examples_run_as_written(page, tmp_path):
    printed, cells = run_page(ROOT / page, tmp_path)
    check = CHECKS.get(page)
    if check is not None:
        check(tmp_path, printed, cells)


def test_blocks_not_run_are_listed_with_their_reasons():
    marked = [(name(b.page), b.no_exec) for p in pages() for b in python_blocks(p) if b.no_exec]
    for page, reason in marked:
        assert NO_EXEC_REASON.match(reason), (
            f"{page}: no-exec reason {reason!r} must say what it needs ('needs Ascend', "
            "'needs a second process', ...) or 'long run'"
        )
    assert marked == NOT_RUN, f"blocks not run here: {marked}; list them in NOT_RUN"


def test_yaml_configs_load_as_written():
    """Every YAML block holding a ``monitor_config:`` is a config that loads (the guide's
    ``snapshot: {on: alert}`` did not: YAML 1.1 reads ``on`` as true)."""
    configs = [
        b for p in pages() for b in blocks(p) if b.lang == "yaml" and "monitor_config:" in b.code
    ]
    assert len(configs) >= 4, [b.where() for b in configs]
    for b in configs:
        try:
            MonitorConfig.from_dict(yaml.safe_load(b.code))
        except Exception as exc:
            raise AssertionError(f"{b.where()}: {exc}") from exc
