"""Minimal PNG encoding for image summaries (stdlib zlib, no Pillow in the write path)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_COLOR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG colour type


def to_uint8(image: np.ndarray) -> np.ndarray:
    """Scale an image to uint8 the way MindSpore does: [0, 1] floats x255, others min-max."""
    arr = np.asarray(image)
    if arr.dtype == np.uint8:
        return arr
    arr = arr.astype(np.float32)
    lo = float(np.min(arr)) if arr.size else 0.0
    hi = float(np.max(arr)) if arr.size else 0.0
    if lo >= 0 and hi <= 1:
        return (arr * 255).astype(np.uint8)
    scale = 255 / (hi - lo + 1) if hi != lo else 1.0
    return ((arr - lo) * scale).astype(np.uint8)


def hwc(image: np.ndarray) -> np.ndarray:
    """Normalise an image to (H, W, C) with C in 1..4; accepts HW, HWC and CHW."""
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    elif arr.ndim == 3 and arr.shape[-1] not in (1, 2, 3, 4) and arr.shape[0] in (1, 3, 4):
        arr = np.transpose(arr, (1, 2, 0))
    if arr.ndim != 3 or arr.shape[-1] not in (1, 2, 3, 4) or 0 in arr.shape:
        raise ValueError(
            f"image of shape {np.shape(image)} is not an image; pass (H, W), (H, W, C) or "
            "(C, H, W) with C in 1..4, e.g. an array of shape (28, 28)"
        )
    return arr


def encode_png(image: np.ndarray) -> tuple[int, int, int, bytes]:
    """(height, width, channels, PNG bytes) of an image."""
    arr = to_uint8(hwc(image))
    height, width, channels = arr.shape
    raw = b"".join(b"\x00" + arr[row].tobytes() for row in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", width, height, 8, _COLOR_TYPES[channels], 0, 0, 0)
    png = (
        _SIGNATURE
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )
    return height, width, channels, png


def decode_png(data: bytes) -> np.ndarray:
    """PNG bytes -> (H, W, C) uint8 array (any PNG, via Pillow, loaded lazily)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        arr = np.asarray(img)
    return arr[:, :, None] if arr.ndim == 2 else arr
