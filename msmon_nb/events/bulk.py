"""Vectorised decoding of scalar-only events, for loading long runs fast.

A writer repeats one event layout step after step: the same tags in the same order, so
the same payload length and the same bytes except the wall time, the step varint and
the float32 slots. Records of one length are stacked into a 2-D byte array; each row is
checked against the layout learnt from the first (every constant byte, the varint's
continuation bits), and the variable columns are reinterpreted as float64/varint/float32
in one numpy operation each. Rows that do not fit go back to the per-record decoder, so
correctness never depends on the guess.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from msmon_nb.events.wire import read_varint

_MAX_LAYOUTS_PER_LENGTH = 8


@dataclass(frozen=True)
class Layout:
    """Where the variable bytes of one scalar-event layout are."""

    length: int
    tags: tuple[str, ...]
    step_bytes: int
    float_at: np.ndarray  # payload offset of each tag's float32
    const_cols: np.ndarray
    const_vals: np.ndarray


def learn_layout(payload: bytes) -> Layout | None:
    """The layout of a scalar-only Event payload, or None for any other payload."""
    try:
        if payload[0] != 0x09 or payload[9] != 0x10:
            return None
        _, pos = read_varint(payload, 10)
        step_bytes = pos - 10
        if payload[pos] != 0x2A:
            return None
        size, pos = read_varint(payload, pos + 1)
        if pos + size != len(payload):
            return None
        tags: list[str] = []
        floats: list[int] = []
        while pos < len(payload):
            if payload[pos] != 0x0A:
                return None
            vlen, pos = read_varint(payload, pos + 1)
            vend = pos + vlen
            if payload[pos] != 0x0A:
                return None
            tlen, pos = read_varint(payload, pos + 1)
            tags.append(payload[pos : pos + tlen].decode("utf-8"))
            pos += tlen
            if payload[pos] != 0x1D or pos + 5 != vend:
                return None
            floats.append(pos + 1)
            pos = vend
    except (IndexError, ValueError, UnicodeDecodeError):
        return None
    if not tags:
        return None
    variable = np.zeros(len(payload), dtype=bool)
    variable[1:9] = True
    variable[10 : 10 + step_bytes] = True
    float_at = np.array(floats, dtype=np.intp)
    variable[(float_at[:, None] + np.arange(4)).ravel()] = True
    const_cols = np.nonzero(~variable)[0]
    const_vals = np.frombuffer(payload, dtype=np.uint8)[const_cols]
    return Layout(len(payload), tuple(tags), step_bytes, float_at, const_cols, const_vals)


@dataclass
class ScalarBlock:
    """Scalars of records sharing one layout: row i is record ``index[i]`` of the batch."""

    tags: tuple[str, ...]
    index: np.ndarray  # position of each row's record in the batch
    steps: np.ndarray  # int64
    walls: np.ndarray  # float64
    values: np.ndarray  # float32, shape (rows, len(tags))


def _decode_rows(rows: np.ndarray, layout: Layout) -> tuple[np.ndarray, ...]:
    n = layout.step_bytes
    varint = rows[:, 10 : 10 + n].astype(np.uint64)
    steps = np.zeros(len(rows), dtype=np.uint64)
    for i in range(n):
        steps |= (varint[:, i] & np.uint64(0x7F)) << np.uint64(7 * i)
    walls = np.ascontiguousarray(rows[:, 1:9]).view("<f8").reshape(-1)
    cols = (layout.float_at[:, None] + np.arange(4)).ravel()
    values = np.ascontiguousarray(rows[:, cols]).view("<f4").reshape(len(rows), -1)
    return steps.view(np.int64), walls.astype(np.float64), values.astype(np.float32)


def _fits(rows: np.ndarray, layout: Layout) -> np.ndarray:
    ok = (rows[:, layout.const_cols] == layout.const_vals).all(axis=1)
    n = layout.step_bytes
    if n > 1:
        ok &= (rows[:, 10 : 9 + n] >= 0x80).all(axis=1)
    ok &= rows[:, 9 + n] < 0x80
    return ok


def _rows(data: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """(len(starts), length) bytes; a strided view when records are evenly spaced."""
    if len(starts) > 1:
        gaps = np.diff(starts)
        if (gaps == gaps[0]).all() and gaps[0] >= length:
            return np.lib.stride_tricks.as_strided(
                data[starts[0] :], shape=(len(starts), length), strides=(int(gaps[0]), 1)
            )
    return data[starts[:, None] + np.arange(length)]


class BulkScalarDecoder:
    """Decode a batch of payloads into ``ScalarBlock``s plus the indices it could not take."""

    def __init__(self) -> None:
        self._layouts: dict[int, list[Layout]] = {}

    def decode(
        self, buf: bytes, starts: list[int], stops: list[int]
    ) -> tuple[list[ScalarBlock], np.ndarray]:
        """Blocks of scalar rows, and the batch indices left for the general decoder."""
        start_arr = np.asarray(starts, dtype=np.intp)
        lengths = np.asarray(stops, dtype=np.intp) - start_arr
        data = np.frombuffer(buf, dtype=np.uint8)
        blocks: list[ScalarBlock] = []
        rest: list[np.ndarray] = []
        for length in np.unique(lengths):
            idx = np.nonzero(lengths == length)[0]
            known = self._layouts.setdefault(int(length), [])
            tried = 0
            while idx.size:
                rows = _rows(data, start_arr[idx], int(length))
                placed = np.zeros(idx.size, dtype=bool)
                for layout in known:
                    fit = _fits(rows, layout) & ~placed
                    if fit.all():
                        steps, walls, values = _decode_rows(rows, layout)
                        blocks.append(ScalarBlock(layout.tags, idx, steps, walls, values))
                        placed |= fit
                    elif fit.any():
                        steps, walls, values = _decode_rows(rows[fit], layout)
                        blocks.append(ScalarBlock(layout.tags, idx[fit], steps, walls, values))
                        placed |= fit
                idx = idx[~placed]
                if not idx.size or tried >= _MAX_LAYOUTS_PER_LENGTH:
                    break
                tried += 1
                first = int(start_arr[idx[0]])
                layout = learn_layout(buf[first : first + int(length)])
                if layout is None:
                    rest.append(idx[:1])
                    idx = idx[1:]
                elif len(known) < _MAX_LAYOUTS_PER_LENGTH:
                    known.append(layout)
                else:
                    break
            if idx.size:
                rest.append(idx)
        left = np.sort(np.concatenate(rest)) if rest else np.zeros(0, dtype=np.intp)
        return blocks, left
