"""msmon export: CSV/JSONL equal to load_run; tfevents read by TensorBoard's own loader."""

import csv
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from msmon_nb.events.runs import load_run
from msmon_nb.events.writer import EventWriter
from msmon_nb.monitor import Monitor


@pytest.fixture
def run_dir(tmp_path):
    rng = np.random.default_rng(3)
    with Monitor(save_dir=str(tmp_path), run_name="exp") as mon:
        for step in range(300):
            loss = float("nan") if step == 150 else float(rng.random())
            mon.step(loss=loss, grad_norm=float(rng.random() * 10), lr=0.1, batch_size=8)
            if step % 50 == 0:
                mon.log({"val/f1": step / 300})
    return mon.run_dir


def msmon(*args):
    proc = subprocess.run(
        [sys.executable, "-m", "msmon_nb.cli", *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def by_tag(rows):
    out = {}
    for step, tag, value in rows:
        out.setdefault(tag, []).append((int(step), float(value)))
    return out


def assert_equal_to_run(grouped, run):
    assert sorted(grouped) == sorted(run.tags())
    for tag, points in grouped.items():
        series = run.scalars(tag)
        assert [s for s, _ in points] == series.steps.tolist()
        values = np.array([v for _, v in points], dtype=np.float32)
        assert np.array_equal(values.view(np.uint32), series.values.view(np.uint32)), tag


def test_csv_round_trip(run_dir, tmp_path):
    out = tmp_path / "out.csv"
    assert "exported" in msmon("export", str(run_dir), "--to", "csv", str(out))
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert set(rows[0]) == {"step", "wall_time", "tag", "value", "rank"}
    assert_equal_to_run(by_tag((r["step"], r["tag"], r["value"]) for r in rows), load_run(run_dir))


def test_jsonl_round_trip(run_dir, tmp_path):
    out = tmp_path / "out.jsonl"
    msmon("export", str(run_dir), "--to", "jsonl", str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert any(r["value"] == "nan" for r in rows)
    assert_equal_to_run(by_tag((r["step"], r["tag"], r["value"]) for r in rows), load_run(run_dir))


def test_tensorboard_reads_the_export_with_equal_values(run_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    msmon("export", str(run_dir), "--to", "tensorboard", str(out))
    acc = EventAccumulator(str(out), size_guidance={"scalars": 0})
    acc.Reload()
    run = load_run(run_dir)
    assert sorted(acc.Tags()["scalars"]) == sorted(run.tags())
    for tag in run.tags():
        events = acc.Scalars(tag)
        series = run.scalars(tag)
        assert [e.step for e in events] == series.steps.tolist()
        got = np.array([e.value for e in events], dtype=np.float32)
        same = (got == series.values) | (np.isnan(got) & np.isnan(series.values))
        assert same.all(), tag


def test_unknown_run_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "msmon_nb.cli",
            "export",
            str(tmp_path / "nope"),
            "--to",
            "csv",
            str(tmp_path / "x.csv"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "no run at" in proc.stderr


def test_export_streams_with_bounded_memory(tmp_path, python):
    n_steps = 400_000  # 2 M points over 5 tags
    with EventWriter(tmp_path / "big", block_secs=None) as writer:
        for step in range(n_steps):
            writer.add_scalars(step, {f"t/{i}": step + i for i in range(5)})
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child forked from a big
    # pytest process would report the parent's size
    code = (
        "import sys\n"
        "from msmon_nb.export import export\n"
        "n = export(sys.argv[1], 'csv', sys.argv[2])\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "print(n, int(hwm) // 1024)\n"
    )
    out = python(code, str(tmp_path / "big"), str(tmp_path / "big.csv")).stdout.split()
    assert int(out[0]) == n_steps * 5
    assert int(out[1]) < 300, f"peak RSS {out[1]} MB"
    assert not math.isnan(float(out[1]))
