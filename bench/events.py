"""Writer and reader throughput, side by side with the anchors, in one process.

Writer: caller time per training step recording two scalars (loss, lr), ours against
MindSpore's ``SummaryRecord`` (add_value x2 + record). Our figure includes the cost of
our background thread competing for the GIL, since the caller pays it.

Reader: scalars/s reading N scalars, ours (``load_run``: the bulk path the viewer uses,
and ``read_events``: one Python object per record) against tensorboard's
``EventFileLoader`` on a tfevents file holding the same N scalars (one per event, as
TensorBoard writers emit them).

    python bench/events.py [--steps 5000] [--scalars 1000000] [--repeat 5]

Prints medians over ``--repeat`` alternating rounds. Without TensorFlow installed,
tensorboard's loader checks CRCs in pure Python (~10 us a record), so it runs once
(``--tb-repeat``): at 1 M scalars that is about 100 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")

import numpy as np

TAGS = ("train/loss", "train/grad_norm", "train/learning_rate", "train/throughput", "sys/x")


def ours_write(steps: int, base: Path) -> tuple[float, float]:
    """(caller seconds per step, seconds until closed) for ``steps`` steps of 2 scalars."""
    from msmon_nb.events.writer import EventWriter

    loss = np.float32(0.5)
    writer = EventWriter(base / f"ours_{time.monotonic_ns()}")
    t0 = time.perf_counter()
    for step in range(steps):
        writer.add_scalars(step, {"loss": float(loss), "lr": 0.001})
    t1 = time.perf_counter()
    writer.close()
    return (t1 - t0) / steps, time.perf_counter() - t0


def ms_write(steps: int, base: Path) -> float:
    """Caller seconds per step of MindSpore's SummaryRecord."""
    import mindspore as ms
    from mindspore.train.summary import SummaryRecord

    loss = ms.Tensor(np.float32(0.5))
    lr = ms.Tensor(np.float32(0.001))
    with SummaryRecord(str(base / f"ms_{time.monotonic_ns()}")) as record:
        t0 = time.perf_counter()
        for step in range(steps):
            record.add_value("scalar", "loss", loss)
            record.add_value("scalar", "lr", lr)
            record.record(step)
        t1 = time.perf_counter()
    return (t1 - t0) / steps


def make_files(scalars: int, base: Path) -> tuple[Path, Path]:
    """Our run dir and a tfevents file, each holding ``scalars`` scalars."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from msmon_nb.events.writer import EventWriter

    steps = scalars // len(TAGS)
    ours = base / "read_ours"
    with EventWriter(ours) as writer:
        for step in range(steps):
            writer.add_scalars(step, {t: step * 0.5 + i for i, t in enumerate(TAGS)})
    tb_dir = base / "read_tb"
    tb = EventFileWriter(str(tb_dir), max_queue_size=100_000)
    for step in range(steps):
        for i, tag in enumerate(TAGS):
            value = summary_pb2.Summary.Value(tag=tag, simple_value=step * 0.5 + i)
            tb.add_event(
                event_pb2.Event(
                    wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])
                )
            )
    tb.close()
    (tb_file,) = tb_dir.iterdir()
    return ours, tb_file


def read_ours_bulk(run_dir: Path) -> int:
    from msmon_nb.events.runs import load_run

    run = load_run(run_dir)
    return sum(len(run.scalars(t).steps) for t in run.tags())


def read_ours_records(run_dir: Path) -> int:
    from msmon_nb.events.reader import read_events

    (path,) = run_dir.iterdir()
    return sum(len(r.values) for r in read_events(path))


def read_tb(path: Path) -> int:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    n = 0
    for event in EventFileLoader(str(path)).Load():
        n += len(event.summary.value)
    return n


def timed(fn, *args) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = fn(*args)
    return time.perf_counter() - t0, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5000, help="writer steps per round")
    parser.add_argument("--scalars", type=int, default=1_000_000, help="scalars read per round")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tb-repeat", type=int, default=1)
    args = parser.parse_args()

    from google.protobuf.internal import api_implementation

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        ours_caller, ours_total, ms_caller = [], [], []
        ms_write(200, base)  # warm up MindSpore's writer processes
        for _ in range(args.repeat):
            caller, total = ours_write(args.steps, base)
            ours_caller.append(caller)
            ours_total.append(total / args.steps)
            ms_caller.append(ms_write(args.steps, base))
        oc, ot, mc = map(statistics.median, (ours_caller, ours_total, ms_caller))
        print(f"writer, {args.steps} steps x 2 scalars, median of {args.repeat}:")
        print(f"  SummaryRecord   caller {mc * 1e6:8.1f} us/step  ({1 / mc:9.0f} steps/s)")
        print(f"  msmon_nb        caller {oc * 1e6:8.1f} us/step  ({1 / oc:9.0f} steps/s)")
        print(f"  msmon_nb        incl. close {ot * 1e6:5.1f} us/step")
        print(f"  ratio SummaryRecord / msmon_nb caller time: {mc / oc:.1f}x  (target >= 20x)")

        ours_dir, tb_file = make_files(args.scalars, base)
        bulk, records, tb = [], [], []
        for i in range(args.repeat):
            bulk.append(timed(read_ours_bulk, ours_dir))
            records.append(timed(read_ours_records, ours_dir))
            if i < args.tb_repeat:
                tb.append(timed(read_tb, tb_file))
        print(
            f"reader, {args.scalars} scalars (protobuf backend: {api_implementation.Type()}), "
            f"median of {args.repeat} (tensorboard: {args.tb_repeat}):"
        )
        rows = (
            ("EventFileLoader (tensorboard)", tb),
            ("read_events (per record)", records),
            ("load_run (bulk)", bulk),
        )
        rates = {}
        for name, samples in rows:
            secs = statistics.median(s for s, _ in samples)
            count = samples[0][1]
            rates[name] = count / secs
            print(f"  {name:30s} {secs:7.3f} s  {count / secs:12,.0f} scalars/s  ({count} read)")
        tb_rate = rates["EventFileLoader (tensorboard)"]
        print(
            f"  ratio load_run / EventFileLoader: {rates['load_run (bulk)'] / tb_rate:.1f}x "
            f"(target >= 5x, and >= 1,000,000 scalars/s)"
        )
        per_record = rates["read_events (per record)"] / tb_rate
        print(f"  ratio read_events / EventFileLoader: {per_record:.1f}x")


if __name__ == "__main__":
    main()
