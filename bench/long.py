"""Long runs, measured: a million monitored steps, the live panel through 200 k steps, and
the viewer on 1,024 ranks (issue 46, item 1).

    python bench/long.py [--steps 1000000] [--stop-after MIN] [--monitor-steps 1000000]
                         [--panel-steps 200000]
                         [--ranks 1024] [--rank-steps 10000] [--parts train,panel,ranks]
                         [--data DIR]

1. **train**: ``bench/long_train.py`` trains a tiny MLP (16-32-4, batch 16, jitted step)
   for ``--steps`` steps twice, side by side: monitored (scalars every step, ``param_stats``
   every 100th) and never monitored (the anchor: MindSpore's own growth). Each samples
   its ``VmRSS`` ~200 times. Prints the RSS growth after warm-up (the first 10 % of the
   steps) and over the second half, of both and of their difference. ``--stop-after MIN``
   interrupts both after MIN minutes (as Ctrl-C would): the figures are then of the steps
   reached, and say so. Then the run dir the monitored run wrote: bytes per step;
   ``mm.load_run`` and every tag's scalars read, in a fresh process; and ``msmon view``
   started fresh with its page opened in headless Chromium: the time from navigation until
   every chart has drawn the run's last step (cold: the viewer's first read).
   Goals: RSS growth over the second half <= 16 MB, every chart drawn <= 1 s.
   1b: the monitor alone (``Monitor.step`` with host numbers, same tags, no MindSpore,
   ~10x faster) through ``--monitor-steps``: its own state's RSS growth, same goal.
2. **panel**: a ``%%msmonitor`` cell in JupyterLab (headless Chromium) records
   ``--panel-steps`` steps through ``Monitor.step`` with synthetic values (faster than
   training, so the page sees a long run in a few minutes); the page is sampled every
   0.5 s: its JS heap (CDP ``Runtime.getHeapUsage``, JupyterLab included) and its time per
   update (the panel's ``data-update-ms``). Then the kernel's share of the cell's wall time
   the panel took and the saved notebook's size. Goals: heap <= 100 MB and redraw <= 30 ms
   at the end, kernel share <= 0.2 %.
3. **ranks**: ``--ranks`` ranks x ``--rank-steps`` steps written with our ``EventWriter``
   (``bench/ranks.py``'s job: rank 13 a straggler from 60 % of the steps). A fresh ``msmon
   view``: the merged chart cold and warm, its peak memory (VmHWM), and the page in
   Chromium: which ranks its rank list names first and how many rows it draws.
   Goals: merged chart cold <= 3 s, warm <= 100 ms; the rank list names the outliers
   first and does not draw a row per rank.

``--data DIR`` keeps the generated runs between invocations (the ranks' job, and the
training logs: a finished pair is reused).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GLOG_v", "3")

from bench.long_pages import bench_panel, bench_rank_page, viewer_draw_time  # noqa: E402

MB = 1e6
MiB = 2**20


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def parse_log(path: Path) -> tuple[list[tuple[int, float, int]], bool]:
    """The ``(step, seconds, rss)`` samples of a training log; whether it finished."""
    samples, done = [], False
    for line in path.read_text().splitlines():
        words = line.split()
        if words[:1] == ["SAMPLE"]:
            samples.append((int(words[1]), float(words[2]), int(words[3])))
        done = done or words[:1] == ["DONE"]
    return samples, done


def rss_at(samples: list[tuple[int, float, int]], step: float) -> int:
    """The RSS of the first sample at or after ``step``."""
    return next(rss for s, _, rss in samples if s >= step)


def train_runs(data: Path, steps: int, stop_after: float | None) -> None:
    """Both training processes side by side, unless a finished pair is in ``data``."""
    logs = [data / f"{mode}.log" for mode in ("on", "off")]
    if all(p.is_file() and parse_log(p)[1] and parse_log(p)[0][-1][0] == steps for p in logs):
        print(f"   (reusing the logs in {data})")
        return
    shutil.rmtree(data / "summary", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = []
    for mode, log in zip(("on", "off"), logs, strict=True):
        with log.open("w") as out:
            cmd = [sys.executable, str(ROOT / "bench" / "long_train.py"), mode, str(steps)]
            procs.append(subprocess.Popen([*cmd, str(data / "summary")], stdout=out, env=env))
    deadline = time.monotonic() + stop_after * 60 if stop_after else None
    stopped = False
    while any(p.poll() is None for p in procs):
        if deadline is not None and time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    # as Ctrl-C; MindSpore's own SIGINT handler may end the process
                    # before Python's (seen: the monitored run's marker stays "running",
                    # its records up to the last flush are on disk)
                    p.send_signal(signal.SIGINT)
            deadline, stopped = None, True
        time.sleep(1)
    for p, mode in zip(procs, ("on", "off"), strict=True):
        if p.returncode != 0 and not stopped:
            raise SystemExit(f"the {mode} training process failed ({p.returncode})")


def growth_table(data: Path, steps: int) -> None:
    """RSS growth of both runs and their difference, over the steps both reached."""
    (on, on_done), (off, off_done) = (parse_log(data / f"{m}.log") for m in ("on", "off"))
    reached = min(on[-1][0], off[-1][0])
    rate = on[-1][0] / on[-1][1]
    finished = on_done and off_done and reached == steps
    if finished:
        print(f"   {reached:,} steps each; monitored {rate:.0f} steps/s")
    else:
        print(
            f"   STOPPED EARLY: {reached:,} of {steps:,} steps reached by both "
            f"(monitored {on[-1][0]:,} at {rate:.0f} steps/s, unmonitored {off[-1][0]:,}); "
            "the figures below are of these steps, not extrapolated"
        )
    warm, half = reached * 0.1, reached * 0.5
    print("   RSS (MB)              after warm-up   at half   at end   growth after   growth in")
    print(f"                         (step {warm:,.0f})                    warm-up        2nd half")
    rows = {}
    for name, samples in (("monitored", on), ("never monitored", off)):
        w, h, e = (rss_at(samples, s) for s in (warm, half, reached))
        rows[name] = (w, h, e)
        print(
            f"   {name:<20} {w / MB:10.1f} {h / MB:9.1f} {e / MB:8.1f} "
            f"{(e - w) / MB:+11.1f} {(e - h) / MB:+11.1f}"
        )
    (w1, h1, e1), (w0, h0, e0) = rows["monitored"], rows["never monitored"]
    ours = (e1 - h1) - (e0 - h0)
    print(
        f"   difference (ours)    {(w1 - w0) / MB:10.1f} {(h1 - h0) / MB:9.1f} "
        f"{(e1 - e0) / MB:8.1f} {((e1 - w1) - (e0 - w0)) / MB:+11.1f} {ours / MB:+11.1f}"
    )
    second = (e1 - h1) / MB
    print(
        f"   goal: monitored growth over the 2nd half <= 16 MB: {second:+.1f} MB  "
        f"{verdict(second <= 16)}"
    )


def run_dir_figures(run_dir: Path) -> None:
    """Bytes per step, ``load_run`` in a fresh process, and the viewer's page."""
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    code = (
        "import sys, time; import msmon_nb as mm; from msmon_nb.events import runs\n"
        "t0 = time.perf_counter(); run = mm.load_run(sys.argv[1]); t1 = time.perf_counter()\n"
        "tags = run.tags(); n = {t: len(run.scalars(t).steps) for t in tags}\n"
        "t2 = time.perf_counter(); last = run.scalars('train/loss').steps[-1]\n"
        "print(t1 - t0, t2 - t1, len(n), max(n.values()), int(last))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(run_dir)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    ).stdout.split()
    load, read, tags, points, last = (
        float(out[0]),
        float(out[1]),
        int(out[2]),
        int(out[3]),
        int(out[4]),
    )
    steps = last + 1
    print(
        f"   run dir: {size / MiB:,.1f} MiB in {len(files)} files, {steps:,} steps: "
        f"{size / steps:,.0f} bytes per step"
    )
    print(
        f"   mm.load_run (fresh process, after its imports): {load:6.2f} s; "
        f"then every tag's scalars ({tags} tags, up to {points:,} points): {read:6.2f} s"
    )
    drawn, charts, missing = viewer_draw_time(run_dir.parent, run_dir.name)
    print(
        f"   msmon view, page in Chromium: navigation -> all {charts} charts drawn to "
        f"their last step, cold: {drawn:5.2f} s  (goal <= 1 s)  {verdict(drawn <= 1)}"
    )
    if missing:
        print(f"   tags the page does not chart: {missing}")


def bench_train(data: Path, steps: int, stop_after: float | None) -> None:
    print(f"1. {steps:,} training steps, monitored and never monitored, side by side")
    data.mkdir(parents=True, exist_ok=True)
    train_runs(data, steps, stop_after)
    growth_table(data, steps)
    run_dir_figures(data / "summary" / "long")


def bench_monitor_alone(data: Path, steps: int) -> None:
    """The monitor's own state through ``steps`` steps, without MindSpore's pace."""
    print(
        f"1b. the monitor alone: {steps:,} Monitor.step calls with host numbers "
        "(the same tags, param_stats every 100th; no MindSpore)"
    )
    data.mkdir(parents=True, exist_ok=True)
    log = data / "synthetic.log"
    if not (log.is_file() and parse_log(log)[1] and parse_log(log)[0][-1][0] == steps):
        shutil.rmtree(data / "summary", ignore_errors=True)
        with log.open("w") as out:
            cmd = [sys.executable, str(ROOT / "bench" / "long_train.py"), "synthetic"]
            subprocess.run(
                [*cmd, str(steps), str(data / "summary")],
                stdout=out,
                env=dict(os.environ, PYTHONPATH=str(ROOT)),
                check=True,
            )
    samples, _ = parse_log(log)
    warm, half, end = (rss_at(samples, steps * f) for f in (0.1, 0.5, 1.0))
    rate = samples[-1][0] / samples[-1][1]
    print(
        f"   RSS {warm / MB:.1f} MB after warm-up (step {steps // 10:,}), {half / MB:.1f} at "
        f"half, {end / MB:.1f} at the end ({rate:,.0f} steps/s): growth after warm-up "
        f"{(end - warm) / MB:+.1f} MB, over the 2nd half {(end - half) / MB:+.1f} MB "
        f"(goal <= 16 MB)  {verdict(end - half <= 16 * MB)}"
    )
    run_dir_figures(data / "summary" / "long")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--stop-after", type=float, default=None, help="minutes")
    parser.add_argument("--monitor-steps", type=int, default=1_000_000)
    parser.add_argument("--panel-steps", type=int, default=200_000)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--rank-steps", type=int, default=10_000)
    parser.add_argument("--parts", default="train,panel,ranks")
    parser.add_argument("--data", help="keep the generated runs here between invocations")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if parts - {"train", "panel", "ranks"}:
        parser.error(f"--parts {args.parts}: choose from train,panel,ranks")
    data = Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="msmon_long_"))
    try:
        if "train" in parts:
            bench_train(data / "train", args.steps, args.stop_after)
            bench_monitor_alone(data / "monitor", args.monitor_steps)
        if "panel" in parts:
            bench_panel(args.panel_steps)
        if "ranks" in parts:
            bench_rank_page(data / "ranks", args.ranks, args.rank_steps)
    finally:
        if not args.data:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
