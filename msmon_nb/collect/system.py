"""System metrics: process RSS, host memory, CPU; device memory where the device reports it."""

from __future__ import annotations

import sys

import psutil

_PROC = psutil.Process()
_MB = 2**20
# always recorded; sys/device_mem_mb too where the device reports it
SYSTEM_TAGS = ("sys/rss_mb", "sys/host_mem_percent", "sys/cpu_percent")


def system_metrics() -> dict[str, float]:
    """``sys/...`` scalars for the current process and host."""
    mem = psutil.virtual_memory()
    values = (
        _PROC.memory_info().rss / _MB,
        float(mem.percent),
        float(_PROC.cpu_percent(interval=None)),
    )
    out = dict(zip(SYSTEM_TAGS, values, strict=True))
    device = _device_memory_mb()
    if device is not None:
        out["sys/device_mem_mb"] = device
    return out


def _device_memory_mb() -> float | None:
    ms = sys.modules.get("mindspore")
    if ms is None:
        return None
    try:
        if ms.get_context("device_target") == "CPU":
            return None  # the CPU backend reports no device allocator
        return float(ms.runtime.memory_allocated()) / _MB
    except (AttributeError, RuntimeError, ValueError):
        return None
