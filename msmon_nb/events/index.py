"""A cheap listing of the runs under a base dir, for viewers that must open fast.

``load_runs`` decodes every record (about 3 M scalars/s): a base dir of 100 runs of
100 k steps would take seconds before a list appears. ``RunIndex`` reads, per summary
file, only its first ``head_bytes`` and its last ``tail_bytes`` (the tail found by
searching for a record whose length checksum holds and whose successor is also framed),
and after that only what was appended, so a listing costs a stat per file once warm.

What it gives per run (``RunInfo``): tags, last step, last write, status and ranks, and
for a distributed run (``rank_<k>/`` dirs, each with its own marker) every rank's last
step and status. ``exact`` is False when a middle part of some file was skipped; then a
tag written only there is missing until the run is fully loaded with ``Run``. Status
follows ``Run.status`` except that "damaged" is only reported for damage seen in the
parts read.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from msmon_nb.events import msprobe
from msmon_nb.events.bulk import BulkScalarDecoder
from msmon_nb.events.crc import masked_crc32c
from msmon_nb.events.framing import HEADER, HEADER_SIZE, OVERHEAD
from msmon_nb.events.reader import EventDecoder, RecordReader
from msmon_nb.events.runs import Run
from msmon_nb.rundir.layout import (
    MARKER,
    combined_status,
    file_signature,
    find_run_dirs,
    rank_of_dir,
    read_marker,
    run_files,
    run_status,
)

_MAX_RECORD = 1 << 30  # a longer "length" is noise met while searching for a record start


@dataclass(frozen=True)
class RunInfo:
    """What a run list shows about one run, read cheaply."""

    name: str
    path: str
    tags: tuple[str, ...]
    last_step: int | None
    last_write: float | None
    status: str
    ranks: tuple[int, ...]
    exact: bool  # every byte of every file was read (else tags may miss rare ones)
    signature: tuple = field(compare=False, repr=False)  # changes when any file changes
    rank_last_step: dict[int, int | None] = field(default_factory=dict, compare=False)
    rank_status: dict[int, str] = field(default_factory=dict, compare=False)  # marked ranks


@dataclass
class _FileScan:
    size: int
    mtime_ns: int
    rank: int
    tags: set[str]
    last_step: int | None
    last_wall: float | None
    scanned_to: int  # records up to this offset were read (after any skipped middle)
    complete: bool  # no part of the file was skipped
    damaged: bool


def find_record_start(buf: bytes) -> int | None:
    """Offset in ``buf`` of the first record whose framing holds and is followed by another.

    A record starts with an 8-byte little-endian length (so, for any sane record, its
    five high bytes are zero) and that length's masked CRC32C. Candidates are found with
    numpy; the checksum is computed only for them. The record's end must be the end of
    ``buf`` or the start of another valid header, so a chance match inside a payload is
    rejected.
    """
    data = np.frombuffer(buf, dtype=np.uint8)
    n = len(data) - HEADER_SIZE
    if n < 0:
        return None
    zero = data == 0
    cand = np.ones(n + 1, dtype=bool)
    for k in range(3, 8):
        cand &= zero[k : k + n + 1]
    for pos in np.flatnonzero(cand).tolist():
        length = _header_ok(buf, pos)
        if length is None:
            continue
        nxt = pos + length + OVERHEAD
        if nxt >= len(buf):  # the last record, complete or still being written
            return pos
        if nxt + HEADER_SIZE <= len(buf) and _header_ok(buf, nxt) is not None:
            return pos
    return None


def _header_ok(buf: bytes, pos: int) -> int | None:
    """The payload length of a valid header at ``pos``, else None."""
    if pos + HEADER_SIZE > len(buf):
        return None
    length, crc = HEADER.unpack_from(buf, pos)
    if length > _MAX_RECORD or masked_crc32c(buf[pos : pos + 8]) != crc:
        return None
    return length


class _Scanner:
    """Reads windows of summary files and notes tags and the last step."""

    def __init__(self, head_bytes: int, tail_bytes: int, follow_bytes: int) -> None:
        self.head_bytes = head_bytes
        self.tail_bytes = tail_bytes
        self.follow_bytes = follow_bytes
        self.bulk = BulkScalarDecoder()
        self.decoder = EventDecoder()

    def scan(self, path: Path, rank: int, old: _FileScan | None) -> _FileScan:
        st = path.stat()
        if old is not None and (old.size, old.mtime_ns) == (st.st_size, st.st_mtime_ns):
            return old
        if old is None or st.st_size < old.size:
            scan = _FileScan(st.st_size, st.st_mtime_ns, rank, set(), None, None, 0, True, False)
            self._read(path, scan, 0, limit=self.head_bytes)
            start = scan.scanned_to
        else:
            scan = _FileScan(
                st.st_size,
                st.st_mtime_ns,
                rank,
                set(old.tags),
                old.last_step,
                old.last_wall,
                old.scanned_to,
                old.complete,
                old.damaged,
            )
            start = old.scanned_to
        if st.st_size - start > self.follow_bytes:
            tail_at = max(start, st.st_size - self.tail_bytes)
            with open(path, "rb") as file:
                file.seek(tail_at)
                window = file.read(st.st_size - tail_at)
            found = find_record_start(window)
            scan.complete = False
            if found is None:
                scan.scanned_to = st.st_size
                return scan
            start = tail_at + found
        self._read(path, scan, start, limit=None)
        return scan

    def _read(self, path: Path, scan: _FileScan, start: int, limit: int | None) -> None:
        reader = RecordReader(path, chunk=limit or self.follow_bytes)
        reader.offset = start
        for buf, _base, starts, stops in reader.batches():
            self._note(buf, starts, stops, scan)
            if limit is not None:
                break
        scan.scanned_to = reader.offset
        scan.damaged = scan.damaged or bool(reader.problems)

    def _note(self, buf: bytes, starts: list[int], stops: list[int], scan: _FileScan) -> None:
        blocks, rest = self.bulk.decode(buf, starts, stops)
        last = (-1, None, None)  # (record index, step, wall) of the last record with a step
        for block in blocks:
            scan.tags.update(block.tags)
            if len(block.index) and int(block.index[-1]) > last[0]:
                last = (int(block.index[-1]), int(block.steps[-1]), float(block.walls[-1]))
        for i in rest.tolist():
            try:
                record = self.decoder.decode(0, buf[starts[i] : stops[i]])
            except ValueError:
                scan.damaged = True
                continue
            scan.tags.update(v.tag for v in record.values if v.kind == "scalar")
            if record.step is not None and i > last[0]:
                last = (i, record.step, record.wall_time)
        if last[1] is not None:
            scan.last_step, scan.last_wall = last[1], last[2]


class RunIndex:
    """Cheap, incremental run listing of one base dir (see the module docstring)."""

    def __init__(
        self,
        base: str | os.PathLike[str],
        head_bytes: int = 64 * 1024,
        tail_bytes: int = 64 * 1024,
        follow_bytes: int = 1024 * 1024,
        clock=time.time,
    ) -> None:
        self.base = Path(base)
        self._scanner = _Scanner(head_bytes, tail_bytes, follow_bytes)
        self._files: dict[Path, _FileScan] = {}
        self._markers: dict[Path, tuple[tuple[int, int], dict | None]] = {}
        self._touched: set[Path] = set()  # markers looked at by the current scan
        self._clock = clock
        self._msprobe_runs: dict[Path, Run] = {}

    def run_dirs(self) -> dict[str, Path]:
        """Run name (path relative to the base, posix) -> run dir; {} when no base."""
        if not self.base.is_dir():
            return {}
        out = {}
        found = find_run_dirs(self.base)
        for path in found:
            path = self._job_dir(path)
            rel = path.relative_to(self.base).as_posix()
            out[rel if rel != "." else path.name] = path
        for path in msprobe.find_runs(self.base):
            if any(path == run or run in path.parents for run in found):
                continue
            rel = path.relative_to(self.base).as_posix()
            out[rel if rel != "." else path.name] = path
        return out

    def _job_dir(self, path: Path) -> Path:
        """The run a ``rank_<k>/`` dir belongs to, for a found dir that is one.

        Before any rank has flushed a summary file, the job dir holds only ``rank_<k>/``
        dirs with markers, so discovery stops at those; listing them as runs of their own
        would rename the run once its files appear.
        """
        if path == self.base or rank_of_dir(path.name) is None:
            return path
        marker = self._marker(path)
        try:
            distributed = int((marker or {}).get("ranks", 1)) > 1
        except (TypeError, ValueError):
            distributed = False
        return path.parent if distributed else path

    def _marker(self, run_dir: Path) -> dict | None:
        """``read_marker``, re-read only when the file changed; None when absent."""
        path = run_dir / MARKER
        self._touched.add(path)
        try:
            st = path.stat()
        except OSError:
            self._markers.pop(path, None)
            return None
        key = (st.st_size, st.st_mtime_ns)
        cached = self._markers.get(path)
        if cached is None or cached[0] != key:
            cached = self._markers[path] = (key, read_marker(run_dir))
        return cached[1]

    def _rank_markers(self, path: Path) -> dict[int, tuple[dict | None, tuple]]:
        """rank -> (marker of ``rank_<k>/``, its stat signature), for ranks with a marker."""
        out = {}
        try:
            entries = [e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return out
        for entry in entries:
            rank = rank_of_dir(entry.name)
            if rank is None:
                continue
            marker = self._marker(Path(entry.path))
            if marker is not None:
                key = self._markers[Path(entry.path) / MARKER][0]
                out[rank] = (marker, key)
        return dict(sorted(out.items()))

    def scan(self) -> list[RunInfo]:
        """Every run under the base dir, sorted by name."""
        seen: set[Path] = set()
        self._touched: set[Path] = set()
        infos = [self._info(name, path, seen) for name, path in self.run_dirs().items()]
        for gone in set(self._files) - seen:
            del self._files[gone]
        for gone in set(self._markers) - self._touched:
            del self._markers[gone]
        return sorted(infos, key=lambda i: i.name)

    def _msprobe_info(self, name: str, path: Path) -> RunInfo:
        """An msprobe run's info: its CSV files are small, so it is read whole (a ``Run``
        kept per dir re-reads only the ranks whose files changed)."""
        run = self._msprobe_runs.get(path)
        if run is None:
            run = self._msprobe_runs[path] = Run(path, name=name)
        run.refresh()
        files = run.files
        signature = (file_signature(files), run.status)
        ranks = tuple(run.ranks)
        return RunInfo(
            name=name,
            path=str(path),
            tags=tuple(run.tags()),
            last_step=run.last_step,
            last_write=run.last_write,
            status=run.status,
            ranks=ranks,
            exact=True,
            signature=signature,
            rank_last_step=run.rank_last_step(),
            rank_status={},
        )

    def info(self, name: str, path: Path) -> RunInfo:
        """One run's info (rescanning only what changed)."""
        return self._info(name, path, set())

    def _info(self, name: str, path: Path, seen: set[Path]) -> RunInfo:
        if not (path / MARKER).exists() and msprobe.is_msprobe_run(path):
            return self._msprobe_info(name, path)
        files = run_files(path)
        scans = []
        for file, rank in files:
            try:
                scan = self._scanner.scan(file, rank, self._files.get(file))
            except OSError:
                continue
            self._files[file] = scan
            seen.add(file)
            scans.append((file, scan))
        marker = self._marker(path)
        marker_sig = self._markers[path / MARKER][0] if (path / MARKER) in self._markers else ()
        last_write = max((s.mtime_ns for _, s in scans), default=None)
        last_write_s = None if last_write is None else last_write / 1e9
        now = self._clock()
        rank_markers = self._rank_markers(path)
        rank_status = {}
        for rank, (rank_marker, _) in rank_markers.items():
            mine = [(f, s) for f, s in scans if s.rank == rank]
            written = max((s.mtime_ns for _, s in mine), default=None)
            rank_status[rank] = run_status(
                rank_marker,
                [f for f, _ in mine],
                None if written is None else written / 1e9,
                now,
            )
        if rank_status:  # as Run.status: the most alarming state of any rank
            status = combined_status(rank_status.values())
        else:
            status = run_status(marker, [f for f, _ in scans], last_write_s, now)
        if status != "running" and any(s.damaged for _, s in scans):
            status = "damaged"
        ranks = sorted({s.rank for _, s in scans} | set(rank_markers)) or [0]
        first_rank = min((s.rank for _, s in scans), default=ranks[0])
        tags = sorted({t for _, s in scans if s.rank == first_rank for t in s.tags})
        newest: dict[int, tuple[float, int]] = {}  # rank -> (wall, step) of its newest record
        for _, s in scans:  # as Run.last_step: the record with the latest wall time wins
            if s.last_step is None or s.last_wall is None:
                continue
            if s.rank not in newest or s.last_wall >= newest[s.rank][0]:
                newest[s.rank] = (s.last_wall, s.last_step)
        steps = [step for _, step in newest.values()]
        signature = (
            tuple((str(f), s.size, s.mtime_ns) for f, s in scans),
            marker_sig,
            status,
            tuple((rank, key) for rank, (_, key) in rank_markers.items()),
            tuple(rank_status.items()),
        )
        return RunInfo(
            name=name,
            path=str(path),
            tags=tuple(tags),
            last_step=max(steps) if steps else None,
            last_write=last_write_s,
            status=status,
            ranks=tuple(ranks),
            exact=all(s.complete for _, s in scans),
            signature=signature,
            rank_last_step={r: newest[r][1] if r in newest else None for r in ranks},
            rank_status=rank_status,
        )
