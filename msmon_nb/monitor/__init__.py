"""The monitor: one run, fed by the ways in (``collect``), feeding the outputs.

``run``: ``Monitor`` (step counting, collection, controls, the outputs); ``actions``:
what it does about an alert (rules, ``break_on``, snapshots, stop, the debugger, skip);
``records``: the run's alerts and snapshot entries on disk, written through one path;
``rankwatch``: the cross-rank checks of a distributed job; ``registry``: the monitors
open in this process (``active()``, ``mm.snapshot()``); ``opening``: a new run on disk;
``outlet``: where scalars go (series, outputs, rules).
"""

from msmon_nb.collect.recorder import StopTraining
from msmon_nb.monitor.registry import active, snapshot
from msmon_nb.monitor.run import Monitor

__all__ = ["Monitor", "StopTraining", "active", "snapshot"]
