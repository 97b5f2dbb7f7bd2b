"""Direct protobuf wire encoding of summary events, and the scalar fast-path decoder.

Inside a training process protobuf runs in pure Python (``import mindspore`` sets
``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``), where building a message costs tens of
microseconds per field. The wire format of the few messages we write is tiny, so we emit
the bytes ourselves, in field-number order, exactly as protobuf serializes them: tests
check the bytes equal ``mindspore.train.summary_pb2``'s ``SerializeToString()``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_U64_MASK = (1 << 64) - 1
_F32_MAX = float(np.finfo(np.float32).max)

# Field keys: (number << 3) | wire type (0 varint, 1 fixed64, 2 bytes, 5 fixed32).
_EV_WALL = b"\x09"
_EV_STEP = b"\x10"
_EV_VERSION = b"\x1a"
_EV_SUMMARY = b"\x2a"
_SUM_VALUE = b"\x0a"
_VAL_TAG = b"\x0a"
_VAL_SCALAR = b"\x1d"
_VAL_IMAGE = b"\x22"
_VAL_TENSOR = b"\x42"
_VAL_HISTOGRAM = b"\x4a"

VERSION = "MindSpore.Event:1"
# TensorBoard's Event shares field numbers 1, 2, 3 and 5 with MindSpore's; its scalar is
# Summary.Value.simple_value = 2 (float) where MindSpore has scalar_value = 3.
TF_VERSION = "brain.Event:2"
_VAL_TF_SIMPLE = b"\x15"


def varint(value: int) -> bytes:
    """Base-128 varint; negative int64 values take ten bytes as in protobuf."""
    value &= _U64_MASK
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(key: bytes, body: bytes) -> bytes:
    return key + varint(len(body)) + body


def f32(value: float) -> bytes:
    """``value`` as a little-endian float32, overflowing to +-inf like a numpy cast."""
    try:
        return _F32.pack(value)
    except OverflowError:
        return _F32.pack(float("inf") if value > 0 else float("-inf"))


def _event(wall_time: float, step: int | None, key: bytes, body: bytes) -> bytes:
    head = _EV_WALL + _F64.pack(wall_time)
    if step is not None:
        head += _EV_STEP + varint(step)
    return head + _len_field(key, body)


def version_event(wall_time: float, version: str = VERSION) -> bytes:
    """The first record of every summary file."""
    return _EV_WALL + _F64.pack(wall_time) + _len_field(_EV_VERSION, version.encode())


class ScalarPrefixes(dict):
    """tag -> the constant bytes that precede a scalar value of that tag in a Summary.

    A scalar Value is ``0a <len> 0a <taglen> <tag> 1d <float32>``: everything but the last
    four bytes depends only on the tag, so it is built once per tag.
    """

    def __init__(self, key: bytes = _VAL_SCALAR) -> None:
        super().__init__()
        self.key = key

    def __missing__(self, tag: str) -> bytes:
        raw = tag.encode("utf-8")
        value = _len_field(_VAL_TAG, raw) + self.key
        prefix = _SUM_VALUE + varint(len(value) + 4) + value
        self[tag] = prefix
        return prefix


_PREFIXES = ScalarPrefixes()
TF_PREFIXES = ScalarPrefixes(_VAL_TF_SIMPLE)


def scalar_event(
    step: int,
    wall_time: float,
    items: Iterable[tuple[str, float]],
    prefixes: ScalarPrefixes = _PREFIXES,
) -> bytes:
    """One Event holding a scalar Value per ``(tag, value)``, as SummaryRecord.record does.

    With ``prefixes=TF_PREFIXES`` the bytes are a TensorBoard ``Event`` instead.
    """
    summary = b"".join([prefixes[tag] + f32(value) for tag, value in items])
    return _event(wall_time, step, _EV_SUMMARY, summary)


@dataclass(frozen=True, slots=True)
class Histogram:
    """A histogram in MindSpore's layout: equal-width buckets over [min, max] of finite values."""

    buckets: tuple[tuple[float, float, int], ...]  # (left, width, count)
    nan_count: int = 0
    pos_inf_count: int = 0
    neg_inf_count: int = 0
    min: float = 0.0
    max: float = 0.0
    sum: float = 0.0
    count: int = 0

    @property
    def edges(self) -> np.ndarray:
        """Bucket edges (len(buckets) + 1 values)."""
        if not self.buckets:
            return np.zeros(0)
        left = np.array([b[0] for b in self.buckets], dtype=np.float64)
        width = np.array([b[1] for b in self.buckets], dtype=np.float64)
        return np.append(left, left[-1] + width[-1])

    @property
    def counts(self) -> np.ndarray:
        """Bucket counts."""
        return np.array([b[2] for b in self.buckets], dtype=np.int64)

    def as_json(self) -> dict[str, Any]:
        """What pages draw (``chart.js``'s ``histogramSVG``): edges, counts and totals
        (floats may be non-finite: ``metrics.jsonsafe.jsonable`` spells those out)."""
        return {
            "edges": self.edges.tolist(),
            "counts": self.counts.tolist(),
            "nan_count": self.nan_count,
            "pos_inf_count": self.pos_inf_count,
            "neg_inf_count": self.neg_inf_count,
            "min": self.min,
            "max": self.max,
            "count": self.count,
        }


