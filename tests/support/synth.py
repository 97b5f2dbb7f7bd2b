"""Long summary files written fast, for viewer tests and ``bench/viewer.py``.

``EventWriter`` takes about 10 s for 1 M steps (it is built for a training loop, a step at
a time). Here every record of one step-varint length shares a template: the template comes
from ``wire.scalar_event`` (so the bytes are exactly what the writer emits; tests read the
result back with ``load_run``), and numpy fills in wall time, step and values for all rows
at once. Only the payload CRCs are computed row by row.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from msmon_nb.events import wire
from msmon_nb.events.bulk import learn_layout
from msmon_nb.events.crc import MASK_DELTA, crc32c, masked_crc32c
from msmon_nb.events.framing import frame


def _varint_columns(steps: np.ndarray, nbytes: int) -> np.ndarray:
    cols = np.empty((len(steps), nbytes), dtype=np.uint8)
    rest = steps.astype(np.uint64)
    for k in range(nbytes):
        cols[:, k] = (rest & np.uint64(0x7F)).astype(np.uint8)
        rest >>= np.uint64(7)
        if k < nbytes - 1:
            cols[:, k] |= 0x80
    return cols


def records(steps: np.ndarray, walls: np.ndarray, columns: dict[str, np.ndarray]) -> bytes:
    """Framed scalar events for steps that all share one varint length."""
    tags = list(columns)
    template = wire.scalar_event(int(steps[0]), 0.0, [(t, 0.0) for t in tags])
    layout = learn_layout(template)
    assert layout is not None and layout.tags == tuple(tags)
    n, length = len(steps), len(template)
    rows = np.tile(np.frombuffer(template, dtype=np.uint8), (n, 1))
    rows[:, 1:9] = walls.astype("<f8").view(np.uint8).reshape(n, 8)
    rows[:, 10 : 10 + layout.step_bytes] = _varint_columns(steps, layout.step_bytes)
    for tag, at in zip(tags, layout.float_at.tolist(), strict=True):
        rows[:, at : at + 4] = columns[tag].astype("<f4").view(np.uint8).reshape(n, 4)
    crcs = np.fromiter((crc32c(r) for r in rows), dtype=np.uint32, count=n)
    masked = ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + np.uint32(MASK_DELTA)
    head = np.frombuffer(
        length.to_bytes(8, "little")
        + masked_crc32c(length.to_bytes(8, "little")).to_bytes(4, "little"),
        dtype=np.uint8,
    )
    out = np.empty((n, 12 + length + 4), dtype=np.uint8)
    out[:, :12] = head
    out[:, 12 : 12 + length] = rows
    out[:, 12 + length :] = masked.astype("<u4").view(np.uint8).reshape(n, 4)
    return out.tobytes()


def write_run(
    run_dir: str | os.PathLike[str],
    steps: np.ndarray,
    columns: dict[str, np.ndarray],
    wall0: float = 1.7e9,
    secs_per_step: float = 0.01,
    readonly: bool = True,
    rank: int = 0,
) -> Path:
    """One summary file in ``run_dir`` holding ``columns`` (tag -> values) at ``steps``.

    The file is named and (with ``readonly``) left 0400 like a finished MindSpore file.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    steps = np.asarray(steps, dtype=np.int64)
    walls = wall0 + np.arange(len(steps)) * secs_per_step
    path = run_dir / f"events.out.events.summary.{int(wall0)}.{rank}.synth_MS"
    nbytes = np.ones(len(steps), dtype=np.int64)
    for k in range(1, 9):
        nbytes += steps >= (1 << (7 * k))
    with open(path, "wb") as file:
        file.write(frame(wire.version_event(wall0)))
        cuts = np.flatnonzero(np.diff(nbytes)) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(steps)], strict=True):
            part = {t: np.asarray(v)[lo:hi] for t, v in columns.items()}
            file.write(records(steps[lo:hi], walls[lo:hi], part))
    if readonly:
        path.chmod(0o400)
    return path


def write_ranked_run(
    run_dir: str | os.PathLike[str],
    columns: dict[int, dict[str, np.ndarray]],
    steps: dict[int, np.ndarray] | None = None,
    status: dict[int, str] | None = None,
    pid: int | None = None,
) -> Path:
    """A distributed run as ``Monitor`` writes it under msrun: ``rank_<k>/`` per rank.

    ``columns[k]`` maps tag -> values of rank k at ``steps[k]`` (default ``0..n-1``),
    written with ``EventWriter(run_dir/rank_k, rank=k)``; each rank gets a marker with
    ``status[k]`` (default finished). A ``running`` rank's marker names ``pid`` (default
    this process, so it reads as alive; pass a dead pid for a rank whose process died).
    """
    import socket

    from msmon_nb.events.writer import EventWriter
    from msmon_nb.rundir import write_marker

    run_dir = Path(run_dir)
    size = len(columns)
    for rank, cols in columns.items():
        n = len(next(iter(cols.values())))
        rank_steps = np.arange(n) if steps is None or rank not in steps else steps[rank]
        rank_dir = run_dir / f"rank_{rank}"
        with EventWriter(rank_dir, rank=rank, block_secs=None) as writer:
            for i, step in enumerate(rank_steps.tolist()):
                writer.add_scalars(step, {tag: float(v[i]) for tag, v in cols.items()})
        state = (status or {}).get(rank, "finished")
        marker = {
            "run_name": run_dir.name,
            "status": state,
            "start": 1.7e9,
            "rank": rank,
            "ranks": size,
            "host": socket.gethostname(),
            "pid": os.getpid() if pid is None else pid,
        }
        if state != "running":
            marker.update(end=1.7e9 + 60, last_step=int(rank_steps[-1]) if n else None)
        write_marker(rank_dir, marker)
    return run_dir
