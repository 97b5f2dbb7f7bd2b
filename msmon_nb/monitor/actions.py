"""What a Monitor does when something is wrong: alerts, snapshots, stop, the debugger.

``Actions`` sits between the Monitor and ``diagnose``: each collected step's scalars go
through the ``Diagnoser`` and the ``break_on`` expression; each new alert is kept in
``monitor.alerts``, appended to ``alerts.jsonl``, logged once, and acted on as
``monitor_config.alerts`` says (``warn``, ``snapshot``, ``stop``, ``debug``, ``skip``,
``checkpoint``). Stop, debug and checkpoint wait for the step boundary, where the user's
loop can be ended cleanly, a debugger opened in the user's own frame with their tensors
in scope, or the state saved between two updates (an alert found on a late device
grad_norm arrives while the next step already ran). Each action that changes training
(stop, skip, checkpoint) is an intervention, recorded with ``who: alert action``.

``skip`` is decided before the step ends, by a ``collect.skip.SkipGate`` in front of the
optimizer's update (in the graph, or in Python for PyNative loops). This side keeps the
gate's limits current from the rules' running statistics on collected steps, reads after
each step whether the gate held an update back, and turns each skip into an alert, the
``train/skipped_steps`` series, and -- after ``max_skips_in_a_row`` -- a stop.
"""

from __future__ import annotations

import logging
import math
import pdb
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msmon_nb.collect.budget import widening_message
from msmon_nb.collect.snapshot import (
    DEFAULT_KEEP,
    DEFAULT_MAX_RAW,
    FlightRecorder,
    TensorSummary,
    activation_entries,
    named_tensors,
    params_and_grads,
    summarize,
)
from msmon_nb.config.cards import SEVERITY, SKIP_KINDS
from msmon_nb.diagnose import Diagnoser
from msmon_nb.diagnose.alert import Alert, fmt
from msmon_nb.expr import compile_expression
from msmon_nb.monitor.layers import LayerBlame
from msmon_nb.monitor.levers import recorded
from msmon_nb.monitor.records import ALERT_ACTION
from msmon_nb.rundir.control import CHECKPOINT, STOP

SKIPPED_TAG = "train/skipped_steps"

if TYPE_CHECKING:
    from msmon_nb.monitor import Monitor

log = logging.getLogger("msmon_nb")

_PACKAGE_DIRS = (str(Path(__file__).resolve().parents[1]),)  # msmon_nb/