def _histogram_body(h: Histogram) -> bytes:
    parts = []
    for left, width, count in h.buckets:
        bucket = b"\x09" + _F64.pack(left) + b"\x11" + _F64.pack(width) + b"\x18" + varint(count)
        parts.append(_len_field(b"\x0a", bucket))
    # MindSpore always sets the counts; min/max/sum only when finite values exist.
    parts.append(b"\x10" + varint(h.nan_count))
    parts.append(b"\x18" + varint(h.pos_inf_count))
    parts.append(b"\x20" + varint(h.neg_inf_count))
    if h.count - h.nan_count - h.pos_inf_count - h.neg_inf_count > 0:
        parts.append(b"\x29" + _F64.pack(h.max))
        parts.append(b"\x31" + _F64.pack(h.min))
        parts.append(b"\x39" + _F64.pack(h.sum))
    parts.append(b"\x40" + varint(h.count))
    return b"".join(parts)


# numpy dtype -> MindSpore DataType number (anf_ir.proto)
DTYPE_CODES: dict[str, int] = {
    "bool": 1,
    "int8": 2,
    "int16": 3,
    "int32": 4,
    "int64": 5,
    "uint8": 6,
    "uint16": 7,
    "uint32": 8,
    "uint64": 9,
    "float16": 10,
    "float32": 11,
    "float64": 12,
}
DTYPE_NAMES: dict[int, str] = {v: k for k, v in DTYPE_CODES.items()}


def _tensor_body(array: np.ndarray) -> bytes:
    """TensorProto as MindSpore writes it: dims unpacked, every dtype in packed float_data."""
    code = DTYPE_CODES.get(array.dtype.name)
    if code is None:
        raise TypeError(
            f"tensor dtype {array.dtype} cannot be stored in a summary; "
            f"use one of {', '.join(DTYPE_CODES)}"
        )
    dims = b"".join(b"\x08" + varint(d) for d in array.shape)
    data = np.ascontiguousarray(array, dtype="<f4").tobytes()
    floats = _len_field(b"\x1a", data) if data else b""
    return dims + b"\x10" + varint(code) + floats


def _image_body(height: int, width: int, colorspace: int, encoded: bytes) -> bytes:
    return (
        b"\x08"
        + varint(height)
        + b"\x10"
        + varint(width)
        + b"\x18"
        + varint(colorspace)
        + _len_field(b"\x22", encoded)
    )


def _value(tag: str, key: bytes, body: bytes) -> bytes:
    return _len_field(_SUM_VALUE, _len_field(_VAL_TAG, tag.encode("utf-8")) + _len_field(key, body))


