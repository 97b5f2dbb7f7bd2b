"""Reading summary files: framing checks, tailing, truncation and corruption recovery.

``RecordReader`` yields the payload of every intact record not yet returned; call it
again on a file that is still being written and it continues where it stopped. The
rules, as in TensorBoard's ``event_file_loader``:

* an incomplete record at the end of the file (the writer is mid-write, or was killed)
  is not an error: the reader stays at its first byte and retries on the next call;
* a record whose length checksum is wrong is reported with its file offset, and the
  reader resynchronises at the next offset where a length checksum holds;
* a record whose data checksum is wrong is reported and skipped (its length was
  verified, so the next record is found).

Nothing here raises on the content of a file; problems are collected in ``problems``
and logged once each.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from msmon_nb.events import wire
from msmon_nb.events.crc import MASK_DELTA, crc32c, masked_crc32c
from msmon_nb.events.framing import FOOTER_SIZE, HEADER, HEADER_SIZE, OVERHEAD
from msmon_nb.events.png import decode_png

log = logging.getLogger(__name__)

CHUNK = 8 * 2**20
_RUN_MIN = 4
_HEAD_DTYPE = np.dtype([("length", "<u8"), ("crc", "<u4")])


def _lengths_at(buf: bytes, starts: np.ndarray) -> np.ndarray:
    data = np.frombuffer(buf, dtype=np.uint8)
    at = starts - HEADER_SIZE
    return (
        np.ascontiguousarray(data[at[:, None] + np.arange(8)]).view("<u8").ravel().astype(np.int64)
    )


def _run_length(buf: bytes, pos: int, size: int, most: int) -> int:
    """How many records of ``size`` bytes with the header at ``pos`` follow back to back
    (at most ``most``). Windows grow 4x, so the work is proportional to the run, not to
    the rest of the buffer (records of varying lengths, e.g. one scalar per event under
    several tags, would otherwise cost a pass over the whole buffer each)."""
    count = min(most, _RUN_MIN * 4)
    while True:
        heads = np.ndarray((count,), _HEAD_DTYPE, buffer=buf, offset=pos, strides=(size,))
        same = (heads["length"] == heads["length"][0]) & (heads["crc"] == heads["crc"][0])
        if not same.all():
            return int(np.argmin(same))
        if count == most:
            return count
        count = min(most, count * 4)


@dataclass(frozen=True, slots=True)
class Problem:
    """A damaged spot in a file: where it is and what is wrong."""

    path: str
    offset: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path} at byte {self.offset}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ImageValue:
    """An image summary: PNG bytes plus the size MindSpore stores next to them."""

    height: int
    width: int
    colorspace: int
    encoded: bytes

    def to_array(self) -> np.ndarray:
        """Decoded (H, W, C) uint8 pixels."""
        return decode_png(self.encoded)


@dataclass(frozen=True, slots=True)
class Value:
    """One summary value; ``kind`` is scalar, histogram, tensor, image or landscape."""

    tag: str
    kind: str
    value: Any


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One record of a summary file, decoded."""

    offset: int
    wall_time: float
    step: int | None
    values: tuple[Value, ...] = ()
    version: str | None = None
    has_graph: bool = False


