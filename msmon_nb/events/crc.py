"""Masked CRC32C, the checksum every summary record carries twice.

The native ``crc32c`` package computes it in hardware (SSE4.2) or optimised C; the pure
table-driven fallback keeps reading and writing possible where that wheel is missing, at
about 1/200 of the speed. Both are tested against each other.
"""

from __future__ import annotations

MASK_DELTA = 0xA282EAD8
_POLY = 0x82F63B78  # Castagnoli, reflected


def _make_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _make_table()


def crc32c_pure(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C of ``data`` in pure Python (fallback and test oracle)."""
    table = _TABLE
    crc ^= 0xFFFFFFFF
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


try:
    from crc32c import crc32c

    NATIVE = True
except ImportError:  # pragma: no cover - exercised by forcing the fallback in tests
    crc32c = crc32c_pure
    NATIVE = False


def mask(crc: int) -> int:
    """Mask a CRC the way TFRecord/MindSpore do, so CRCs of CRCs stay strong."""
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """The checksum stored in summary records."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF
