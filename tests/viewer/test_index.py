"""The cheap run index: head/tail reads, tailing, truncation, markers, MindSpore runs."""

import json
import socket
import subprocess
import sys

import numpy as np

from msmon_nb.events import wire
from msmon_nb.events.framing import frame
from msmon_nb.events.index import RunIndex, find_record_start
from msmon_nb.events.runs import load_run
from msmon_nb.events.writer import EventWriter
from msmon_nb.rundir import MARKER
from tests.support.synth import write_run


def test_long_run_listed_from_head_and_tail(tmp_path):
    n = 300_000
    write_run(tmp_path / "long", np.arange(n), {"train/loss": np.ones(n), "train/lr": np.ones(n)})
    index = RunIndex(tmp_path)
    (info,) = index.scan()
    assert info.name == "long"
    assert info.tags == ("train/loss", "train/lr")
    assert info.last_step == n - 1
    assert info.status == "finished"
    assert info.exact is False  # the middle was skipped
    assert info.ranks == (0,)


def test_short_run_is_exact_and_matches_full_load(tmp_path, mindspore_run):
    with EventWriter(tmp_path / "a") as writer:
        for step in range(50):
            writer.add_scalars(step, {"train/loss": 1.0, "val/acc": 0.5})
        writer.add_histogram("w", np.arange(10.0), step=50)
    index = RunIndex(tmp_path)
    (info,) = index.scan()
    run = load_run(tmp_path / "a")
    assert info.exact
    assert list(info.tags) == run.tags()
    assert info.last_step == run.last_step == 50
    ms_info = RunIndex(mindspore_run.parent).scan()[0]
    assert ms_info.tags == ("acc", "loss") and ms_info.last_step == 30


def test_growing_file_is_followed_and_new_tags_seen(tmp_path):
    writer = EventWriter(tmp_path / "live", flush_secs=0.05)
    try:
        for step in range(100):
            writer.add_scalars(step, {"train/loss": 1.0})
        writer.flush()
        index = RunIndex(tmp_path)
        first = index.scan()[0]
        assert first.last_step == 99 and first.status == "running"
        for step in range(100, 3000):
            writer.add_scalars(step, {"train/loss": 1.0})
        writer.add_scalars(3000, {"train/loss": 1.0, "val/acc": 0.9})
        writer.flush()
        second = index.scan()[0]
        assert second.last_step == 3000
        assert second.tags == ("train/loss", "val/acc")
        assert second.exact and second.signature != first.signature
    finally:
        writer.close()


def test_record_start_found_after_garbage_and_truncated_tail(tmp_path):
    records = [frame(wire.scalar_event(s, 1.0 + s, [("x", float(s))])) for s in range(20)]
    garbage = bytes(range(7)) * 3
    buf = garbage + b"".join(records)
    assert find_record_start(buf) == len(garbage)
    assert find_record_start(b"\x00" * 40) is None
    # a run whose last record was cut by a crash: the tail read ends at the last whole one
    run = tmp_path / "cut" / "events.out.events.summary.1.0.h_MS"
    run.parent.mkdir()
    blob = frame(wire.version_event(0.5)) + b"".join(records)
    run.write_bytes(blob[:-5])
    index = RunIndex(tmp_path, head_bytes=64, tail_bytes=200, follow_bytes=64)
    (info,) = index.scan()
    assert info.last_step == 18 and not info.exact


def test_marker_status_running_and_interrupted(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for name, pid in (("alive", proc.pid), ("dead", 2**22 + 1)):
            run_dir = tmp_path / name
            with EventWriter(run_dir) as writer:
                writer.add_scalar("train/loss", 1.0, 0)
            marker = {"status": "running", "pid": pid, "host": socket.gethostname()}
            (run_dir / MARKER).write_text(json.dumps(marker))
        (tmp_path / "done").mkdir()
        (tmp_path / "done" / MARKER).write_text(json.dumps({"status": "finished"}))
        statuses = {i.name: i.status for i in RunIndex(tmp_path).scan()}
        assert statuses == {"alive": "running", "dead": "interrupted", "done": "finished"}
    finally:
        proc.kill()
        proc.wait()


def test_missing_base_lists_nothing(tmp_path):
    assert RunIndex(tmp_path / "nope").scan() == []
    (tmp_path / "empty").mkdir()
    assert RunIndex(tmp_path / "empty").scan() == []


def test_cold_load_reports_progress_for_big_runs():
    import io

    from msmon_nb.viewer.store import PROGRESS_BYTES, load_progress

    out = io.StringIO()
    report = load_progress("big", stream=out, every=0.0)
    report(10, 1000)  # small runs stay quiet
    assert out.getvalue() == ""
    total = 2 * PROGRESS_BYTES
    for done in (total // 4, total // 2, total):
        report(done, total)
    lines = out.getvalue().splitlines()
    assert [line.split(": ")[2].split("%")[0] for line in lines] == ["25", "50", "100"]
    assert all(line.startswith("msmon view: loading big:") for line in lines)
