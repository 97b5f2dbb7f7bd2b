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

``--comm`` measures instead what ``collect.comm`` costs a rank per step (the wrapper
around ``nn.DistributedGradReducer``: two synchronisations, two clock reads, and on
collected steps the local grad norm): a real 2-rank ``msrun`` job on the CPU trains a
784-512-512-10 MLP (batch 64) with an explicit ``mon.step`` loop and alternates blocks of
``--block`` steps with the wrapper measuring or passing through, at collect frequency 1
(every step collected) and 10. Per rank: the median step time in each condition and the
difference (the cost), over ``--blocks`` rounds of the four conditions.

    python bench/ranks.py --comm [--blocks 6] [--block 40]
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


def comm_worker(out: str, blocks: int, block: int) -> None:
    """One rank of the ``--comm`` job (run by msrun): step times per condition, as JSON."""
    import json

    import mindspore as ms
    from mindspore import nn
    from mindspore.communication import get_group_size, get_rank, init

    from msmon_nb.monitor import Monitor

    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, size = get_rank(), get_group_size()
    ms.set_seed(0)
    net = nn.SequentialCell(
        [nn.Dense(784, 512), nn.ReLU(), nn.Dense(512, 512), nn.ReLU(), nn.Dense(512, 10)]
    )
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.SGD(net.trainable_params(), 0.01)
    reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=size)
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    rng = np.random.default_rng(rank)
    x = ms.Tensor(rng.normal(size=(64, 784)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 10, size=64).astype(np.int32))
    conditions = [(1, False), (1, True), (10, False), (10, True)]
    times: dict[str, list[float]] = {f"{f}/{on}": [] for f, on in conditions}
    with Monitor(save_dir=out, model_name="bench", flush_secs=1.0) as mon:
        tap = mon.collector.comm
        assert tap is not None and tap.try_install(), "the comm tap is not installed"
        for _ in range(20):  # warm up (first-call compiles)
            loss, grads = grad_fn(x, y)
            opt(reducer(grads))
            mon.step(loss=loss, grads=grads, batch_size=64)
        for _ in range(blocks):
            for freq, on in conditions:
                mon.set_collect_freq(freq)
                tap.active = on
                began = time.perf_counter()
                for _ in range(block):
                    loss, grads = grad_fn(x, y)
                    reduced = reducer(grads)
                    opt(reduced)
                    mon.step(loss=loss, grads=reduced, batch_size=64)
                    now = time.perf_counter()
                    times[f"{freq}/{on}"].append(now - began)
                    began = now
        tap.active = True
        # the wrapper's own work once the tensors are ready (what it adds when nothing
        # is pending): both synchronisations and the clock reads; and the local norm
        leaves, out_leaves = list(grads), list(reduced)
        for leaf in leaves + out_leaves:
            leaf.asnumpy()
        own, norm = [], []
        for _ in range(300):
            t0 = time.perf_counter()
            tap._sync(leaves, True)
            time.perf_counter()
            tap._sync(out_leaves, False)
            t1 = time.perf_counter()
            tap._norm(leaves)
            t2 = time.perf_counter()
            own.append(t1 - t0)
            norm.append(t2 - t1)
        times["own"], times["norm"] = own, norm
    Path(out, f"times_{rank}.json").write_text(json.dumps(times))


def bench_comm(blocks: int, block: int) -> None:
    """Launch the 2-rank job and print what the comm tap costs per step."""
    import json
    import subprocess

    out = Path(tempfile.mkdtemp(prefix="msmon_comm_"))
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        bin_dir = Path(sys.executable).parent
        env = dict(
            os.environ,
            GLOG_v="3",
            PATH=f"{bin_dir}:{os.environ.get('PATH', '')}",
            PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        )
        cmd = [
            str(bin_dir / "msrun"),
            "--worker_num=2",
            "--local_worker_num=2",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            "--join=True",
            f"--log_dir={out / 'logs'}",
            str(Path(__file__).resolve()),
            "--comm-worker",
            str(out),
            "--blocks",
            str(blocks),
            "--block",
            str(block),
        ]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, timeout=900)
        print("collect.comm cost per step: 2-rank msrun, CPU, MLP 784-512-512-10, batch 64")
        print(f"({blocks} rounds x {block} steps per condition; median step time in ms)")
        print("rank  freq   tap off   tap on   cost (on - off)")
        for rank in (0, 1):
            times = json.loads((out / f"times_{rank}.json").read_text())
            for freq in (1, 10):
                off = statistics.median(times[f"{freq}/False"]) * 1e3
                on = statistics.median(times[f"{freq}/True"]) * 1e3
                print(f"{rank:4d}  {freq:4d}  {off:8.2f}  {on:7.2f}  {on - off:+8.2f} ms")
            own = statistics.median(times["own"]) * 1e6
            norm = statistics.median(times["norm"]) * 1e6
            print(
                f"rank {rank}: the wrapper's own work per all-reduce (tensors ready): "
                f"{own:.0f} us; the local grad norm (collected steps only): {norm:.0f} us"
            )
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--data", help="where to keep the generated job between bench runs")
    parser.add_argument("--comm", action="store_true", help="the comm tap's cost per step")
    parser.add_argument("--comm-worker", help=argparse.SUPPRESS)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--block", type=int, default=40)
    args = parser.parse_args()
    if args.comm_worker:
        comm_worker(args.comm_worker, args.blocks, args.block)
        return
    if args.comm:
        bench_comm(args.blocks, args.block)
        return
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
        since_start = loaded_at - viewer.started
        assert body["rank_count"][0] == args.ranks and body["last_step"] == args.steps - 1
        second, timing = timed(lambda: merged("train/step_time"))
        outliers = [o["rank"] for o in timing.get("outliers", [])]
        again = [timed(lambda: merged("train/loss"))[0] for _ in range(args.repeat)]
        lines, _ = timed(
            lambda: [
                viewer.get("/api/scalars", run="job", tag="train/loss", rank=k, max_points=1000)
                for k in range(args.ranks)
            ]
        )
        source = "raw points" if body["raw"] else "the writers' overviews" if not body[
            "raw"] and body["count"] < args.steps else "every decoded point"  # fmt: skip
        print(f"2. merged chart (/api/scalars rank=all, {args.ranks} ranks -> 1,000 points)")
        print(
            f"   first merged chart, cold (from {source}):     {first_chart:6.2f} s   "
            f"(target <= 1 s)  {verdict(first_chart <= 1)}"
        )
        print(f"   `msmon view` start -> first merged chart:       {since_start:6.2f} s")
        print(f"   another tag (merge + downsample):               {second * 1000:6.1f} ms")
        warm_ms = statistics.median(again) * 1000
        print(
            f"   the same chart again, median of {args.repeat}:           "
            f"{warm_ms:6.1f} ms  (target <= 100 ms)  {verdict(warm_ms <= 100)}"
        )
        print(f"   median line of the ranks: {'yes' if 'median' in body else 'no'}; "
              f"outlier ranks on train/step_time: {outliers}")  # fmt: skip
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
