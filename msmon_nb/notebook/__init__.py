"""Notebook integration: the ``%msmonitor`` magics and the live panel."""

from __future__ import annotations

from typing import Any


def register(ipython: Any) -> None:
    """Register msmon_nb's magics with ``ipython`` (the magics arrive with the panel)."""
    ipython.user_ns.setdefault("_msmon_loaded", True)
