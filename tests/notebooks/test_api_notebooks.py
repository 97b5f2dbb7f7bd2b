"""The notebooks/ examples, executed top to bottom in a real kernel."""

import os
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from msmon_nb.events.runs import load_runs

ROOT = Path(__file__).resolve().parents[2]


def execute(name: str, save_dir: Path, timeout: int = 600):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    os.environ["MSMON_SAVE_DIR"] = str(save_dir)
    try:
        NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(save_dir)}},
        ).execute()
    finally:
        os.environ.pop("MSMON_SAVE_DIR", None)
    return nb


def outputs(nb) -> str:
    return "\n".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )


@pytest.mark.parametrize(
    ("name", "steps"),
    [("api_watch.ipynb", 60), ("api_explicit.ipynb", 30), ("api_callback.ipynb", 48)],
)
def test_notebook_runs_and_writes_a_run(tmp_path, name, steps):
    nb = execute(name, tmp_path)
    assert "run:" in outputs(nb)
    (run,) = load_runs(tmp_path)
    assert run.status == "finished"
    loss = run.scalars("train/loss")
    assert len(loss.steps) == steps
    assert np.all(np.isfinite(run.scalars("train/grad_norm").values))
    lr = run.scalars("train/learning_rate").values
    assert lr[0] < lr[-1] or name == "api_callback.ipynb"


def test_gan_notebook_records_each_network_on_its_own(tmp_path):
    """notebooks/gan.ipynb: a tiny GAN's two train cells under ``%%msmonitor``: one step
    per iteration, each network's losses exactly the loop's, no mixed ``train/*``."""
    os.environ["MSMON_STEPS"] = "40"
    try:
        nb = execute("gan.ipynb", tmp_path)
    finally:
        os.environ.pop("MSMON_STEPS", None)
    text = outputs(nb)
    assert "gan finished 40 iterations" in text
    assert "D's losses are the loop's: True" in text
    assert "G's losses are the loop's: True" in text
    assert "no mixed series: True" in text
    (run,) = load_runs(tmp_path)
    for name in ("netd", "netg"):
        assert run.scalars(f"opt/{name}/grad_norm").steps.tolist() == list(range(40))
        assert np.all(np.isfinite(run.scalars(f"opt/{name}/grad_norm").values))
