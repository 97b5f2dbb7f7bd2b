"""EventWriter behaviour: names, rotation, deadlines, permissions, exit paths, faults."""

import os
import platform
import re
import stat
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from msmon_nb.events.overview import read_overview
from msmon_nb.events.reader import read_events
from msmon_nb.events.runs import load_run
from msmon_nb.events.writer import EventWriter, WriterError


def test_file_name_like_summary_record(tmp_path):
    with EventWriter(tmp_path, rank=3) as writer:
        writer.add_scalar("a", 1.0, 0)
    pattern = rf"events\.out\.events\.summary\.\d+\.3\.{re.escape(platform.node())}_MS"
    assert re.fullmatch(pattern, writer.path.name)


def assert_overview_matches(run_dir):
    """The writer's overview is complete and says what the events say, block by block."""
    overview = read_overview(run_dir)
    assert overview is not None
    run = load_run(run_dir)
    for tag in overview.tags:
        rows = overview.tag_rows(tag)
        series = run.scalars(tag)
        assert int(rows["n"].sum()) == len(series.steps)
        assert (
            rows["first_step"][0] == series.steps[0] and rows["last_step"][-1] == series.steps[-1]
        )
        for row in rows[:: max(1, len(rows) // 7)]:
            inside = (series.steps >= row["first_step"]) & (series.steps <= row["last_step"])
            values = series.values[inside].astype(np.float64)
            assert row["min"] == values.min() and row["max"] == values.max()


def test_two_writers_in_one_second_never_share_a_file(tmp_path):
    with EventWriter(tmp_path) as a, EventWriter(tmp_path) as b:
        a.add_scalar("a", 1.0, 0)
        b.add_scalar("a", 2.0, 0)
    assert a.path != b.path
    assert len(list(tmp_path.glob("*summary*"))) == 2
    # their overviews cover one file each: neither is trusted for the dir
    assert read_overview(tmp_path) is None


def test_permissions_like_mindspore(tmp_path):
    logdir = tmp_path / "run"
    writer = EventWriter(logdir)
    writer.add_scalar("a", 1.0, 0)
    writer.flush()
    assert stat.S_IMODE(logdir.stat().st_mode) == 0o700
    assert stat.S_IMODE(writer.path.stat().st_mode) == 0o600
    writer.close()
    assert stat.S_IMODE(writer.path.stat().st_mode) == 0o400


def test_rotation_at_max_file_size(tmp_path):
    with EventWriter(tmp_path, max_file_size=4096) as writer:
        for step in range(2000):
            writer.add_scalars(step, {"train/loss": step, "train/lr": 0.1})
    assert len(writer.files) > 5
    for path in writer.files:
        assert path.stat().st_size <= 4096
        assert next(iter(read_events(path))).version == "MindSpore.Event:1"
        assert stat.S_IMODE(path.stat().st_mode) == 0o400
    names = sorted(p.name for p in writer.files)
    assert names == [p.name for p in writer.files]  # timestamps sort in write order
    run = load_run(tmp_path)
    assert run.scalars("train/loss").steps.tolist() == list(range(2000))


def test_flush_deadline_without_close(tmp_path):
    writer = EventWriter(tmp_path, flush_secs=0.5)
    try:
        writer.add_scalar("a", 1.0, 7)
        reader = read_events(writer.path)
        deadline = time.monotonic() + 1.0
        seen = []
        while time.monotonic() < deadline and not seen:
            seen = [r.step for r in reader if r.step is not None]
            time.sleep(0.02)
        assert seen == [7]
    finally:
        writer.close()


def test_explicit_flush_makes_records_visible(tmp_path):
    with EventWriter(tmp_path, flush_secs=60) as writer:
        for step in range(100):
            writer.add_scalar("a", step, step)
        writer.flush()
        assert len([r for r in read_events(writer.path) if r.step is not None]) == 100


def test_interpreter_exit_closes_files(tmp_path, python):
    python(
        "import sys; from msmon_nb.events.writer import EventWriter\n"
        "w = EventWriter(sys.argv[1], flush_secs=60)\n"
        "for s in range(1000): w.add_scalar('a', s, s)\n",
        str(tmp_path),
    )
    (path,) = tmp_path.glob("*summary*")
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    assert_overview_matches(tmp_path)
    assert load_run(tmp_path).scalars("a").steps.tolist() == list(range(1000))


def test_keyboard_interrupt_inside_with_closes_files(tmp_path, python):
    proc = python(
        "import sys; from msmon_nb.events.writer import EventWriter\n"
        "with EventWriter(sys.argv[1], flush_secs=60) as w:\n"
        "    for s in range(500): w.add_scalar('a', s, s)\n"
        "    raise KeyboardInterrupt\n",
        str(tmp_path),
        check=False,
    )
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
    (path,) = tmp_path.glob("*summary*")
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    assert_overview_matches(tmp_path)
    assert load_run(tmp_path).scalars("a").steps.tolist() == list(range(500))


def test_sigint_in_loop_closes_files(tmp_path):
    import signal
    import sys

    code = (
        "import sys, time; from msmon_nb.events.writer import EventWriter\n"
        "w = EventWriter(sys.argv[1], flush_secs=60)\n"
        "s = 0\n"
        "while True:\n"
        "    w.add_scalar('a', s, s); s += 1\n"
        "    if s == 300: print('ready', flush=True)\n"
        "    time.sleep(0.0005)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    (path,) = tmp_path.glob("*summary*")
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    assert_overview_matches(tmp_path)
    steps = load_run(tmp_path).scalars("a").steps
    assert len(steps) >= 300 and steps.tolist() == list(range(len(steps)))


def test_calls_after_close_raise(tmp_path):
    writer = EventWriter(tmp_path)
    writer.close()
    with pytest.raises(WriterError, match="closed"):
        writer.add_scalar("a", 1.0, 0)


def test_full_queue_drops_and_counts(tmp_path, caplog):
    big = np.zeros(256 * 1024, dtype=np.float32)  # 1 MB each
    with EventWriter(tmp_path, max_queue_bytes=2 * 2**20, block_secs=0.0, poll_secs=1.0) as w:
        for step in range(20):
            w.add_tensor("t", big, step)
    assert w.dropped > 0
    assert sum("dropping records" in r.message for r in caplog.records) == 1
    kept = load_run(tmp_path).tensors("t")
    assert len(kept) == 20 - w.dropped


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0:
        return False
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return proc.returncode == 0


def test_disk_full_surfaces_error_and_keeps_written_records(tmp_path):
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "256k"):
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    try:
        writer = EventWriter(mnt, flush_secs=0.05)
        with pytest.raises(WriterError, match="No space left"):
            for step in range(200_000):
                writer.add_scalars(step, {"train/loss": step, "train/grad_norm": 2.0 * step})
                if step % 1000 == 0:
                    time.sleep(0.01)
        writer.close()
        steps = load_run(mnt).scalars("train/loss").steps
        assert len(steps) > 1000
        assert steps.tolist() == list(range(len(steps)))
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_unwritable_dir_raises_clear_error(tmp_path):
    if os.geteuid() == 0:
        # root ignores permission bits; a read-only mount is the real fault for root
        mnt = tmp_path / "ro"
        if not _mount_tmpfs(mnt, "64k"):
            pytest.skip("cannot mount")
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        target = mnt
    else:
        target = tmp_path / "ro"
        target.mkdir()
        target.chmod(0o500)
    try:
        with pytest.raises(OSError, match=r"Read-only|Permission"):
            EventWriter(target)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(target)], check=False)
