"""Writer and reader throughput, side by side with the anchors, in one process.

Writer: caller time per training step recording two scalars (loss, lr), ours against
MindSpore's ``SummaryRecord`` (add_value x2 + record), each fed the same inputs, twice:
``ms.Tensor`` scalars (what a loop's loss is), and Python floats (SummaryRecord accepts
only Tensors, so its float arm wraps each value in ``ms.Tensor`` as its users must). Our
figure includes the cost of our background thread competing for the GIL, since the
caller pays it.

Reader: scalars/s reading N scalars, ours (``load_run``: the bulk path the viewer uses,
and ``read_events``: one Python object per record) against tensorboard's
``EventFileLoader``, on files holding the same scalars per event, twice: 1 scalar per
event (as TensorBoard writers emit them) and 5 (as SummaryRecord.record and our writer
group a step's scalars). Every reader runs ``--repeat`` times, blocks alternating.

    python bench/events.py [--steps 5000] [--scalars 200000] [--repeat 5]

Prints medians over ``--repeat`` alternating rounds. Without TensorFlow installed,
tensorboard's loader checks CRCs in pure Python (~10 us a record); TensorFlow (its fast
path) is not installed here (CPU wheels ~600 MB), so the anchor is the loader as
``pip install tensorboard`` gives it.
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


def ours_write(steps: int, base: Path, tensors: bool) -> tuple[float, float]:
    """(caller seconds per step, seconds until closed) for ``steps`` steps of 2 scalars."""
    import mindspore as ms

    from msmon_nb.events.writer import EventWriter

    loss, lr = (
        (ms.Tensor(np.float32(0.5)), ms.Tensor(np.float32(0.001))) if tensors else (0.5, 0.001)
    )
    writer = EventWriter(base / f"ours_{time.monotonic_ns()}")
    t0 = time.perf_counter()
    for step in range(steps):
        writer.add_scalars(step, {"loss": loss, "lr": lr})
    t1 = time.perf_counter()
    writer.close()
    return (t1 - t0) / steps, time.perf_counter() - t0


def ms_write(steps: int, base: Path, tensors: bool) -> float:
    """Caller seconds per step of MindSpore's SummaryRecord."""
    import mindspore as ms
    from mindspore.train.summary import SummaryRecord

    with SummaryRecord(str(base / f"ms_{time.monotonic_ns()}")) as record:
        if tensors:
            loss, lr = ms.Tensor(np.float32(0.5)), ms.Tensor(np.float32(0.001))
            t0 = time.perf_counter()
            for step in range(steps):
                record.add_value("scalar", "loss", loss)
                record.add_value("scalar", "lr", lr)
                record.record(step)
            t1 = time.perf_counter()
        else:
            loss, lr = 0.5, 0.001
            t0 = time.perf_counter()
            for step in range(steps):
                record.add_value("scalar", "loss", ms.Tensor(loss, ms.float32))
                record.add_value("scalar", "lr", ms.Tensor(lr, ms.float32))
                record.record(step)
            t1 = time.perf_counter()
    return (t1 - t0) / steps


def make_files(scalars: int, base: Path, per_event: int) -> tuple[Path, Path]:
    """Our run dir and a tfevents file, each holding ``scalars`` scalars, ``per_event`` of
    them in each event (record)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from msmon_nb.events.writer import EventWriter

    steps = scalars // len(TAGS)
    groups = [TAGS[i : i + per_event] for i in range(0, len(TAGS), per_event)]
    ours = base / f"read_ours_{per_event}"
    with EventWriter(ours) as writer:
        for step in range(steps):
            for group in groups:
                writer.add_scalars(step, {t: step * 0.5 + TAGS.index(t) for t in group})
    tb_dir = base / f"read_tb_{per_event}"
    tb = EventFileWriter(str(tb_dir), max_queue_size=100_000)
    for step in range(steps):
        for group in groups:
            values = [
                summary_pb2.Summary.Value(tag=t, simple_value=step * 0.5 + TAGS.index(t))
                for t in group
            ]
            tb.add_event(
                event_pb2.Event(
                    wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)
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

    (path,) = run_dir.glob("*summary*")  # the events file (the overview beside it is not)
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


def writer_table(steps: int, repeat: int, base: Path) -> None:
    for tensors in (True, False):
        ours_caller, ours_total, ms_caller = [], [], []
        ms_write(200, base, tensors)  # warm up MindSpore's writer processes
        for _ in range(repeat):
            caller, total = ours_write(steps, base, tensors)
            ours_caller.append(caller)
            ours_total.append(total / steps)
            ms_caller.append(ms_write(steps, base, tensors))
        oc, ot, mc = map(statistics.median, (ours_caller, ours_total, ms_caller))
        fed = "ms.Tensor scalars" if tensors else "Python floats (SummaryRecord: ms.Tensor(x))"
        print(f"writer, {steps} steps x 2 scalars fed {fed}, median of {repeat}:")
        print(f"  SummaryRecord   caller {mc * 1e6:8.1f} us/step  ({1 / mc:9.0f} steps/s)")
        print(f"  msmon_nb        caller {oc * 1e6:8.1f} us/step  ({1 / oc:9.0f} steps/s)")
        print(f"  msmon_nb        incl. close {ot * 1e6:5.1f} us/step")
        print(f"  ratio SummaryRecord / msmon_nb caller time: {mc / oc:.1f}x  (target >= 20x)")


def reader_table(scalars: int, repeat: int, base: Path, per_event: int) -> None:
    from google.protobuf.internal import api_implementation

    ours_dir, tb_file = make_files(scalars, base, per_event)
    samples: dict[str, list[tuple[float, int]]] = {
        "EventFileLoader (tensorboard)": [],
        "read_events (per record)": [],
        "load_run (bulk)": [],
    }
    arms = (
        ("EventFileLoader (tensorboard)", read_tb, tb_file),
        ("read_events (per record)", read_ours_records, ours_dir),
        ("load_run (bulk)", read_ours_bulk, ours_dir),
    )
    for i in range(repeat):
        for name, fn, path in arms[i % 3 :] + arms[: i % 3]:
            samples[name].append(timed(fn, path))
    print(
        f"reader, {scalars} scalars, {per_event} per event (protobuf backend: "
        f"{api_implementation.Type()}), median of {repeat}, blocks alternating:"
    )
    rates = {}
    for name, runs in samples.items():
        secs = statistics.median(s for s, _ in runs)
        count = runs[0][1]
        rates[name] = count / secs
        print(f"  {name:30s} {secs:7.3f} s  {count / secs:12,.0f} scalars/s  ({count} read)")
    tb_rate = rates["EventFileLoader (tensorboard)"]
    print(
        f"  ratio load_run / EventFileLoader: {rates['load_run (bulk)'] / tb_rate:.1f}x "
        f"(target >= 5x, and >= 1,000,000 scalars/s)"
    )
    print(
        f"  ratio read_events / EventFileLoader: {rates['read_events (per record)'] / tb_rate:.1f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5000, help="writer steps per round")
    parser.add_argument("--scalars", type=int, default=200_000, help="scalars read per round")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", choices=("writer", "reader"), default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        # readers first: importing MindSpore (the writer arms) switches protobuf to its
        # pure-Python backend for the whole process, which TensorBoard's users do not have
        if args.only in (None, "reader"):
            for per_event in (1, 5):
                reader_table(args.scalars, args.repeat, base, per_event)
        if args.only in (None, "writer"):
            writer_table(args.steps, args.repeat, base)


if __name__ == "__main__":
    main()
