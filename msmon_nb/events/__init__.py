"""MindSpore summary files: schema, framing, writer, reader and run discovery.

Nothing here imports MindSpore, so reading, viewing and cleaning start fast.
"""

from msmon_nb.events.reader import EventRecord, Problem, Value, read_events
from msmon_nb.events.runs import Run, ScalarSeries, load_run, load_runs
from msmon_nb.events.wire import Histogram
from msmon_nb.events.writer import EventWriter, WriterError
from msmon_nb.rundir import find_run_dirs

__all__ = [
    "EventRecord",
    "EventWriter",
    "Histogram",
    "Problem",
    "Run",
    "ScalarSeries",
    "Value",
    "WriterError",
    "find_run_dirs",
    "load_run",
    "load_runs",
    "read_events",
]
