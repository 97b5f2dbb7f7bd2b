"""Viewer speed: /api/scalars latency, run listing, and MindInsight side by side.

1. ``/api/scalars`` for a 1 M-point series downsampled to 1,000 points: median latency
   over ``--repeat`` requests once the run is loaded (target <= 100 ms).
2. ``/api/runs`` over 100 runs x 100 k steps: the first listing after ``msmon view`` starts
   (cold: from starting the process, nothing read yet; the files may be in the OS page
   cache, which this bench does not drop) and the median of later ones (warm). Targets
   <= 5 s cold, <= 0.2 s warm. For scale, the time a full decode of every run
   (``load_runs``) takes is printed too.
3. Time to first full chart of one 50 k-step run: from starting the server process until
   the scalar endpoint serves the run up to its last step, ours (``msmon view``) against
   MindInsight 2.3.1 (its own venv, installed on first use; ``--no-mindinsight`` skips
   it). Also: how many points each serves, and whether a one-step spike survives.

The servers run as separate processes, as users run them, and the client is this
process. Data is generated fast (``tests/viewer/synth.py``) into ``--data`` (kept between
runs when given, else a temporary dir).

    python bench/viewer.py [--repeat 30] [--runs 100] [--steps 100000] [--no-mindinsight]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GLOG_v", "3")

import numpy as np  # noqa: E402

from tests.support.synth import write_run  # noqa: E402

READY = re.compile(r"^msmon view: serving .* at (http://\S+)$")
SPIKE_STEP = 31_337


class Viewer:
    """``msmon view BASE --port 0`` in a subprocess, timed from its start; ``url`` once
    it is ready. Shared by the viewer and ranks benches."""

    def __init__(self, base: Path, timeout: float = 120) -> None:
        self.timeout = timeout
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "msmon_nb.cli", "view", str(base), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for line in self.proc.stdout:
            if m := READY.match(line.strip()):
                self.url = m.group(1).rstrip("/")
                break
        else:
            raise RuntimeError("msmon view did not start")

    def get(self, path: str, **params):
        """GET ``path`` (``params`` as its query string), decoded JSON."""
        query = "?" + urllib.parse.urlencode(params) if params else ""
        with urllib.request.urlopen(self.url + path + query, timeout=self.timeout) as resp:
            return json.load(resp)

    def peak_memory(self) -> int:
        """VmHWM of the viewer process, bytes."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def series(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    steps = np.arange(n)
    loss = 2.0 * np.exp(-steps / (n / 6)) + 0.05 * rng.standard_normal(n)
    return loss.astype(np.float32)


def bench_scalars(data: Path, repeat: int) -> None:
    base = data / "one_million"
    if not base.exists():
        write_run(base / "run", np.arange(1_000_000), {"train/loss": series(1_000_000)})
    viewer = Viewer(base)
    try:
        query = "/api/scalars?" + urllib.parse.urlencode(
            {"run": "run", "tag": "train/loss", "max_points": 1000}
        )
        load, body = timed(lambda: viewer.get(query))
        times = [timed(lambda: viewer.get(query))[0] for _ in range(repeat)]
    finally:
        viewer.close()
    print("1. /api/scalars, 1,000,000 points -> max_points=1000")
    print(f"   first request (loads the run):  {load * 1000:8.1f} ms")
    print(
        f"   median of {repeat}:                 {statistics.median(times) * 1000:8.1f} ms"
        f"   (min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}; target <= 100 ms)"
    )
    print(f"   points served: {len(body['steps'])}, raw={body['raw']}")


