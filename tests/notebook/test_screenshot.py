"""The README's panel picture (taken mid-run) is produced by a script in the repo: it must
keep working."""

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_screenshot_script_renders_the_panel_in_jupyterlab(tmp_path):
    if shutil.which("chromium") is None:
        pytest.fail("Debian chromium is required (installed by .ci/run and make test)")
    spec = importlib.util.spec_from_file_location("shot", ROOT / "docs" / "screenshot_panel.py")
    shot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shot)
    order = shot.screenshot(
        tmp_path / "panel.png", steps=3000, after=4.0, viewer_out=tmp_path / "viewer.png"
    )
    for out in (tmp_path / "panel.png", tmp_path / "viewer.png"):
        image = np.asarray(Image.open(out).convert("RGB"))
        assert image.shape[0] > 300 and image.shape[1] > 600
        # the charts are there: plenty of bluish line pixels, not a blank or error page
        r, g, b = (image[:, :, i].astype(int) for i in range(3))
        bluish = (b > r + 60) & (b > g + 20)
        assert bluish.sum() > 500, out
    # one run, the same charts in the same order in the notebook and in the viewer
    assert order["panel"][:5] == [
        "train/loss", "train/grad_norm", "train/learning_rate", "train/throughput",
        "train/step_time",
    ]  # fmt: skip
    assert order["viewer"] == order["panel"]
