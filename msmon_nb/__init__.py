"""msmon_nb: live, in-notebook monitoring and debugging of MindSpore training.

``import msmon_nb`` stays light: MindSpore, IPython and matplotlib load only when a
feature that needs them is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "load_run": "msmon_nb.events",
    "load_runs": "msmon_nb.events",
    "read_events": "msmon_nb.events",
    "EventWriter": "msmon_nb.events",
    "Run": "msmon_nb.events",
    "Monitor": "msmon_nb.monitor",
    "StopTraining": "msmon_nb.monitor",
    "MonitorConfig": "msmon_nb.config",
    "ConfigError": "msmon_nb.config",
    "run_name_from": "msmon_nb.config",
    "global_norm": "msmon_nb.collect.graph",
    "snapshot": "msmon_nb.monitor",
    "last_run": "msmon_nb.notebook",
    "show": "msmon_nb.notebook",
}

if TYPE_CHECKING:
    from msmon_nb.collect.graph import global_norm  # noqa: F401
    from msmon_nb.config import ConfigError, MonitorConfig, run_name_from  # noqa: F401
    from msmon_nb.events import (  # noqa: F401 - re-exported lazily
        EventWriter,
        Run,
        load_run,
        load_runs,
        read_events,
    )
    from msmon_nb.monitor import Monitor, StopTraining, snapshot  # noqa: F401
    from msmon_nb.notebook import last_run, show  # noqa: F401

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'msmon_nb' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext msmon_nb``: register the msmon_nb magics."""
    from msmon_nb.notebook import register

    register(ipython)