def bench_listing(data: Path, runs: int, steps: int, repeat: int) -> None:
    base = data / f"runs_{runs}x{steps}"
    if not base.exists():
        t0 = time.perf_counter()
        for i in range(runs):
            values = series(steps, seed=i)
            write_run(
                base / f"run_{i:03d}",
                np.arange(steps),
                {"train/loss": values, "train/learning_rate": np.full(steps, 1e-3)},
                wall0=1.7e9 + i * 10_000,
            )
        print(f"   (generated {runs} runs in {time.perf_counter() - t0:.0f} s)")
    size = sum(p.stat().st_size for p in base.rglob("*summary*"))
    from msmon_nb.events.index import RunIndex
    from msmon_nb.events.runs import load_runs

    scan_only, _ = timed(lambda: RunIndex(base).scan())
    from tests.support.mindinsight import free_port

    port = free_port()
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "msmon_nb.cli", "view", str(base), "--port", str(port)],
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/api/runs"
    try:

        def listing():
            try:
                with urllib.request.urlopen(url, timeout=120) as resp:
                    return json.load(resp)
            except OSError:
                return None

        first = wait_until(listing, 60, poll=0.01)
        cold = time.perf_counter() - started
        warm = [timed(listing)[0] for _ in range(repeat)]
    finally:
        proc.terminate()
        proc.wait(10)
    assert len(first) == runs and all(r["last_step"] == steps - 1 for r in first)
    print(f"2. /api/runs, {runs} runs x {steps:,} steps ({size / 2**20:.0f} MiB of summary files)")
    print(
        f"   cold: `msmon view` start -> first listing: {cold * 1000:8.1f} ms   (target <= 5 s;"
        " files in the OS page cache)"
    )
    print(f"   cold: the index scan alone (in process):   {scan_only * 1000:8.1f} ms")
    print(
        f"   warm: median of {repeat}:                      "
        f"{statistics.median(warm) * 1000:8.1f} ms   (target <= 200 ms)"
    )

    full, _ = timed(lambda: load_runs(base))
    print(f"   for scale, full decode of every run (load_runs): {full:.1f} s")


def wait_until(predicate, timeout: float, poll: float = 0.05):
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(poll)
    raise TimeoutError("condition not met")


def bench_first_chart(data: Path, with_mindinsight: bool) -> None:
    n = 50_000
    base = data / "fifty_k"
    if not base.exists():
        values = series(n, seed=3)
        values[SPIKE_STEP] = 50.0
        write_run(base / "run", np.arange(n), {"train/loss": values, "train/lr": np.full(n, 1e-3)})
    print("3. time to first full chart, one 50,000-step run (2 tags), server start -> data")

    viewer = Viewer(base)
    try:
        query = "/api/scalars?" + urllib.parse.urlencode({"run": "run", "tag": "train/loss"})

        def ours_full():
            try:
                body = viewer.get(query)
            except OSError:
                return None
            return body if body["last_step"] == n - 1 else None

        body = wait_until(ours_full, 120)
        ours = time.perf_counter() - viewer.started
    finally:
        viewer.close()
    kept = dict(zip(body["steps"], body["values"], strict=True)).get(SPIKE_STEP) == 50.0
    print(
        f"   msmon view:      {ours:6.2f} s   {len(body['steps'])} points, "
        f"first step {body['steps'][0]}, spike at {SPIKE_STEP} kept: {kept}"
    )
    if not with_mindinsight:
        print("   MindInsight:     skipped (--no-mindinsight)")
        return
    from tests.support.mindinsight import MindInsight, ensure_venv

    ensure_venv()
    with tempfile.TemporaryDirectory() as ws:
        mi = MindInsight(base, Path(ws))
        mi.start()
        try:

            def theirs_full():
                try:
                    points = mi.scalars("./run", "train/loss")
                except OSError:
                    return None
                return points if points and points[-1]["step"] == n - 1 else None

            points = wait_until(theirs_full, 600, poll=0.25)
            theirs = time.perf_counter() - mi.started_at
        finally:
            mi.stop()
    steps = [p["step"] for p in points]
    kept = any(p["step"] == SPIKE_STEP for p in points)
    print(
        f"   MindInsight {mi_version()}: {theirs:6.2f} s   {len(points)} points, "
        f"first step {steps[0]}, spike at {SPIKE_STEP} kept: {kept}"
    )
    print(f"   ratio: MindInsight / msmon view = {theirs / ours:.1f}x")


def mi_version() -> str:
    from tests.support.mindinsight import VERSION

    return VERSION


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--data", help="where to keep generated runs between bench runs")
    parser.add_argument("--no-mindinsight", action="store_true")
    args = parser.parse_args()
    data = Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="msmon_bench_"))
    data.mkdir(parents=True, exist_ok=True)
    try:
        bench_scalars(data, args.repeat)
        bench_listing(data, args.runs, args.steps, args.repeat)
        bench_first_chart(data, not args.no_mindinsight)
    finally:
        if not args.data:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
