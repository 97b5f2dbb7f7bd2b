"""System metrics: process RSS, host memory, CPU; device memory where the device reports it."""

from __future__ import annotations

import sys

import psutil

_PROC = psutil.Process()
_MB = 2**20


def system_metrics() -> dict[str, float]:
    """``sys/...`` scalars for the current process and host."""
    mem = psutil.virtual_memory()
    out = {
        "sys/rss_mb": _PROC.memory_info().rss / _MB,
        "sys/host_mem_percent": float(mem.percent),
        "sys/cpu_percent": float(_PROC.cpu_percent(interval=None)),
    }
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
