"""What a Monitor does when something is wrong: alerts, snapshots, stop, the debugger.

``Actions`` sits between the Monitor and ``diagnose``: each collected step's scalars go
through the ``Diagnoser`` and the ``break_on`` expression; each new alert is kept in
``monitor.alerts``, appended to ``alerts.jsonl``, logged once, and acted on as
``monitor_config.alerts`` says (``warn``, ``snapshot``, ``stop``, ``debug``). Stop and
debug wait for the step boundary, where the user's loop can be ended cleanly or a
debugger opened in the user's own frame, with their tensors in scope.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msmon_nb.collect.snapshot import (
    DEFAULT_KEEP,
    DEFAULT_MAX_RAW,
    FlightRecorder,
    TensorSummary,
    named_tensors,
    params_and_grads,
    summarize,
)
from msmon_nb.events.runs import ALERTS, SNAPSHOTS

if TYPE_CHECKING:
    from msmon_nb.monitor import Monitor

log = logging.getLogger("msmon_nb")

_PACKAGE_DIRS = (str(Path(__file__).resolve().parent),)


def append_jsonl(path: Path, item: dict[str, Any]) -> None:
    """Append one JSON line (written whole, so readers never see half an object)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(item, default=float) + "\n")


class Actions:
    """Diagnosis, break_on and snapshots for one Monitor (see module docstring)."""

    def __init__(self, monitor: Monitor) -> None:
        from msmon_nb.diagnose import Diagnoser
        from msmon_nb.expr import compile_expression

        cfg = monitor.config
        self.monitor = monitor
        rank = monitor.ranks.rank if monitor.ranks.distributed else None
        self.diagnoser = Diagnoser(cfg.alerts, tracked=list(cfg.track_metrics), rank=rank)
        self.break_on = compile_expression(cfg.break_on) if cfg.break_on else None
        snap = cfg.snapshot
        self.max_raw = int(snap.get("max_raw", DEFAULT_MAX_RAW))
        self.targets = list(snap.get("targets", cfg.param_targets))
        self.recorder = (
            FlightRecorder(int(snap.get("keep", DEFAULT_KEEP)), self.targets)
            if snap.get("on") == "alert"
            else None
        )
        self.last_params: list | None = None
        self.last_grads: Any = None
        self.pending_debug: str | None = None

    # --- per collected step ----------------------------------------------------------------

    def tensors(self, step: int, params: list | None, grads: Any) -> None:
        """Remember this step's tensors (for ``snapshot()``) and feed the flight recorder."""
        if params is not None:
            self.last_params = params
        if grads is not None:
            self.last_grads = grads
        if self.recorder is not None:
            self.recorder.record(step, params or self.last_params, grads)

    def observe(self, step: int, values: dict[str, float]) -> None:
        """Run the rules and ``break_on`` over one step's scalars."""
        for alert in self.diagnoser.update(step, values):
            self._on_alert(alert)
        if self.break_on is not None and self.break_on.evaluate(step, values):
            self.pending_debug = f"break_on {self.break_on.text!r} holds at step {step}"

    def _on_alert(self, alert: Any) -> None:
        mon = self.monitor
        mon.alerts.append(alert)
        log.warning("msmon: %s", alert.message)
        if mon.write_dir is not None:
            data = alert.to_dict()
            data["wall_time"] = time.time()
            mon.guard("writing alerts.jsonl", append_jsonl, mon.write_dir / ALERTS, data)
        action = self.diagnoser.action(alert.kind)
        if action == "snapshot":
            self.snapshot_for_alert(alert)
        elif action == "stop":
            mon.stop()
        elif action == "debug":
            self.pending_debug = f"{alert.kind}: {alert.message}"

    # --- snapshots -------------------------------------------------------------------------

    def snapshot_for_alert(self, alert: Any) -> None:
        """Write the flight recorder (steps before the alert) and the current tensors."""
        reason = f"alert:{alert.kind}"
        if self.recorder is not None:
            for step, items in self.recorder.take():
                self.write(step, items, f"{reason}:history")
        pairs = params_and_grads(self.last_params, self.last_grads, self.targets)
        if pairs and (self.recorder is None or self.recorder.written_up_to != alert.step):
            self.write(alert.step, [summarize(n, t, self.max_raw) for n, t in pairs], reason)

    def snapshot(self, tensors: Any = None, step: int | None = None, reason: str = "manual"):
        """Summarise ``tensors`` (default: the watched parameters and their gradients)."""
        mon = self.monitor
        pairs = named_tensors(tensors)
        if not pairs:
            pairs = params_and_grads(self.last_params, self.last_grads, self.targets)
        if not pairs:
            raise ValueError(
                "snapshot() has nothing to summarise: pass tensors, e.g. "
                "mm.snapshot({'fc1.weight': net.fc1.weight}), or call it inside a watched loop"
            )
        at = step if step is not None else (mon.last_step if mon.last_step is not None else 0)
        items = [summarize(name, tensor, self.max_raw) for name, tensor in pairs]
        self.write(int(at), items, reason)
        return [dict(item.to_dict(), step=int(at), reason=reason) for item in items]

    def write(self, step: int, items: list[TensorSummary], reason: str) -> None:
        """Events under snap/<name>/..., and one line per tensor in snapshots.jsonl."""
        mon = self.monitor
        wall = time.time()
        scalars = {f"snap/{it.name}/{k}": v for it in items for k, v in it.stats.items()}
        mon._sinks.scalars(step, wall, scalars)
        for item in items:
            mon._sinks.histogram(step, wall, f"snap/{item.name}/hist", item.hist)
            if item.raw is not None:
                mon._sinks.tensor(step, wall, f"snap/{item.name}/value", item.raw)
            if mon.write_dir is not None:
                entry = dict(
                    item.to_dict(), step=step, reason=reason, wall_time=wall, rank=mon.ranks.rank
                )
                mon.guard("writing snapshots.jsonl", append_jsonl, mon.write_dir / SNAPSHOTS, entry)
        mon.snapshots.extend(
            dict(it.to_dict(), step=step, reason=reason, histogram=it.hist) for it in items
        )

    # --- at the step boundary ----------------------------------------------------------------

    def at_boundary(self) -> None:
        """Open the debugger in the user's frame if an alert or break_on asked for it."""
        if self.pending_debug is None:
            return
        reason, self.pending_debug = self.pending_debug, None
        open_debugger(reason, user_frame())


def user_frame():
    """The innermost frame outside msmon_nb and MindSpore: the user's training loop."""
    import mindspore

    skip = (*_PACKAGE_DIRS, str(Path(mindspore.__file__).resolve().parent))
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename[:1] != "<":  # real files may be reached through symlinks
            filename = str(Path(filename).resolve())
        if not filename.startswith(skip):
            return frame
        frame = frame.f_back
    return sys._getframe(1)


def open_debugger(reason: str, frame: Any) -> None:
    """Stop in ``frame`` with the debugger that fits: VSCode's, IPython's, or pdb."""
    print(
        f"msmon: {reason}\nmsmon: debugger opened in your loop; inspect your tensors "
        "(e.g. mm.snapshot(...)), then 'c' to continue",
        flush=True,
    )
    debugpy = sys.modules.get("debugpy")
    if debugpy is not None and debugpy.is_client_connected():
        debugpy.breakpoint()
        return
    shell = None
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        pass
    if shell is not None and getattr(shell, "kernel", None) is not None:
        from IPython.core.debugger import Pdb

        Pdb().set_trace(frame)
        return
    import pdb

    pdb.Pdb().set_trace(frame)
