"""``msmon ctl``: a script's training, paused, re-tuned and stopped from another process,
with no page and no comm message (as VS Code's busy notebooks and scripts need)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from msmon_nb.events.runs import load_run
from msmon_nb.rundir import read_marker
from msmon_nb.rundir.control import CONTROL, ControlError, ControlReader, check_command
from tests.conftest import run_msmon as msmon
from tests.support.training import training_script


@pytest.fixture
def training(tmp_path):
    with training_script(tmp_path) as started:
        yield started


def last_step(run_dir: Path) -> int:
    run = load_run(run_dir)
    return int(run.scalars("train/loss").steps[-1])


def test_pause_freq_resume_and_stop_a_running_script(training):
    proc, run_dir = training
    time.sleep(1.5)  # some steps
    done = msmon("ctl", str(run_dir), "pause")
    assert done.returncode == 0, done.stderr
    assert "paused at step" in done.stdout
    time.sleep(1.5)  # the writer flushes at least once a second
    held = last_step(run_dir)
    time.sleep(1.5)
    assert last_step(run_dir) == held  # no step while paused

    done = msmon("ctl", str(run_dir), "freq", "5")
    assert done.returncode == 0, done.stderr
    assert "collecting every 5 steps" in done.stdout
    done = msmon("ctl", str(run_dir), "resume")
    assert done.returncode == 0, done.stderr
    time.sleep(2.0)

    started = time.monotonic()
    done = msmon("ctl", str(run_dir), "stop")
    assert done.returncode == 0, done.stderr
    out, _err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 10
    assert "status stopped" in out
    marker = read_marker(run_dir)
    assert marker["status"] == "stopped"
    assert "msmon ctl" in marker["stop_reason"]
    steps = load_run(run_dir).scalars("train/loss").steps.tolist()
    after = [s for s in steps if s > held + 1]
    assert after and all(s % 5 == 0 for s in after)  # freq 5 from the step after the resume


def test_ctl_says_when_no_live_monitor_owns_the_dir(tmp_path):
    import msmon_nb as mm

    with mm.Monitor(save_dir=str(tmp_path)) as mon:
        mon.step(loss=1.0)
    done = msmon("ctl", str(mon.run_dir), "stop")
    assert done.returncode == 1
    assert "no live monitor owns" in done.stderr and "finished" in done.stderr
    done = msmon("ctl", str(tmp_path / "nowhere"), "pause")
    assert done.returncode == 1 and "not a run written by msmon_nb" in done.stderr
    assert not (mon.run_dir / CONTROL).exists()  # nothing queued for a dead run


@pytest.mark.parametrize(
    ("cmd", "arg", "words"),
    [("freq", "x", "whole number"), ("freq", "0", "whole number"), ("jump", None, "unknown")],
)
def test_bad_commands_are_refused_with_the_fix(cmd, arg, words):
    with pytest.raises(ControlError, match=words):
        check_command(cmd, arg)


def test_a_monitor_reads_only_what_was_queued_after_it_opened(tmp_path):
    """An old command in a reused dir is never replayed; a torn last line waits."""
    path = tmp_path / CONTROL
    path.write_text(json.dumps({"id": "old", "cmd": "stop"}) + "\n")
    reader = ControlReader(tmp_path)
    assert reader.read() == []
    with open(path, "a") as f:
        f.write(json.dumps({"id": "a", "cmd": "freq", "arg": 3}) + "\n" + '{"id": "b", "cmd"')
    got = reader.read()
    assert [(c.id, c.cmd, c.arg) for c in got] == [("a", "freq", 3)]
    with open(path, "a") as f:
        f.write(': "pause"}\n')
    assert [c.id for c in reader.read()] == ["b"]
