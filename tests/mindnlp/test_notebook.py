"""notebooks/mindnlp_trainer.ipynb in a real kernel of this venv: transformers' Trainer
(gradient accumulation 2, clipping, a linear schedule) under ``%%msmonitor`` with the live
panel: one step per optimizer update, the Trainer's own loss, lr and grad_norm, and
weights and AdamW state bit-identical to the unmonitored twin the notebook trains first.

The notebook installs the stand-in for MindNLP's two missing CPU kernels (mindtorch
``addcdiv``; the ``axis=None`` norm inside ``clip_grad_norm_``) before either run.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import numpy as np
from nbclient import NotebookClient

from msmon_nb.events.runs import load_runs

ROOT = Path(__file__).resolve().parents[2]
UPDATES = 4


def text(cell) -> str:
    return "\n".join(o.get("text", "") for o in cell.get("outputs", []))


def test_trainer_notebook_with_the_live_panel(tmp_path):
    nb = nbformat.read(ROOT / "notebooks" / "mindnlp_trainer.ipynb", as_version=4)
    env = {"MSMON_SAVE_DIR": str(tmp_path), "MSMON_STEPS": str(UPDATES)}
    os.environ.update(env)
    try:
        NotebookClient(
            nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()
    finally:
        for name in env:
            os.environ.pop(name, None)
    code = [c for c in nb.cells if c.cell_type == "code"]
    monitored = next(c for c in code if c.source.startswith("%%msmonitor"))
    data = [o.get("data", {}) for o in monitored.get("outputs", [])]
    assert any("image/png" in d for d in data), "the saved notebook keeps a picture of the panel"
    said = text(code[-1])
    assert f"mindnlp finished {UPDATES} steps for {UPDATES} updates" in said, said
    for line in (
        "loss is the Trainer's: True",
        "lr is the Trainer's: True",
        "grad_norm is the Trainer's: True",
        "clipped: True",
        "weights and AdamW state bit-identical: True",
    ):
        assert line in said, said
    (run,) = load_runs(tmp_path)
    assert run.status == "finished"
    assert run.scalars("train/learning_rate").steps.tolist() == list(range(UPDATES))
    assert np.all(np.isfinite(run.scalars("train/grad_norm_clipped").values))
