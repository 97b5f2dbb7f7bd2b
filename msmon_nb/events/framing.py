"""Record framing: ``<Q length><I masked crc(length)><payload><I masked crc(payload)>``.

Framing only; it takes any binary file-like object, so tests frame into ``io.BytesIO``.
All integers are little-endian, whatever the machine.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from msmon_nb.events.crc import masked_crc32c

HEADER = struct.Struct("<QI")
FOOTER = struct.Struct("<I")
HEADER_SIZE = HEADER.size  # 12
FOOTER_SIZE = FOOTER.size  # 4
OVERHEAD = HEADER_SIZE + FOOTER_SIZE

_LEN = struct.Struct("<Q")


def frame(payload: bytes) -> bytes:
    """The bytes of one record holding ``payload``."""
    length = _LEN.pack(len(payload))
    return b"".join(
        (
            length,
            FOOTER.pack(masked_crc32c(length)),
            payload,
            FOOTER.pack(masked_crc32c(payload)),
        )
    )


def write_record(file: BinaryIO, payload: bytes) -> int:
    """Append one framed record to ``file``; returns the bytes written."""
    data = frame(payload)
    file.write(data)
    return len(data)