class RecordReader:
    """Yields ``(offset, payload)`` of new intact records of one file; see module docstring."""

    def __init__(self, path: str | os.PathLike[str], chunk: int = CHUNK) -> None:
        self.path = Path(path)
        self.offset = 0  # file offset of the first byte not yet consumed
        self.chunk = chunk
        self.problems: list[Problem] = []
        self.pending = 0  # bytes of an incomplete record at the end, as of the last call
        self.records_read = 0
        self._in_garbage = False
        self._good_lengths: dict[int, int] = {}  # length -> its masked CRC, checked once

    def _report(self, offset: int, reason: str) -> None:
        problem = Problem(str(self.path), offset, reason)
        self.problems.append(problem)
        log.warning("msmon: damaged summary record in %s", problem)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return self.records()

    def records(self) -> Iterator[tuple[int, bytes]]:
        """New intact records since the last call, as ``(file offset, payload)``."""
        for buf, base, starts, stops in self.batches():
            for start, stop in zip(starts, stops, strict=True):
                self.offset = base + stop + FOOTER_SIZE  # a consumer may stop after any record
                yield base + start - HEADER_SIZE, buf[start:stop]

    def batches(self) -> Iterator[tuple[bytes, int, list[int], list[int]]]:
        """New intact records, a chunk at a time: ``(buf, base, starts, stops)``.

        ``buf`` holds file bytes from offset ``base``; record i's payload is
        ``buf[starts[i]:stops[i]]``. Bulk readers decode these without a Python object
        per record.
        """
        try:
            file = open(self.path, "rb")  # noqa: SIM115 - closed in finally, across yields
        except OSError as exc:
            if not any(p.reason.startswith("cannot open") for p in self.problems):
                self._report(self.offset, f"cannot open: {exc.strerror or exc}")
            return
        try:
            size = os.fstat(file.fileno()).st_size
            if size < self.offset:
                self._report(size, f"file shrank from {self.offset} to {size} bytes; re-reading")
                self.offset = 0
            file.seek(self.offset)
            buf = b""
            base = self.offset
            need = self.chunk
            while True:
                more = file.read(max(self.chunk, need))
                if not more:
                    break
                buf = buf[self.offset - base :] + more
                base = self.offset
                starts, stops, need = self._parse(buf, base)
                if starts:
                    yield buf, base, starts, stops
        finally:
            file.close()

    def _parse(self, buf: bytes, base: int) -> tuple[list[int], list[int], int]:
        """Find the intact records in ``buf`` (which starts at file offset ``base``).

        Returns payload starts, payload stops, and how many bytes the record at the first
        unconsumed byte needs; leaves ``self.offset`` at that byte.

        Headers are walked first; a writer emits long runs of records of one length, so
        after each header the reader checks in one numpy pass how many records of that
        same length (same 12 header bytes) follow back to back. Payload checksums are
        then verified for all records at once.
        """
        view = memoryview(buf)
        starts: list[int] = []
        lengths: list[int] = []
        runs: list[np.ndarray] = []
        header = HEADER.unpack_from
        good_lengths = self._good_lengths
        pos = 0
        end = len(buf)
        while True:
            if end - pos < HEADER_SIZE:
                need = HEADER_SIZE
                break
            length, length_crc = header(buf, pos)
            if good_lengths.get(length) != length_crc:
                if masked_crc32c(view[pos : pos + 8]) != length_crc:
                    if not self._in_garbage:
                        self._report(
                            base + pos, "length checksum mismatch; skipping to next record"
                        )
                        self._in_garbage = True
                    pos = self._resync(view, pos + 1)
                    continue
                good_lengths[length] = length_crc
            self._in_garbage = False
            size = length + OVERHEAD
            if pos + size > end:
                need = size
                break
            count = (end - pos) // size
            if count >= _RUN_MIN and header(buf, pos + size) == (length, length_crc):
                count = _run_length(buf, pos, size, count)
                runs.append(pos + HEADER_SIZE + size * np.arange(count, dtype=np.int64))
                lengths.extend([length] * count)
                pos += size * count
            else:
                starts.append(pos + HEADER_SIZE)
                lengths.append(length)
                pos += size
        self.offset = base + pos
        self.pending = end - pos
        if not lengths:
            return [], [], need
        # runs and single records were appended in file order, interleaved; rebuild it
        all_starts = np.sort(np.concatenate([np.asarray(starts, dtype=np.int64), *runs]))
        length_arr = np.asarray(lengths, dtype=np.int64)
        if runs and starts:
            length_arr = _lengths_at(buf, all_starts)
        stop_arr = all_starts + length_arr
        ok = self._payload_crcs_ok(buf, view, all_starts, stop_arr)
        if not ok.all():
            for bad in np.nonzero(~ok)[0].tolist():
                self._report(
                    base + int(all_starts[bad]) - HEADER_SIZE,
                    "data checksum mismatch; record skipped",
                )
            all_starts, stop_arr = all_starts[ok], stop_arr[ok]
        self.records_read += len(all_starts)
        return all_starts.tolist(), stop_arr.tolist(), need

    @staticmethod
    def _payload_crcs_ok(
        buf: bytes, view: memoryview, starts: np.ndarray, stops: np.ndarray
    ) -> np.ndarray:
        crc = crc32c
        crcs = np.fromiter(
            (crc(view[a:b]) for a, b in zip(starts.tolist(), stops.tolist(), strict=True)),
            dtype=np.uint32,
            count=len(starts),
        )
        masked = ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + np.uint32(MASK_DELTA)
        data = np.frombuffer(buf, dtype=np.uint8)
        stored = np.ascontiguousarray(data[stops[:, None] + np.arange(4)]).view("<u4").ravel()
        return masked == stored

    @staticmethod
    def _resync(view: memoryview, pos: int) -> int:
        """First offset >= pos whose 8 bytes match the 4 after them as a length checksum."""
        end = len(view) - HEADER_SIZE
        while pos <= end:
            expected = int.from_bytes(view[pos + 8 : pos + 12], "little")
            if masked_crc32c(view[pos : pos + 8]) == expected:
                return pos
            pos += 1
        return max(pos, 0)


_KINDS = ("scalar_value", "histogram", "tensor", "image", "loss_landscape")


def _tensor_array(proto: Any) -> np.ndarray:
    name = wire.DTYPE_NAMES.get(proto.data_type, "float32")
    dims = tuple(proto.dims)
    if len(proto.float_data):
        data = np.array(proto.float_data, dtype=np.float32)
    elif len(proto.double_data):
        data = np.array(proto.double_data, dtype=np.float64)
    elif len(proto.int64_data):
        data = np.array(proto.int64_data, dtype=np.int64)
    elif len(proto.int32_data):
        data = np.array(proto.int32_data, dtype=np.int32)
    elif len(proto.uint64_data):
        data = np.array(proto.uint64_data, dtype=np.uint64)
    elif proto.raw_data:
        data = np.frombuffer(proto.raw_data, dtype=np.dtype(name).newbyteorder("<"))
    else:
        data = np.zeros(0, dtype=name)
    if int(np.prod(dims, dtype=np.int64)) == data.size:
        data = data.reshape(dims)
    return data.astype(name, copy=False)


def _histogram(proto: Any) -> wire.Histogram:
    return wire.Histogram(
        buckets=tuple((b.left, b.width, int(b.count)) for b in proto.buckets),
        nan_count=int(proto.nan_count),
        pos_inf_count=int(proto.pos_inf_count),
        neg_inf_count=int(proto.neg_inf_count),
        min=proto.min,
        max=proto.max,
        sum=proto.sum,
        count=int(proto.count),
    )


def decode_value(proto: Any) -> Value | None:
    """A ``Summary.Value`` message as a ``Value`` (None when it holds nothing we know)."""
    kind = proto.WhichOneof("value")
    if kind == "scalar_value":
        return Value(proto.tag, "scalar", float(proto.scalar_value))
    if kind == "histogram":
        return Value(proto.tag, "histogram", _histogram(proto.histogram))
    if kind == "tensor":
        return Value(proto.tag, "tensor", _tensor_array(proto.tensor))
    if kind == "image":
        img = proto.image
        return Value(
            proto.tag,
            "image",
            ImageValue(img.height, img.width, img.colorspace, bytes(img.encoded_image)),
        )
    if kind == "loss_landscape":
        return Value(proto.tag, "landscape", proto.loss_landscape.SerializeToString())
    return None


class EventDecoder:
    """Payload bytes -> ``EventRecord``: the scalar fast path, else protobuf."""

    def __init__(self) -> None:
        self.scalars = wire.ScalarDecoder()
        self._event_cls: Any = None

    def decode(self, offset: int, payload: bytes) -> EventRecord:
        """Decode one payload; raises ``ValueError`` when it is not an Event."""
        fast = self.scalars.decode(payload)
        if fast is not None:
            step, wall, tags, vals = fast
            values = tuple(Value(t, "scalar", v) for t, v in zip(tags, vals, strict=True))
            return EventRecord(offset, wall, step, values)
        return self.decode_proto(offset, payload)

    def decode_proto(self, offset: int, payload: bytes) -> EventRecord:
        """Decode with protobuf (any Event MindSpore writes)."""
        if self._event_cls is None:
            from msmon_nb.events.schema import event_class

            self._event_cls = event_class()
        event = self._event_cls()
        try:
            event.MergeFromString(payload)
        except Exception as exc:  # protobuf raises several types on bad bytes
            raise ValueError(f"not a summary Event: {exc}") from exc
        what = event.WhichOneof("what")
        step = int(event.step) if event.HasField("step") else None
        if what == "summary":
            values = tuple(v for v in map(decode_value, event.summary.value) if v is not None)
            return EventRecord(offset, event.wall_time, step, values)
        if what == "version":
            return EventRecord(offset, event.wall_time, step, version=event.version)
        return EventRecord(offset, event.wall_time, step, has_graph=what == "graph_def")


class EventFileReader:
    """Iterate to get the ``EventRecord``s of one file added since the last iteration."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.records = RecordReader(path)
        self.decoder = EventDecoder()
        self._bad_events: list[Problem] = []

    @property
    def path(self) -> Path:
        """The file read."""
        return self.records.path

    @property
    def problems(self) -> list[Problem]:
        """Damaged spots found so far (framing and content)."""
        return self.records.problems + self._bad_events

    def __iter__(self) -> Iterator[EventRecord]:
        for offset, payload in self.records.records():
            try:
                yield self.decoder.decode(offset, payload)
            except ValueError as exc:
                problem = Problem(str(self.path), offset, str(exc))
                self._bad_events.append(problem)
                log.warning("msmon: undecodable summary record in %s", problem)


def read_events(path: str | os.PathLike[str]) -> EventFileReader:
    """A reader of ``path``: each iteration yields the records added since the previous one.

    >>> reader = read_events(path)
    >>> first = list(reader)      # everything so far
    >>> later = list(reader)      # only what was appended meanwhile
    """
    return EventFileReader(path)
