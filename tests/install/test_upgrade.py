"""``pip install msmon_nb`` where a supported MindSpore is installed leaves that MindSpore alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def installed_mindspore(python: Path) -> str:
    code = "import importlib.metadata as md; print(md.version('mindspore'))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()  # fmt: skip


def dry_run(python: Path, wheel: Path, report: Path) -> dict:
    """What ``pip install <wheel>`` would do in ``python``'s environment; nothing installed."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run",
         "--quiet", "--report", str(report), str(wheel)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(report.read_text())


# .venv holds MindSpore 2.10; .venv-ms27, when present, 2.7.1 (the version job's venv)
ENVS = [ROOT / ".venv" / "bin" / "python", ROOT / ".venv-ms27" / "bin" / "python"]


@pytest.mark.parametrize("python", ENVS, ids=[p.parts[-3] for p in ENVS])
def test_installing_the_wheel_keeps_the_installed_mindspore(python, wheel, tmp_path):
    if not python.exists():
        pytest.skip(f"{python} does not exist here")
    before = installed_mindspore(python)
    report = dry_run(python, wheel, tmp_path / "report.json")
    names = {item["metadata"]["name"].lower(): item["metadata"]["version"]
             for item in report["install"]}  # fmt: skip
    assert names.get("msmon_nb", names.get("msmon-nb")) == "0.1.0", names  # it did resolve
    assert "mindspore" not in names, f"would replace MindSpore {before}: {names}"
    assert "numpy" not in names, names  # MindSpore's NumPy 1.x stays too
    assert installed_mindspore(python) == before
