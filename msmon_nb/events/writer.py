"""``EventWriter``: MindSpore-format summary files written by a background thread.

The training thread only appends a small tuple to a deque (well under a microsecond);
encoding, framing, CRCs and disk I/O happen in one daemon thread that wakes every
``poll_secs`` and flushes at least every ``flush_secs``. No helper processes: MindSpore's
``SummaryRecord`` keeps a pool of three, one spinning a core even when idle.

Queue bound: at most ``max_queue_bytes`` of pending data (scalars count ~64 bytes, arrays
their size). When the writer thread falls that far behind (a hung network disk), the
caller waits up to ``block_secs`` for room, then the record is dropped, counted in
``dropped`` and reported once through ``logging`` -- training is never stopped by its
monitor. An error in the writer thread (disk full, permission) is raised to the caller
on its next call as ``WriterError``, as TensorBoard's writer does; records queued before
the error that reached the file stay readable.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import platform
import stat
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

from msmon_nb.events import wire
from msmon_nb.events.framing import frame
from msmon_nb.events.histogram import histogram as make_histogram
from msmon_nb.events.overview import OverviewWriter
from msmon_nb.events.png import encode_png

log = logging.getLogger(__name__)

FILE_MARK = ".out.events.summary."
DEFAULT_SUFFIX = "_MS"
_OPEN_MODE = stat.S_IRUSR | stat.S_IWUSR  # 0600 while written
_DONE_MODE = stat.S_IRUSR  # 0400 once closed, like SummaryRecord
_SCALAR_COST = 64


class WriterError(RuntimeError):
    """The writer thread failed; the message says why and which file."""


def event_file_name(
    wall_secs: int,
    rank: int = 0,
    host: str | None = None,
    suffix: str = DEFAULT_SUFFIX,
    flavor: str = "mindspore",
) -> str:
    """``events.out.events.summary.<secs>.<rank>.<host><suffix>``, as SummaryRecord names it.

    The ``tensorboard`` flavor gives ``events.out.tfevents.<secs>.<host>.<pid>.<rank>``.
    """
    host = host or platform.node()
    if flavor == "tensorboard":
        return f"events.out.tfevents.{wall_secs}.{host}.{os.getpid()}.{rank}"
    return f"events{FILE_MARK}{wall_secs}.{rank}.{host}{suffix}"


_LIVE: weakref.WeakSet[EventWriter] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for writer in list(_LIVE):
        writer.close()


class EventWriter:
    """Write summary events into ``logdir``; see the module docstring for the threading model.

    Args:
        logdir: directory of the run (created 0700 if missing, as MindSpore does).
        rank: device rank written into the file name.
        max_file_size: start a new file (with its own version record) before a file would
            exceed this many bytes; ``None`` for no limit.
        flush_secs: longest time a record waits in memory before it reaches the OS.
        max_queue_bytes, block_secs: the queue bound, see the module docstring;
            ``block_secs=None`` waits as long as it takes and never drops (for tools that
            write existing data, like ``msmon export``, rather than a training loop).
        flavor: ``mindspore`` (default) or ``tensorboard`` (tfevents files, scalars only).
        overview: also keep the run dir's overview (``events.overview``: per tag, one row
            per 64 scalars, built in the writer thread), which lets the viewer draw a big
            finished run without decoding it. Off for tensorboard files.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        *,
        rank: int = 0,
        max_file_size: int | None = None,
        flush_secs: float = 1.0,
        poll_secs: float = 0.05,
        max_queue_bytes: int = 64 * 2**20,
        block_secs: float | None = 2.0,
        suffix: str = DEFAULT_SUFFIX,
        flavor: str = "mindspore",
        clock=time.time,
        overview: bool = True,
    ) -> None:
        if flavor not in ("mindspore", "tensorboard"):
            raise ValueError(f"flavor={flavor!r}: use 'mindspore' or 'tensorboard'")
        if max_file_size is not None and max_file_size < 256:
            raise ValueError(
                f"max_file_size={max_file_size} is too small to hold a record; "
                "use at least 256 bytes, e.g. max_file_size=64 * 2**20"
            )
        self.logdir = Path(logdir)
        self.logdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.rank = int(rank)
        self.max_file_size = max_file_size
        self.flush_secs = flush_secs
        self.poll_secs = min(poll_secs, flush_secs)
        self.max_queue_bytes = max_queue_bytes
        self.block_secs = block_secs
        self.suffix = suffix
        self.flavor = flavor
        self._prefixes = wire.TF_PREFIXES if flavor == "tensorboard" else wire.ScalarPrefixes()
        self._version = wire.TF_VERSION if flavor == "tensorboard" else wire.VERSION
        self._clock = clock
        self._host = platform.node()
        self._pid = os.getpid()
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._bytes_in = 0
        self._bytes_out = 0
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._flush_requests = 0
        self._flush_done = 0
        self._closed = False
        self._error: BaseException | None = None
        self.dropped = 0
        self._warned_drop = False
        self.files: list[Path] = []
        self._file: BinaryIO | None = None
        self._file_size = 0
        self._last_secs = 0
        self._overview = OverviewWriter(self.logdir) if overview and flavor == "mindspore" else None
        self._open_file()
        self._thread = threading.Thread(
            target=self._run, name=f"msmon-writer-{self.logdir.name}", daemon=True
        )
        self._thread.start()
        _LIVE.add(self)

    # --- caller side ------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The file currently written."""
        return self.files[-1]

    @property
    def closed(self) -> bool:
        """True once ``close()`` ran."""
        return self._closed

    def _check(self) -> None:
        if self._error is not None:
            raise WriterError(f"summary writer for {self.logdir} failed: {self._error}") from (
                self._error
            )
        if self._closed:
            raise WriterError(f"summary writer for {self.logdir} is closed; open a new one")

    def _put(self, item: tuple, cost: int) -> None:
        self._check()
        if self._bytes_in - self._bytes_out + cost > self.max_queue_bytes and not self._wait_room(
            cost
        ):
            self.dropped += 1
            if not self._warned_drop:
                self._warned_drop = True
                log.warning(
                    "msmon: the summary writer for %s is %d MB behind; dropping records "
                    "(counted in writer.dropped) so training is not held up",
                    self.logdir,
                    self.max_queue_bytes // 2**20,
                )
            return
        with self._lock:
            self._bytes_in += cost
            self._queue.append((cost, item))

    def _wait_room(self, cost: int) -> bool:
        deadline = None if self.block_secs is None else time.monotonic() + self.block_secs
        self._wake.set()
        while deadline is None or time.monotonic() < deadline:
            if self._bytes_in - self._bytes_out + cost <= self.max_queue_bytes:
                return True
            if self._error is not None:
                return False
            time.sleep(0.005)
        return False

    def add_scalars(
        self, step: int, values: Mapping[str, float], wall_time: float | None = None
    ) -> None:
        """Record several scalars at ``step`` as one event (what SummaryRecord.record does)."""
        items = tuple((tag, float(v)) for tag, v in values.items())
        self._put(("s", int(step), self._wall(wall_time), items), _SCALAR_COST * len(items))

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        """Record one scalar."""
        self.add_scalars(step, {tag: value}, wall_time)

    def add_histogram(self, tag: str, values, step: int, wall_time: float | None = None) -> None:
        """Record a histogram of ``values`` (array-like, or a ready ``Histogram``)."""
        self._only_scalars("histograms")
        if isinstance(values, wire.Histogram):
            item = ("h", int(step), self._wall(wall_time), tag, values)
            self._put(item, 32 * len(values.buckets) + _SCALAR_COST)
            return
        arr = np.array(values, copy=True)
        self._put(("h", int(step), self._wall(wall_time), tag, arr), arr.nbytes + _SCALAR_COST)

    def add_tensor(self, tag: str, values, step: int, wall_time: float | None = None) -> None:
        """Record a tensor (stored as MindSpore does: float32 data plus the dtype code)."""
        self._only_scalars("tensors")
        arr = np.array(values, copy=True)
        if arr.dtype.name not in wire.DTYPE_CODES:
            raise TypeError(
                f"tensor {tag!r} has dtype {arr.dtype}, which summaries cannot hold; "
                f"cast it, e.g. values.astype(np.float32)"
            )
        self._put(("t", int(step), self._wall(wall_time), tag, arr), arr.nbytes + _SCALAR_COST)

    def add_image(self, tag: str, image, step: int, wall_time: float | None = None) -> None:
        """Record an image: (H, W), (H, W, C) or (C, H, W); uint8 or floats."""
        self._only_scalars("images")
        height, width, channels, png = encode_png(np.asarray(image))
        item = ("i", int(step), self._wall(wall_time), tag, (height, width, channels, png))
        self._put(item, len(png) + _SCALAR_COST)

    def add_event(self, payload: bytes) -> None:
        """Append an already-encoded Event (used by tools that copy events)."""
        self._put(("r", payload), len(payload))

    def _only_scalars(self, what: str) -> None:
        if self.flavor == "tensorboard":
            raise TypeError(f"{what} cannot be written to a tensorboard-flavor file; scalars only")

    def _wall(self, wall_time: float | None) -> float:
        return self._clock() if wall_time is None else wall_time

    def flush(self, timeout: float | None = 30.0) -> None:
        """Wait until everything queued so far is written and flushed to the OS."""
        self._check()
        with self._flushed:
            self._flush_requests += 1
            ticket = self._flush_requests
            self._wake.set()
            self._flushed.wait_for(
                lambda: self._flush_done >= ticket or self._error is not None, timeout
            )
        self._check()

    def close(self) -> None:
        """Write what is queued, close the file (made read-only) and stop the thread."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:  # a forked child owns no thread and no file
            return
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        _LIVE.discard(self)
        if self._error is not None:
            log.debug("msmon: summary writer for %s stopped early: %s", self.logdir, self._error)

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writer thread ----------------------------------------------------------------

    def _file_path(self, secs: int) -> Path:
        return self.logdir / event_file_name(secs, self.rank, self._host, self.suffix, self.flavor)

    def _open_file(self) -> None:
        secs = max(int(self._clock()), self._last_secs + 1)
        path = self._file_path(secs)
        while path.exists():  # another writer started in the same second
            secs += 1
            path = self._file_path(secs)
        self._last_secs = secs
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _OPEN_MODE)
        self._file = os.fdopen(fd, "wb", buffering=256 * 1024)
        self.files.append(path)
        self._file_size = 0
        self._write_payload(wire.version_event(self._clock(), self._version), rotate=False)

    def _close_file(self) -> None:
        if self._file is None:
            return
        file, self._file = self._file, None
        try:
            file.close()
        finally:
            try:
                self.files[-1].chmod(_DONE_MODE)
            except OSError:
                pass

    def _write_payload(self, payload: bytes, rotate: bool = True) -> None:
        data = frame(payload)
        if (
            rotate
            and self.max_file_size is not None
            and self._file_size + len(data) > self.max_file_size
            and self._file_size > 0
        ):
            self._close_file()
            self._open_file()
        assert self._file is not None
        self._file.write(data)
        self._file_size += len(data)

    def _encode(self, item: tuple) -> bytes:
        kind = item[0]
        if kind == "s":
            if self._overview is not None:
                self._overview.add(item[1], item[3])
            return wire.scalar_event(item[1], item[2], item[3], self._prefixes)
        if kind == "r":
            return item[1]
        _, step, wall, tag, data = item
        if kind == "h":
            hist = data if isinstance(data, wire.Histogram) else make_histogram(data)
            value = wire.histogram_value(tag, hist)
        elif kind == "t":
            value = wire.tensor_value(tag, data)
        else:
            value = wire.image_value(tag, *data)
        return wire.summary_event(step, wall, (value,))

    def _drain(self) -> int:
        queue = self._queue
        done = 0
        cost = 0
        while queue:
            item_cost, item = queue.popleft()
            self._write_payload(self._encode(item))
            done += 1
            cost += item_cost
        with self._lock:
            self._bytes_out += cost
        return done

    def _run(self) -> None:
        last_flush = time.monotonic()
        dirty = False
        try:
            while True:
                self._wake.wait(self.poll_secs)
                self._wake.clear()
                closing = self._closed
                with self._flushed:
                    ticket = self._flush_requests
                if self._drain():
                    dirty = True
                now = time.monotonic()
                due = closing or ticket > self._flush_done or now - last_flush >= self.flush_secs
                if dirty and due:
                    assert self._file is not None
                    self._file.flush()
                    self._flush_overview(closing=False)
                    dirty = False
                    last_flush = now
                if ticket > self._flush_done:
                    with self._flushed:
                        self._flush_done = ticket
                        self._flushed.notify_all()
                if closing:
                    self._drain()
                    break
        except BaseException as exc:  # noqa: BLE001 - surfaced to the caller on its next call
            self._error = exc
            # reported to the caller as WriterError on its next call, not logged twice
            log.debug("msmon: summary writer for %s failed: %s", self.logdir, exc)
            with self._flushed:
                self._flushed.notify_all()
        finally:
            try:
                self._close_file()
                if self._error is None:
                    self._flush_overview(closing=True)
            except OSError as exc:
                if self._error is None:
                    self._error = exc

    def _flush_overview(self, closing: bool) -> None:
        """Append the overview's finished rows; at close, mark it complete over the files
        as written. A failure only loses the overview (the viewer then decodes)."""
        if self._overview is None:
            return
        try:
            files = [(p.name, p.stat().st_size) for p in self.files] if closing else None
            self._overview.flush(files)
        except OSError as exc:
            log.warning("msmon: %s: no overview kept (%s); viewers will decode", self.logdir, exc)
            self._overview = None


def write_scalar_series(
    logdir: str | os.PathLike[str], series: Iterable[tuple[int, Mapping[str, float]]], **kw
) -> list[Path]:
    """Write ``(step, {tag: value})`` pairs to a new file in ``logdir``; returns its files."""
    kw.setdefault("block_secs", None)
    with EventWriter(logdir, **kw) as writer:
        for step, values in series:
            writer.add_scalars(step, values)
    return writer.files
