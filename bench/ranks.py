"""The viewer on a big distributed run: 64 simulated ranks x 100,000 steps x 5 tags.

Each rank is written by our ``EventWriter`` into ``<data>/base/job/rank_<k>/`` with a
``msmon_run.json`` marker, as ``Monitor`` lays out a job under msrun (ranks written by a
pool of processes, ``block_secs=None`` so nothing is dropped). Rank 13 (the last rank of
smaller jobs) is a straggler from 60% of the steps on (its step_time x2.5), so the
cross-rank rules have something to find.

Then a fresh ``msmon view`` process (as users start it) is measured from this process:

1. the time to list the run: cold (process start -> first ``/api/runs`` answer; the
   files may be in the OS page cache, which this bench does not drop) and warm (median);
2. the time to the first merged chart (``/api/scalars?rank=all``: every rank read, the
   64 series merged and downsampled), a second tag (data already loaded), a repeat
   (cached), and one chart as per-rank lines (64 requests);
3. the time until the cross-rank alerts are served (they are evaluated in the background);
4. the viewer process's peak memory (``VmHWM`` in ``/proc/<pid>/status``; not
   ``ru_maxrss``, which Linux keeps across exec) against the raw scalar data.

Raw scalar data: every point as an int64 step and a float32 value (12 bytes), which is
what a chart needs; the values alone (4 bytes a point) and the summary files' size are
printed too. Targets: cold <= 5 s, warm <= 0.2 s, peak memory <= 2x the raw scalar data.

    python bench/ranks.py [--ranks 64] [--steps 100000] [--data DIR] [--repeat 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GLOG_v", "3")

import numpy as np  # noqa: E402

from bench.viewer import Viewer, timed  # noqa: E402

TAGS = (
    "train/loss",
    "train/grad_norm",
    "train/learning_rate",
    "train/step_time",
    "train/throughput",
)
STRAGGLER, SLOW_FROM = 13, 0.6  # rank, fraction of the steps
MiB = 2**20


def write_rank(job: str, rank: int, ranks: int, steps: int) -> int:
    """Rank ``rank`` of the job, written step by step with ``EventWriter``; file bytes."""
    from msmon_nb.events.writer import EventWriter
    from msmon_nb.rundir import write_marker

    rng = np.random.default_rng(rank)
    s = np.arange(steps)
    step_time = 0.1 + 0.004 * rng.standard_normal(steps)
    if rank == min(STRAGGLER, ranks - 1):
        step_time[int(SLOW_FROM * steps) :] *= 2.5
    columns = np.stack(
        [
            2.0 * np.exp(-s / (steps / 5)) + 0.3 + 0.05 * rng.standard_normal(steps),
            1.0 + 0.5 * np.exp(-s / (steps / 3)),  # equal on every rank: after the all-reduce
            np.minimum(s / 2000, 1.0) * 1e-3,
            step_time,
            64 / step_time,
        ],
        axis=1,
    ).astype(np.float32)
    rank_dir = Path(job) / f"rank_{rank}"
    started = time.time()
    with EventWriter(rank_dir, rank=rank, block_secs=None, max_queue_bytes=256 * MiB) as writer:
        for step, row in enumerate(columns.tolist()):
            writer.add_scalars(step, dict(zip(TAGS, row, strict=True)))
    write_marker(
        rank_dir,
        {
            "run_name": "job",
            "status": "finished",
            "start": started,
            "end": time.time(),
            "rank": rank,
            "ranks": ranks,
            "last_step": steps - 1,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        },
    )
    return sum(p.stat().st_size for p in rank_dir.glob("*summary*"))


def make_job(base: Path, ranks: int, steps: int) -> None:
    job = base / "job"
    done = [job / f"rank_{k}" / "msmon_run.json" for k in range(ranks)]
    if all(p.is_file() for p in done):
        print(f"   (reusing {job})")
        return
    shutil.rmtree(job, ignore_errors=True)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(
            pool.map(write_rank, [str(job)] * ranks, range(ranks), [ranks] * ranks, [steps] * ranks)
        )
    print(f"   (written with EventWriter in {time.perf_counter() - t0:.0f} s)")


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--data", help="where to keep the generated job between bench runs")
    args = parser.parse_args()
    data = Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="msmon_ranks_"))
    base = data / "base"
    try:
        print(f"distributed run: {args.ranks} ranks x {args.steps:,} steps x {len(TAGS)} tags")
        make_job(base, args.ranks, args.steps)
        points = args.ranks * args.steps * len(TAGS)
        raw = points * (8 + 4)
        files = sum(p.stat().st_size for p in (base / "job").rglob("*summary*"))
        print(f"   {points:,} scalar points")
        print(f"   raw scalar data: {raw / MiB:,.0f} MiB (int64 step + float32 value per point)")
        print(f"   values alone:    {points * 4 / MiB:,.0f} MiB (float32)")
        print(f"   summary files:   {files / MiB:,.0f} MiB on disk")
        bench_viewer(base, args, raw)
    finally:
        if not args.data:
            shutil.rmtree(data, ignore_errors=True)


def bench_viewer(base: Path, args: argparse.Namespace, raw: int) -> None:
    viewer = Viewer(base, timeout=600)
    try:

        def listing():
            try:
                return viewer.get("/api/runs")
            except OSError:
                return None

        while (first := listing()) is None:
            time.sleep(0.01)
        cold = time.perf_counter() - viewer.started
        (job,) = first
        assert job["ranks"] == list(range(args.ranks)), job["ranks"]
        assert set(job["rank_last_step"].values()) == {args.steps - 1}
        warm = [timed(listing)[0] for _ in range(args.repeat)]
        print(f"1. /api/runs (the {args.ranks}-rank run listed with each rank's last step, status)")
        print(
            f"   cold: `msmon view` start -> first listing: {cold:6.2f} s   "
            f"(target <= 5 s; files in the OS page cache)  {verdict(cold <= 5)}"
        )
        print(
            f"   warm: median of {args.repeat}:                   "
            f"{statistics.median(warm) * 1000:6.1f} ms  (target <= 200 ms)  "
            f"{verdict(statistics.median(warm) <= 0.2)}"
        )

        def merged(tag):
            return viewer.get("/api/scalars", run="job", tag=tag, rank="all", max_points=1000)

        first_chart, body = timed(lambda: merged("train/loss"))
        loaded_at = time.perf_counter()
        assert body["rank_count"][0] == args.ranks and body["count"] == args.steps
        second, _ = timed(lambda: merged("train/step_time"))
        again = [timed(lambda: merged("train/loss"))[0] for _ in range(args.repeat)]
        lines, _ = timed(
            lambda: [
                viewer.get("/api/scalars", run="job", tag="train/loss", rank=k, max_points=1000)
                for k in range(args.ranks)
            ]
        )
        print(f"2. merged chart (/api/scalars rank=all, {args.ranks} ranks -> 1,000 points)")
        print(f"   first merged chart (reads every rank, merges):  {first_chart:6.2f} s")
        print(f"   another tag (ranks loaded, merge + downsample): {second * 1000:6.1f} ms")
        print(
            f"   the same chart again, median of {args.repeat}:           "
            f"{statistics.median(again) * 1000:6.1f} ms"
        )
        print(f"   one chart as per-rank lines ({args.ranks} requests):   {lines * 1000:6.1f} ms")
        warm_loaded = [timed(listing)[0] for _ in range(args.repeat)]
        print(
            f"   /api/runs once the run is loaded, median:      "
            f"{statistics.median(warm_loaded) * 1000:6.1f} ms"
        )

        def cross_rank():
            return [a for a in viewer.get("/api/alerts", run="job") if a.get("cross_rank")]

        while not (cross := cross_rank()) and time.perf_counter() - loaded_at < 300:
            time.sleep(0.1)
        found = time.perf_counter() - loaded_at
        print("3. cross-rank alerts (evaluated in the background after loading)")
        named = ", ".join(
            f"{a['kind']} rank {a['rank']} since step {a['since_step']}" for a in cross
        )
        print(f"   served {found:6.2f} s after the first merged chart: {named or 'none'}")
        peak = viewer.peak_memory()
        print("4. peak memory of the viewer process (VmHWM)")
        print(
            f"   {peak / MiB:,.0f} MiB = {peak / raw:.2f}x the raw scalar data "
            f"({raw / MiB:,.0f} MiB; target <= 2x)  {verdict(peak <= 2 * raw)}"
        )
    finally:
        viewer.close()


if __name__ == "__main__":
    main()