def histogram_value(tag: str, h: Histogram) -> bytes:
    """A Summary.Value holding a histogram."""
    return _value(tag, _VAL_HISTOGRAM, _histogram_body(h))


def tensor_value(tag: str, array: np.ndarray) -> bytes:
    """A Summary.Value holding a tensor."""
    return _value(tag, _VAL_TENSOR, _tensor_body(array))


def image_value(tag: str, height: int, width: int, colorspace: int, encoded: bytes) -> bytes:
    """A Summary.Value holding a PNG-encoded image."""
    return _value(tag, _VAL_IMAGE, _image_body(height, width, colorspace, encoded))


def scalar_value(tag: str, value: float) -> bytes:
    """A Summary.Value holding a scalar."""
    return _PREFIXES[tag] + f32(value)


def summary_event(step: int, wall_time: float, values: Sequence[bytes]) -> bytes:
    """An Event whose Summary holds the encoded ``values``."""
    return _event(wall_time, step, _EV_SUMMARY, b"".join(values))


# --- decoding -------------------------------------------------------------------------


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Decode a varint at ``pos``; returns (value, next position). Raises IndexError at EOF."""
    result = 0
    shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_Layout = tuple[struct.Struct, tuple[bytes, ...], tuple[str, ...]]
ScalarEvent = tuple[int, float, tuple[str, ...], tuple[float, ...]]


class ScalarDecoder:
    """Decode Events that hold only scalar Values, without protobuf.

    Returns None for anything else, so the caller falls back to the general decoder.
    Events from one writer repeat the same tags in the same order; their Summary bytes
    differ only in the float32 slots. Each such layout is learnt once and then decoded with
    one ``struct.unpack`` and one tuple comparison, whatever the number of tags.
    """

    def __init__(self) -> None:
        self._layouts: dict[int, list[_Layout]] = {}

    def decode(self, payload: bytes) -> ScalarEvent | None:
        """(step, wall_time, tags, values) of a scalar-only Event, or None."""
        try:
            if payload[0] != 0x09 or payload[9] != 0x10:
                return None
            wall = _F64.unpack_from(payload, 1)[0]
            step, pos = read_varint(payload, 10)
            if payload[pos] != 0x2A:
                return None
            size, pos = read_varint(payload, pos + 1)
        except (IndexError, ValueError):
            return None
        if pos + size != len(payload):
            return None
        summary = payload[pos:]
        for st, consts, tags in self._layouts.get(size, ()):
            fields = st.unpack(summary)
            if fields[0::2] == consts:
                return _signed(step), wall, tags, fields[1::2]
        learnt = self._learn(summary)
        if learnt is None:
            return None
        st, consts, tags = learnt
        self._layouts.setdefault(size, []).append(learnt)
        return _signed(step), wall, tags, st.unpack(summary)[1::2]

    @staticmethod
    def _learn(summary: bytes) -> _Layout | None:
        fmt = ["<"]
        consts: list[bytes] = []
        tags: list[str] = []
        pos = 0
        end = len(summary)
        try:
            while pos < end:
                start = pos
                if summary[pos] != 0x0A:
                    return None
                vlen, pos = read_varint(summary, pos + 1)
                vend = pos + vlen
                if summary[pos] != 0x0A:
                    return None
                tlen, pos = read_varint(summary, pos + 1)
                tag = summary[pos : pos + tlen].decode("utf-8")
                pos += tlen
                if summary[pos] != 0x1D or pos + 5 != vend:
                    return None
                pos += 1
                consts.append(summary[start:pos])
                tags.append(tag)
                fmt.append(f"{pos - start}sf")
                pos += 4
        except (IndexError, ValueError, UnicodeDecodeError):
            return None
        if pos != end or not tags:
            return None
        return struct.Struct("".join(fmt)), tuple(consts), tuple(tags)
