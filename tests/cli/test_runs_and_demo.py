"""The ``msmon`` command: runs listing and the demo, run as a user would."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from msmon_nb.events.runs import load_run
from msmon_nb.events.writer import EventWriter

MSMON = [sys.executable, "-m", "msmon_nb.cli"]


def msmon(*args, cwd=None, check=True):
    proc = subprocess.run(
        [*MSMON, *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=dict(os.environ, GLOG_v="3"),
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_console_script_installed():
    exe = shutil.which("msmon", path=str(Path(sys.executable).parent))
    assert exe is not None
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "runs" in proc.stdout


def test_runs_json_lists_every_run(tmp_path):
    for name, steps in (("a", 10), ("nested/b", 25)):
        with EventWriter(tmp_path / name) as writer:
            for step in range(steps):
                writer.add_scalars(step, {"train/loss": 1.0 / (step + 1), "train/lr": 0.1})
    (tmp_path / "not_a_run").mkdir()
    (tmp_path / "not_a_run" / "notes.txt").write_text("hello")
    out = json.loads(msmon("runs", str(tmp_path), "--json").stdout)
    by_name = {r["name"]: r for r in out}
    assert sorted(by_name) == ["a", "nested/b"]
    assert by_name["nested/b"]["last_step"] == 24
    assert by_name["nested/b"]["points"] == 50
    assert by_name["a"]["tags"] == ["train/loss", "train/lr"]
    assert by_name["a"]["status"] == "finished"
    assert by_name["a"]["last_write"] > 0


def test_runs_table_and_missing_base(tmp_path):
    with EventWriter(tmp_path / "r1") as writer:
        writer.add_scalar("x", 1.0, 3)
    for rank in (0, 1):  # a two-rank job: one dir per rank
        with EventWriter(tmp_path / "job" / f"rank_{rank}", rank=rank) as writer:
            writer.add_scalar("x", 1.0, 5 + rank)
    table = msmon("runs", str(tmp_path)).stdout
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    assert rows["r1"][1:5] == ["finished", "3", "1", "1"]
    # ranks: "-" for one process (a "0" there read as "zero ranks"), each rank for a job
    assert rows["r1"][5] == "-"
    assert "0:5 1:6" in table
    missing = msmon("runs", str(tmp_path / "nope"), check=False)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_demo_trains_and_reports(tmp_path):
    proc = msmon("demo", "--steps", "40", "--dir", str(tmp_path), "--no-view")
    assert "run written to" in proc.stdout
    run_dir = Path(proc.stdout.split("run written to ")[1].split()[0])
    run = load_run(run_dir)
    for tag in ("train/loss", "train/grad_norm", "train/learning_rate", "train/throughput"):
        assert run.scalars(tag).steps.tolist() == list(range(40)), tag
    lr = run.scalars("train/learning_rate").values
    assert lr[0] < lr[3]  # the warmup is visible step by step
    assert np.all(run.scalars("train/grad_norm").values > 0)


def test_ipython_extension_loads():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "msmon_nb")
    assert "msmon_nb" in shell.extension_manager.loaded
