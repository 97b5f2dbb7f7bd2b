"""Notebook integration: the ``%msmonitor`` magics, the live panel, ``show`` and ``last_run``.

IPython, ipywidgets and matplotlib are imported only when these are used.
"""

from __future__ import annotations

from typing import Any

from msmon_nb.notebook.session import SESSION
from msmon_nb.notebook.session import last_run as _last_run
from msmon_nb.notebook.session import show as _show


def register(ipython: Any) -> None:
    """Register msmon_nb's magics with ``ipython`` (called by ``%load_ext msmon_nb``)."""
    from msmon_nb.notebook.magics import MonitorMagics

    ipython.register_magics(MonitorMagics(ipython, SESSION))


def last_run():
    """The run written by the last ``%%msmonitor`` cell, or None."""
    return _last_run()


def show(run: Any, follow: bool = False, rank: int | None = None) -> Any:
    """The panel for any run on disk; see ``msmon_nb.notebook.session.show``."""
    return _show(run, follow=follow, rank=rank)
