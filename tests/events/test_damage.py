"""Truncated, corrupt and killed files: the reader keeps every intact record."""

import os
import signal
import subprocess
import sys
import time

import pytest

from msmon_nb.events.reader import read_events
from msmon_nb.events.runs import load_run
from tests.support.events import scalar_records, steps_of, write_file


def test_every_cut_inside_last_record(tmp_path):
    records = scalar_records(6)
    path = tmp_path / "events.out.events.summary.1.0.h_MS"
    write_file(path, records)
    full = path.read_bytes()
    last = records[-1]
    head = full[: len(full) - len(last)]
    for cut in range(len(last)):
        path.write_bytes(head + last[:cut])
        reader = read_events(path)
        got = list(reader)
        assert steps_of(got) == [0, 1, 2, 3, 4], cut
        assert reader.problems == [], cut
        with open(path, "ab") as f:
            f.write(last[cut:])
        assert steps_of(list(reader)) == [5], cut
        assert reader.problems == []


def test_tail_grows_byte_by_byte(tmp_path):
    records = scalar_records(3)
    path = tmp_path / "events.out.events.summary.1.0.h_MS"
    data = b"".join(records)
    path.write_bytes(b"")
    reader = read_events(path)
    seen = []
    for i in range(len(data)):
        with open(path, "ab") as f:
            f.write(data[i : i + 1])
        seen += steps_of(list(reader))
    assert seen == [0, 1, 2]
    assert reader.problems == []


@pytest.mark.parametrize("where", ["length", "length_crc", "payload", "payload_crc"])
def test_flipped_byte_reports_record_and_keeps_the_rest(tmp_path, where):
    records = scalar_records(10)
    path = tmp_path / "events.out.events.summary.1.0.h_MS"
    offsets = write_file(path, records)
    i = 4
    within = {"length": 2, "length_crc": 9, "payload": 20, "payload_crc": len(records[i]) - 2}
    data = bytearray(path.read_bytes())
    data[offsets[i] + within[where]] ^= 0x40
    path.write_bytes(bytes(data))
    reader = read_events(path)
    got = steps_of(list(reader))
    assert got == [s for s in range(10) if s != i]
    assert [p.offset for p in reader.problems] == [offsets[i]]
    assert str(path) in str(reader.problems[0])


def test_garbage_between_records_resynchronises(tmp_path):
    records = scalar_records(6)
    path = tmp_path / "events.out.events.summary.1.0.h_MS"
    garbage = os.urandom(333)
    path.write_bytes(b"".join(records[:3]) + garbage + b"".join(records[3:]))
    reader = read_events(path)
    assert steps_of(list(reader)) == list(range(6))
    assert len(reader.problems) == 1
    assert reader.problems[0].offset == len(b"".join(records[:3]))


def test_run_with_damage_is_marked_damaged(tmp_path):
    records = scalar_records(5)
    path = tmp_path / "events.out.events.summary.1.0.h_MS"
    offsets = write_file(path, records)
    data = bytearray(path.read_bytes())
    data[offsets[2] + 30] ^= 1
    path.write_bytes(bytes(data))
    path.chmod(0o400)
    run = load_run(tmp_path)
    assert run.scalars("a/x").steps.tolist() == [0, 1, 3, 4]
    assert run.status == "damaged"
    assert run.problems[0].offset == offsets[2]


KILLED_WRITER = r"""
import json, os, socket, sys, time
from msmon_nb.events.writer import EventWriter
marker = {"status": "running", "pid": os.getpid(), "host": socket.gethostname()}
open(sys.argv[1] + "/msmon_run.json", "w").write(json.dumps(marker))
w = EventWriter(sys.argv[1], flush_secs=0.05)
step = 0
while True:
    w.add_scalars(step, {"a": step, "b": -step})
    step += 1
    if step % 500 == 0:
        print(step, flush=True)
        time.sleep(0.01)
"""


def test_sigkilled_writer_leaves_readable_prefix(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stdout:
            if int(line) >= 20_000:
                break
        time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    run = load_run(tmp_path)
    a = run.scalars("a")
    n = len(a.steps)
    assert n >= 19_000
    assert a.steps.tolist() == list(range(n))
    assert a.values.tolist() == [float(s) for s in range(n)]
    assert run.problems == []
    assert run.status == "interrupted"  # the marker says running, but its pid is gone