class Actions:
    """Diagnosis, break_on and snapshots for one Monitor (see module docstring)."""

    def __init__(self, monitor: Monitor) -> None:
        cfg = monitor.config
        self.monitor = monitor
        self.diagnoser = Diagnoser(
            cfg.alerts, tracked=list(cfg.track_metrics), rank=monitor.ranks.label
        )
        self.break_on = compile_expression(cfg.break_on) if cfg.break_on else None
        snap = cfg.snapshot
        self.max_raw = int(snap.get("max_raw", DEFAULT_MAX_RAW))
        self.targets = list(snap.get("targets", cfg.param_targets))
        self.recorder = (
            FlightRecorder(int(snap.get("keep", DEFAULT_KEEP)), self.targets)
            if snap.get("on") == "alert"
            else None
        )
        monitor.collector.flight = self.recorder  # it keeps the steps before an alert
        self.pending_debug: str | None = None
        self.pending_checkpoint: Alert | None = None  # action: checkpoint, at the boundary
        settings = self.diagnoser.settings
        off = set(settings["disabled"])
        self.skip_kinds = [
            k for k in SKIP_KINDS if settings[k]["action"] == "skip" and k not in off
        ]
        self.max_skips = int(settings["max_skips_in_a_row"])
        self.gate: Any = None  # collect.skip.SkipGate, made when a way in asks for it
        self.skips_in_a_row = 0
        self.skipped_total = 0
        self.widened = False  # overhead_budget widened the interval once already
        # which layer started a gradient or loss alert; one layer rising alone
        self.layers = LayerBlame(cfg, monitor.warn_once)

    # --- per collected step ----------------------------------------------------------------

    def can_wait(self) -> bool:
        """Whether judging a step may wait a few steps (``Monitor.hold_emits``): every
        alert kind only warns (so none skips: no skip gate exists), and nothing needs
        the step's own tensors or boundary (no ``break_on``, no flight recorder)."""
        settings = self.diagnoser.settings
        return (
            self.break_on is None
            and self.recorder is None
            and all(
                entry.get("action", "warn") == "warn"
                for kind, entry in settings.items()
                if isinstance(entry, dict) and kind not in settings["disabled"]
            )
        )

    def observe(self, step: int, values: dict[str, float]) -> None:
        """Run the rules and ``break_on`` over one step's scalars."""
        for alert in self.diagnoser.update(step, values):
            self._on_alert(alert)
        if self.gate is not None:
            self.monitor.guard("refreshing the skip limits", self.refresh_limits)
        if self.break_on is not None and self.break_on.evaluate(step, values):
            self.pending_debug = f"break_on {self.break_on.text!r} holds at step {step}"

    # --- skip ------------------------------------------------------------------------------

    def skip_gate(self) -> Any:
        """The gate the ways in put in front of the optimizer; None when nothing skips."""
        if not self.skip_kinds:
            return None
        if self.gate is None:
            from msmon_nb.collect.skip import SkipGate

            kinds = self.skip_kinds
            loss = "loss_spike" in kinds
            if loss and self.monitor.ranks.distributed:
                # each rank judges its own loss: ranks would skip different steps and
                # their weights drift apart. The gradients are all-reduced, so the
                # grad_norm (and its NaN) is the same decision on every rank.
                loss = False
                self.monitor.warn_once(
                    "skip loss distributed",
                    "loss_spike: {action: skip} is off in a distributed job: each rank's "
                    "loss differs, so ranks would skip different updates and their weights "
                    "would drift apart; grad_explosion and nonfinite skips (on the "
                    "all-reduced gradients) stay on",
                )
            self.gate = SkipGate(
                nonfinite="nonfinite" in kinds,
                grad="grad_explosion" in kinds,
                loss=loss,
                local=not self.monitor.ranks.distributed,
            )
            self.refresh_limits()
        return self.gate

    def limits(self) -> tuple[float, float]:
        """(grad_norm limit, loss limit) for the next step, from the rules' state.

        grad_explosion: min(skip_above, ceiling, and -- with ``skip_relative`` -- the
        rule's own ``limit()``: factor x the running median of the last grad norms).
        loss_spike: the rule's ``limit()``, the bar it would judge the next loss by.
        Without history: +inf, so only skip_above and the ceiling act at the start.
        """
        settings = self.diagnoser.settings
        grad = loss = math.inf
        if "grad_explosion" in self.skip_kinds:
            params = settings["grad_explosion"]
            grad = min(params["skip_above"] or math.inf, params["ceiling"])
            rule = self.diagnoser.rule("grad_explosion") if params["skip_relative"] else None
            if rule is not None:
                grad = min(grad, rule.limit())
        if "loss_spike" in self.skip_kinds:
            rule = self.diagnoser.rule("loss_spike")
            if rule is not None:
                loss = rule.limit()
        return grad, loss

    def refresh_limits(self) -> None:
        """Write ``limits()`` into the gate (collected steps; nothing when unchanged)."""
        if self.gate is not None:
            self.gate.set_limits(*self.limits())

    def after_update(self, step: int, collect: bool) -> None:
        """After step ``step``'s update: did the gate skip it? Alert, count, maybe stop."""
        mon = self.monitor
        if self.gate is None:
            if self.skip_kinds:
                mon.warn_once(
                    "skip explicit",
                    f"alerts ask to skip bad updates ({', '.join(self.skip_kinds)}: action "
                    "skip), but this loop records with mon.step(...) after its update "
                    "already happened, so nothing can be skipped; use mon.watch() / "
                    "%%msmonitor or Model.train with mon.callback() to skip",
                )
            return
        event = self.gate.poll()
        if event is None:
            self.skips_in_a_row = 0
            if collect:
                mon.emit(step, {SKIPPED_TAG: float(self.skipped_total)})
            return
        self.skips_in_a_row += event.count
        self.skipped_total = event.total
        mon.emit(step, {SKIPPED_TAG: float(self.skipped_total)})
        self._on_skip(step, event)

    def _on_skip(self, step: int, event: Any) -> None:
        settings = self.diagnoser.settings
        kind = event.kind
        if kind == "loss_spike":
            tag, value = settings["loss_spike"]["tag"], event.loss
            why = f"loss {fmt(event.loss)} >= limit {fmt(event.loss_limit)}"
        elif kind == "nonfinite":
            tag, value = "train/grad_norm", event.grad_norm
            why = f"non-finite grad_norm {fmt(event.grad_norm)}"
            if event.loss is not None:
                tag, value = "train/loss", event.loss
                why = f"non-finite loss {fmt(event.loss)} (grad_norm {fmt(event.grad_norm)})"
        else:
            tag, value = settings["grad_explosion"]["tag"], event.grad_norm
            why = f"grad_norm {fmt(event.grad_norm)} >= limit {fmt(event.grad_limit)}"
        n, limit = self.skips_in_a_row, self.max_skips
        message = f"{why} at step {step}: update skipped ({n} in a row)"
        stop = n >= limit
        if stop:
            message += f"; {n} updates skipped in a row (limit {limit}): stopping the run"
        mon = self.monitor
        alert = Alert(step, kind, SEVERITY[kind], message, step, tag, value, mon.ranks.label)
        self._record_alert(alert, "skip")
        skipped = f"{kind}: {why}: update of step {step} skipped"
        mon.intervene("skip", kind, ALERT_ACTION, True, skipped, at=step)  # before it counts
        if stop:
            reason = f"{n} updates skipped in a row (limit {limit}): {why} at step {step}"
            mon.stop(reason)
            mon.intervene(STOP.name, kind, ALERT_ACTION, True, reason, at=step)

    def close(self) -> None:
        """The monitor closes: unwrap whatever still holds the skip gate."""
        if self.gate is not None:
            self.gate.release()

    def layer_values(self, step: int, values: dict[str, float]) -> Callable[[], None] | None:
        """``blame``, before the rules see collected step ``step``: keep its per-parameter
        gradient norms and update ratios (an alert on this step blames with them), judge
        them (``layer_rise``, whose alert goes out at once), and while a detail window is
        open add its per-parameter scalars to ``values``.

        What must read this step's Parameters (the update ratios, a detail window) is done
        now. The rest -- the ring row and the judgement -- is returned, to run when the
        step's scalars are passed on (``Monitor.emit``'s ``first``): with fast steps held,
        it runs for a batch of steps in a row, with its code and data in the caches. Done
        one step at a time right after a graph run, it cost 157 us a step on the overhead
        bench's ``Model.train`` MLP, where the same work in a tight loop costs 23 us."""
        collector, layers = self.monitor.collector, self.layers
        judge = None
        if collector.param_norms is not None:
            at, names, norms = collector.param_norms
            params = collector.last_params  # the update ratios are read from them now
            ratios = self.monitor.guard("measuring update ratios", layers.measure, names, params)
            judge = partial(self._judge_layers, at, names, norms, ratios)
        if layers.detail_until is None:
            return judge
        if judge is not None:  # the window's values come after this step's judgement
            judge()
        params = collector.last_params
        more = self.monitor.guard("recording per-parameter detail", layers.detail, step, params)
        values.update(more or {})
        return None

    def _judge_layers(self, at: int, names: Any, norms: Any, ratios: Any) -> None:
        """The ring row and ``layer_rise`` of collected step ``at`` (``layer_values``)."""
        guard, layers = self.monitor.guard, self.layers
        guard("keeping per-parameter norms", layers.keep, at, names, norms, ratios)
        found = guard("judging each layer", self.diagnoser.update_layers, at, names, norms, ratios)
        for alert in found or ():
            layers.remember(alert)
            self._on_alert(alert)

    def widen_interval(self, step: int, wider: int) -> None:
        """``overhead_budget`` widened the collection interval (``collect.budget``): the
        first time, a warning and an ``overhead_budget`` alert in the run say so; later
        widenings are logged."""
        mon = self.monitor
        before, mon.collect_freq = mon.collect_freq, wider
        budget = mon.collector.budget
        share = (budget.last_share if budget is not None else None) or 0.0
        if self.widened:
            log.info("msmon: collection interval widened to every %d steps", wider)
            return
        self.widened = True
        limit = mon.config.overhead_budget or 0.0
        message = widening_message(share, limit, step, before, wider)
        mon.warn_once("overhead_budget", message)
        alert = Alert(step, "overhead_budget", "warning", message, step, "", share)
        mon.alerts.append(alert)
        mon.records.alert(alert)

    def _record_alert(self, alert: Any, action: str) -> None:
        """Keep ``alert``, log it once, append it (with the action taken) to alerts.jsonl."""
        mon = self.monitor
        mon.alerts.append(alert)
        log.warning("msmon: %s", alert.message)
        mon.records.alert(alert, action=action)

    def _on_alert(self, alert: Any) -> None:
        mon = self.monitor
        action = self.diagnoser.action(alert.kind)
        if self.layers.wants(alert):
            judged = mon.guard(
                "naming the layer that started it",
                self.layers.judge,
                alert,
                self.monitor.collector.last_params,
            )
            alert = judged if judged is not None else alert
        # a rule's finding under action skip is reported like warn: the skips themselves
        # are decided by the gate, step by step, and reported by _on_skip
        self._record_alert(alert, "warn" if action == "skip" else action)
        if action == "snapshot":
            self.snapshot_for_alert(alert)
        elif action == "stop":
            mon.stop()
            message = f"{alert.kind}: {alert.message}"
            mon.intervene(STOP.name, alert.kind, ALERT_ACTION, True, message)
        elif action == "checkpoint":
            self.pending_checkpoint = alert
        elif action == "debug":
            self.pending_debug = f"{alert.kind}: {alert.message}"

    def checkpoint_for_alert(self, alert: Any) -> None:
        """``action: checkpoint``: save the state now (a step boundary), recorded as an
        intervention; a refusal (nothing known to save) is recorded and warned once."""
        mon = self.monitor
        try:
            saved = mon.checkpoint()
        except ValueError as exc:
            message = f"checkpoint refused: {exc}"
            mon.intervene(CHECKPOINT.name, alert.kind, ALERT_ACTION, False, message)
            mon.warn_once("checkpoint action", f"{alert.kind}: {message}")
            return
        message = f"{alert.kind}: {saved['message']}"
        mon.intervene(CHECKPOINT.name, alert.kind, ALERT_ACTION, True, message, **recorded(saved))

    # --- snapshots -------------------------------------------------------------------------

    def _last_tensors(self) -> tuple[list | None, Any]:
        """The last collected step's parameters and gradients (``collect.collector``)."""
        collector = self.monitor.collector
        return collector.last_params, collector.last_grads

    def snapshot_for_alert(self, alert: Any) -> None:
        """Write the flight recorder (steps before the alert) and the current tensors."""
        reason = f"alert:{alert.kind}"
        if self.recorder is not None:
            for step, items in self.recorder.take():
                self.write(step, items, f"{reason}:history")
        pairs = params_and_grads(*self._last_tensors(), self.targets)
        if pairs and (self.recorder is None or self.recorder.written_up_to != alert.step):
            self.write(alert.step, [summarize(n, t, self.max_raw) for n, t in pairs], reason)
        self.write_activations(reason)

    def snapshot(self, tensors: Any = None, step: int | None = None, reason: str = "manual"):
        """Summarise ``tensors`` (default: the watched parameters and their gradients,
        and each module's activation statistics when activations are tracked)."""
        mon = self.monitor
        pairs = named_tensors(tensors)
        acts: list[dict[str, Any]] = []
        if not pairs:
            pairs = params_and_grads(*self._last_tensors(), self.targets)
            acts = self.write_activations(reason)
        if not pairs and acts:
            return acts
        if not pairs:
            raise ValueError(
                "snapshot() has nothing to summarise: pass tensors, e.g. "
                "mm.snapshot({'fc1.weight': net.fc1.weight}), or call it inside a watched loop"
            )
        at = step if step is not None else (mon.last_step if mon.last_step is not None else 0)
        items = [summarize(name, tensor, self.max_raw) for name, tensor in pairs]
        self.write(int(at), items, reason)
        return [dict(item.to_dict(), step=int(at), reason=reason) for item in items] + acts

    def write_activations(self, reason: str) -> list[dict[str, Any]]:
        """Each module's activation statistics at their last collected step, listed in
        ``snapshots.jsonl`` and the panel's table (``collect.snapshot.activation_entries``);
        none when activations are not tracked."""
        mon = self.monitor
        entries = [dict(e, reason=reason) for e in activation_entries(mon.series)]
        for entry in entries:
            mon.records.snapshot(dict(entry, wall_time=time.time(), rank=mon.ranks.rank))
        mon.snapshots.extend(entries)
        return entries

    def write(self, step: int, items: list[TensorSummary], reason: str) -> None:
        """Events under snap/<name>/..., and one line per tensor in snapshots.jsonl."""
        mon = self.monitor
        wall = time.time()
        scalars = {f"snap/{it.name}/{k}": v for it in items for k, v in it.stats.items()}
        mon.outputs.scalars(step, wall, scalars)
        for item in items:
            mon.outputs.histogram(step, wall, f"snap/{item.name}/hist", item.hist)
            if item.raw is not None:
                mon.outputs.tensor(step, wall, f"snap/{item.name}/value", item.raw)
            entry = dict(
                item.to_dict(), step=step, reason=reason, wall_time=wall, rank=mon.ranks.rank
            )
            mon.records.snapshot(entry)
        mon.snapshots.extend(
            dict(it.to_dict(), step=step, reason=reason, histogram=it.hist) for it in items
        )

    # --- at the step boundary ----------------------------------------------------------------

    def pending(self) -> bool:
        """Whether an alert action waits for the step boundary (checkpoint, debugger)."""
        return self.pending_debug is not None or self.pending_checkpoint is not None

    def at_boundary(self) -> None:
        """Save the checkpoint an alert asked for; open the debugger in the user's frame
        if an alert or break_on asked for it."""
        if self.pending_checkpoint is not None:
            alert, self.pending_checkpoint = self.pending_checkpoint, None
            self.monitor.guard("saving the alert's checkpoint", self.checkpoint_for_alert, alert)
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

        _stop_in(Pdb(), frame)
        return
    _stop_in(pdb.Pdb(), frame)


def _stop_in(debugger: Any, frame: Any) -> None:
    """Stop at the next line of ``frame``. ``set_trace`` alone steps to the next line run
    anywhere: one in the boundary's remaining work (a control-file poll, the stat under
    it, a panel hook) would open the debugger there instead of in the user's loop."""
    # set_trace's last call, before tracing begins; the del is a statement, not a traced call
    debugger.set_step = lambda: debugger.set_next(frame)
    debugger.set_trace(frame)
    del debugger.set_step  # 's' in the session steps as usual
