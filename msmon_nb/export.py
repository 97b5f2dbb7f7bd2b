"""``msmon export RUN_DIR --to csv|jsonl|tensorboard OUT``: take a run's scalars elsewhere.

Streaming: files are read a chunk at a time (the reader's 8 MB batches) and each batch's
rows are written before the next is read, so a 10-million-point run exports in bounded
memory. Rows come in write order, every point as written (a step written twice appears
twice; ``load_run`` applies the purge rule on top). Non-finite values are written as
``nan``, ``inf``, ``-inf`` (CSV) or the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON,
which has no such numbers). The TensorBoard form is tfevents files, one per rank, that
TensorBoard's own loaders read.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from msmon_nb.events import wire
from msmon_nb.events.bulk import BulkScalarDecoder
from msmon_nb.events.framing import frame
from msmon_nb.events.reader import EventDecoder, RecordReader
from msmon_nb.events.runs import Run, load_run
from msmon_nb.events.writer import event_file_name
from msmon_nb.rundir import is_run_dir

FORMATS = ("csv", "jsonl", "tensorboard")
_CHUNK = 2**20  # 1 MB batches: a batch's rows, as Python objects, stay around 50 MB
FIELDS = ("step", "wall_time", "tag", "value", "rank")


def iter_scalar_batches(run: Run) -> Iterator[tuple[int, list[tuple[int, float, str, float]], int]]:
    """(rank, rows, bytes read so far) per batch; rows are (step, wall, tag, value)."""
    done = 0
    for path, rank in run.files_with_ranks():
        reader = RecordReader(path, chunk=_CHUNK)
        bulk = BulkScalarDecoder()
        decoder = EventDecoder()
        for buf, base, starts, stops in reader.batches():
            blocks, rest = bulk.decode(buf, starts, stops)
            keyed: list[tuple[int, int, float, str, float]] = []
            for block in blocks:
                index = block.index.tolist()
                steps = block.steps.tolist()
                walls = block.walls.tolist()
                for j, tag in enumerate(block.tags):
                    values = block.values[:, j].tolist()
                    keyed.extend(zip(index, steps, walls, [tag] * len(index), values, strict=True))
            for i in rest.tolist():
                try:
                    record = decoder.decode(base + starts[i] - 12, buf[starts[i] : stops[i]])
                except ValueError:
                    continue
                if record.step is None:
                    continue
                for value in record.values:
                    if value.kind == "scalar":
                        keyed.append((i, record.step, record.wall_time, value.tag, value.value))
            keyed.sort(key=lambda row: row[0])
            yield rank, [row[1:] for row in keyed], done + reader.offset
        done += reader.offset


def _text(value: float) -> str:
    return repr(float(value)) if math.isfinite(value) else str(value)


def _json_number(value: float) -> float | str:
    return float(value) if math.isfinite(value) else str(value)


def export(
    run_dir: str | os.PathLike[str],
    fmt: str,
    out: str | os.PathLike[str],
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Write every scalar point of the run to ``out``; returns the number of points."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    run = load_run_lazily(run_dir)
    total_bytes = sum(p.stat().st_size for p in run.files)
    out_path = Path(out)
    count = 0
    if fmt == "tensorboard":
        return _export_tensorboard(run, out_path, total_bytes, progress)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", newline="", encoding="utf-8") as f:
        writer: Any = csv.writer(f) if fmt == "csv" else None
        if writer is not None:
            writer.writerow(FIELDS)
        for rank, rows, done in iter_scalar_batches(run):
            if writer is not None:
                writer.writerows(
                    (step, repr(wall), tag, _text(value), rank) for step, wall, tag, value in rows
                )
            else:
                f.writelines(
                    json.dumps(
                        {
                            "step": step,
                            "wall_time": wall,
                            "tag": tag,
                            "value": _json_number(value),
                            "rank": rank,
                        }
                    )
                    + "\n"
                    for step, wall, tag, value in rows
                )
            count += len(rows)
            if progress is not None:
                progress(done, total_bytes)
    return count


def _export_tensorboard(
    run: Run, out: Path, total_bytes: int, progress: Callable[[int, int], None] | None
) -> int:
    """tfevents written synchronously: no writer thread and no queue to fill up.

    Consecutive rows of one step become one Event (as the original records were), so a
    10 M-point export stays a few tens of MB however fast the reading goes.
    """
    files: dict[int, Any] = {}
    count = 0

    def file_for(rank: int) -> Any:
        f = files.get(rank)
        if f is None:
            logdir = out if len(run.file_ranks()) <= 1 else out / f"rank_{rank}"
            logdir.mkdir(parents=True, exist_ok=True)
            name = event_file_name(int(time.time()), rank, platform.node(), flavor="tensorboard")
            f = files[rank] = open(logdir / name, "wb")  # noqa: SIM115 - closed below
            f.write(frame(wire.version_event(time.time(), wire.TF_VERSION)))
        return f

    try:
        for rank, rows, done in iter_scalar_batches(run):
            f = file_for(rank)
            i = 0
            while i < len(rows):
                step, wall = rows[i][0], rows[i][1]
                j = i
                while j < len(rows) and rows[j][0] == step and rows[j][1] == wall:
                    j += 1
                items = [(tag, value) for _, _, tag, value in rows[i:j]]
                f.write(frame(wire.scalar_event(step, wall, items, wire.TF_PREFIXES)))
                i = j
            count += len(rows)
            if progress is not None:
                progress(done, total_bytes)
    finally:
        for f in files.values():
            f.close()
    return count


def load_run_lazily(run_dir: str | os.PathLike[str]) -> Run:
    """The run at ``run_dir`` without reading its data (export streams it instead)."""
    path = Path(run_dir)
    if not path.is_dir() or not is_run_dir(path):
        load_run(path)  # raises the clear "no run at ..." error
        raise FileNotFoundError(
            f"{str(run_dir)!r} is msprobe monitor output: its CSV files are already a table "
            "per kind; msmon export converts summary runs (read this one with "
            "msmon_nb.load_run or msmon view)"
        )
    return Run(path)  # its files are found when asked for; nothing is read


def progress_printer(stream: Any = sys.stderr) -> Callable[[int, int], None]:
    """A tqdm bar over bytes read (quiet when the stream is not a terminal)."""
    from tqdm import tqdm

    bar = tqdm(total=None, unit="B", unit_scale=True, desc="export", file=stream, disable=None)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()

    return update
