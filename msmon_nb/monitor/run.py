"""``Monitor``: one run, fed by any of the three ways in, feeding every output.

The three ways in -- ``mon.step(...)``, ``mon.callback()`` for ``Model.train`` and
``mon.watch()`` for unchanged functional loops -- all end in ``_record_step``, so they
produce the same records. A step is *collected* when its index is a multiple of the
collection frequency; on other steps only a counter moves.

Step boundaries are where the user can act on a running loop: the panel's pause and
stop, and alert actions, take effect there. ``StopTraining`` (a ``BaseException``, so a
user's ``except Exception`` does not swallow it) ends a loop cleanly; ``watch()`` and the
``%%msmonitor`` magic absorb it and the run is marked ``stopped``.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from msmon_nb.collect.budget import OverheadBudget
from msmon_nb.collect.comm import attach
from msmon_nb.collect.devnorm import DeferredNorm
from msmon_nb.collect.optstate import OptimizerState, missing_optimizer_message
from msmon_nb.collect.rankinfo import detect, shared_run_name
from msmon_nb.collect.recorder import StepInputs, StopTraining
from msmon_nb.collect.tensors import to_float
from msmon_nb.collect.values import TAGS, step_values
from msmon_nb.collect.watch import Watch
from msmon_nb.config import ConfigError, MonitorConfig, MonitorWarning, check_tag
from msmon_nb.diagnose.alert import Alert
from msmon_nb.diagnose.pipeline import COMPUTE_TAG, DATA_TAG
from msmon_nb.metrics.series import SeriesStore
from msmon_nb.monitor.actions import Actions
from msmon_nb.monitor.batch import EmitBatch
from msmon_nb.monitor.controls import interpret
from msmon_nb.monitor.rankwatch import RankWatcher
from msmon_nb.monitor.records import RunRecords
from msmon_nb.rundir import (
    backup_config,
    claim_rank_dir,
    claim_run_dir,
    default_run_name,
    environment,
    write_marker,
)
from msmon_nb.rundir.control import ControlError, ControlReader
from msmon_nb.rundir.facts import mindspore_brief
from msmon_nb.sinks.base import Fanout
from msmon_nb.sinks.factory import make_sinks

log = logging.getLogger(__name__)

_OPEN: list[Monitor] = []


def active() -> Monitor | None:
    """The most recently opened monitor that is still open."""
    return _OPEN[-1] if _OPEN else None


def snapshot(tensors: Any = None, step: int | None = None, reason: str = "manual"):
    """``mon.snapshot(...)`` on the active monitor: handy from a breakpoint or debug console."""
    mon = active()
    if mon is None:
        raise ConfigError(
            "mm.snapshot(): no monitor is active; call it while a monitored loop runs "
            "(%%msmonitor cell, `with Monitor(...)`), or use mon.snapshot(...)"
        )
    return mon.snapshot(tensors, step=step, reason=reason)


_CRASHED: list[bool] = []


def _watch_for_crash() -> None:
    """Chain sys.excepthook once, so a monitor left open at exit knows whether it crashed."""
    if getattr(sys.excepthook, "_msmon", False):
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        _CRASHED.append(True)
        previous(exc_type, exc, tb)

    hook._msmon = True  # type: ignore[attr-defined]
    sys.excepthook = hook


@atexit.register
def _close_open_monitors() -> None:
    for mon in list(_OPEN):
        mon.close("interrupted" if _CRASHED else None)


class Monitor:
    """Monitor one training run (see the module docstring and README).

    Args:
        config: a ``MonitorConfig``, a dict, a YAML path, or None for defaults.
        **overrides: config fields to change, e.g. ``Monitor(save_dir="runs", log_interval=10)``.
    """

    def __init__(
        self, config: MonitorConfig | Mapping[str, Any] | str | Path | None = None, **overrides: Any
    ) -> None:
        cfg = MonitorConfig.coerce(config)
        if overrides:
            cfg = cfg.replace(**overrides)
        self.config = cfg
        self.collect_freq = cfg.log_interval
        self.series = SeriesStore()
        self.alerts: list[Any] = []
        self.snapshots: list[dict[str, Any]] = []
        self.step_count = 0
        self.last_step: int | None = None
        self.status = "created"
        self.run_dir: Path | None = None  # the run (shared by all ranks of a job)
        self.write_dir: Path | None = None  # where this process writes: run_dir or rank_<k>/
        self.run_name: str | None = None
        self.ranks = detect()
        self.paused = False
        self._stop_requested = False
        self._stop_reason: str | None = None
        self._stopped = False
        self._sinks = Fanout([])
        self._batch = EmitBatch()  # scalars held back (hold_emits)
        self.records = RunRecords(None, self._guard)  # alerts/snapshots.jsonl (none yet)
        self._control: ControlReader | None = None  # msmon ctl commands (rundir.control)
        self._boundary_hooks: list[Callable[[Monitor], None]] = []
        self._warned: set[str] = set()
        self._marker: dict[str, Any] = {}
        self._t_mark: float | None = None
        self._steps_since = 0
        self._samples_since = 0
        self._data_secs = 0.0  # summed since the last collected step, when the way in knows
        self._compute_secs = 0.0
        self._attach_reported = False
        self.enabled = cfg.enable_monitor
        self._actions: Any = None
        self._rankwatch: Any = None
        self._comm: Any = None  # collect.comm.CommTap in a distributed job
        self._optstate: Any = None  # collect.optstate.OptimizerState, made at first use
        self._late = DeferredNorm()  # a device grad_norm launched, read at the next step
        self._callbacks: list[weakref.ref] = []  # the Model.train callbacks made here
        self._budget = OverheadBudget(cfg.overhead_budget) if cfg.overhead_budget else None
        if self.enabled:
            try:
                self._open()
            except OSError as exc:  # a read-only or missing disk must not stop training
                self.run_dir = None
                self.status = "running"
                self._t_mark = time.perf_counter()
                _OPEN.append(self)
                self._warn_once(
                    "open",
                    f"cannot create a run in {cfg.save_dir!r} ({exc.strerror or exc}; is it "
                    "read-only or full?); curves stay live in the notebook but nothing is "
                    "written to disk",
                )
            self._actions = Actions(self)

    def __repr__(self) -> str:
        run_dir = str(self.run_dir)
        return f"Monitor(run_dir={run_dir!r}, status={self.status!r}, steps={self.step_count})"

    # --- lifecycle ----------------------------------------------------------------------

    def _open(self) -> None:
        cfg = self.config
        ranks = self.ranks
        if ranks.distributed:
            name = cfg.run_name or shared_run_name(cfg.model_name)
            self.run_dir, self.write_dir = claim_rank_dir(cfg.save_dir, name, ranks.rank)
        else:
            name = cfg.run_name or default_run_name(cfg.model_name)
            self.run_dir = self.write_dir = claim_run_dir(cfg.save_dir, name)
        self.run_name = self.run_dir.name
        if cfg.run_name and self.run_name != cfg.run_name:
            warnings.warn(
                f"msmon: run {cfg.run_name!r} already exists in {cfg.save_dir}; "
                f"writing to {self.run_name!r} instead, so runs never mix",
                MonitorWarning,
                stacklevel=3,
            )
        backup_config(self.write_dir, cfg.to_dict(), getattr(cfg, "_source", None))
        self._marker = {
            "run_name": self.run_name,
            "project_name": cfg.project_name,
            "status": "running",
            "start": time.time(),
            "rank": ranks.rank,
            "ranks": ranks.size,
            "config": cfg.to_dict(),
            **environment(),
        }
        write_marker(self.write_dir, self._marker)
        self._sinks = make_sinks(cfg.sink_types, self.write_dir, rank=ranks.rank, config=cfg)
        self.records = RunRecords(self.write_dir, self._guard)
        self._control = ControlReader(self.run_dir, ranks.rank)
        if ranks.distributed and ranks.rank == 0:
            self._rankwatch = RankWatcher(self).start()
        if ranks.distributed:  # all-reduce wait and local grad norm, whatever the loop
            self._comm = attach(self)
        self.status = "running"
        self._t_mark = time.perf_counter()
        _OPEN.append(self)
        _watch_for_crash()

    def close(self, status: str | None = None) -> None:
        """Flush and close every output; mark the run finished, stopped or interrupted."""
        if self.status not in ("running", "created"):
            return
        if status is None:
            status = "stopped" if self._stopped else "finished"
        self.status = status
        if self in _OPEN:
            _OPEN.remove(self)
        for ref in self._callbacks:  # a Model.train that raised never ran on_train_end
            callback = ref()
            if callback is not None:
                self._guard("unwrapping after Model.train", callback.release)
        if self._actions is not None:
            self._guard("unwrapping the optimizers", self._actions.close)
        if self._comm is not None:
            self._guard("unwrapping the gradient all-reduce", self._comm.uninstall)
        if self._late.pending is not None:  # the last collected step's device grad_norm
            self._record_late_norm()
        self._release_held()
        self._sinks.close()
        if self._rankwatch is not None:  # after our own records reached the disk
            self._rankwatch.close()
        if self.run_dir is None:
            return
        self._marker.update(
            status=status,
            end=time.time(),
            steps=self.step_count,
            last_step=self.last_step,
            alerts=len(self.alerts),
            failed_outputs=self._sinks.failed,
        )
        try:
            write_marker(self.write_dir, self._marker)
        except OSError as exc:
            if self._sinks.failed:  # the same disk fault was already reported once
                log.debug("msmon: cannot update the marker of %s: %s", self.run_dir, exc)
            else:
                self._warn_once("marker", f"cannot update {self.run_dir}/msmon_run.json: {exc}")

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and issubclass(exc_type, StopTraining):
            self._stopped = True
            self.close("stopped")
            return True
        self.close("interrupted" if exc_type is not None else None)
        return False

    # --- ways in ------------------------------------------------------------------------

    def step(
        self,
        loss: Any = None,
        grads: Any = None,
        lr: Any = None,
        batch_size: int | None = None,
        step: int | None = None,
        grad_norm: Any = None,
        params: Any = None,
        optimizer: Any = None,
        **metrics: float,
    ) -> None:
        """Record one training step (explicit form); MindSpore tensors, numpy or numbers.

        ``grads`` is any nesting of tensors (their global L2 norm is recorded), or pass
        ``grad_norm`` directly. ``params`` (e.g. ``net.trainable_params()``) enables
        ``param_stats``; ``optimizer`` (the ``nn.Optimizer`` the loop calls) enables
        ``optimizer_state``, read on collected steps only, so passing it every step costs
        nothing. Extra keyword arguments are scalars under their tag, e.g.
        ``mon.step(loss=l, **{"train/tokens_per_s": 1e4})``.
        """
        for tag in metrics:
            check_tag(tag, "mon.step() metric")
        if step is not None:
            self.step_count = int(step)
        if self._t_mark is None:
            self._t_mark = time.perf_counter()
        inputs = StepInputs(
            loss=loss,
            grads=grads,
            grad_norm=grad_norm,
            lr=lr,
            batch_size=batch_size,
            params=list(params) if params is not None else None,
            optimizer=optimizer,
            extra=metrics or None,
        )
        self._record_step(inputs, collect=self.will_collect(self.step_count))
        self._boundary(raise_stop=True)

    def log(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Record extra scalars (``{"val/f1": 0.81}``) at ``step`` (default: the last step)."""
        for tag in metrics:
            check_tag(tag, "mon.log() tag")
        at = step if step is not None else (self.last_step if self.last_step is not None else 0)
        values = {tag: float(v) for tag, v in metrics.items()}
        self.emit(int(at), values)

    def snapshot(
        self, tensors: Any = None, step: int | None = None, reason: str = "manual"
    ) -> list[dict[str, Any]]:
        """Record a step-level summary of ``tensors`` into the run and return it.

        ``tensors``: a dict name -> tensor, a list of Parameters, a Cell, or None for the
        watched optimizer's parameters and their last gradients. For each: shape, dtype,
        min, max, mean, std, norm, NaN/Inf counts, zero share, a histogram, and the raw
        values when small (``snapshot.max_raw`` elements, default 4096).
        """
        if self._actions is None:
            raise ConfigError("snapshot(): this monitor is disabled (enable_monitor: false)")
        return self._actions.snapshot(tensors, step=step, reason=reason)

    def callback(self):
        """A ``mindspore.train.Callback`` that records ``Model.train`` (see README)."""
        from msmon_nb.collect.callback import MonitorCallback

        callback = MonitorCallback(self)
        self._callbacks.append(weakref.ref(callback))
        return callback

    def watch(self):
        """Context manager that monitors an unchanged functional loop (see ``collect.watch``)."""
        return Watch(self)

    # --- controls -----------------------------------------------------------------------

    def set_collect_freq(self, n: int) -> None:
        """Collect every ``n``-th step from the next step on."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"collect frequency {n!r} must be a whole number >= 1, e.g. 10")
        self.collect_freq = n
        if self._budget is not None:  # the user's new interval is the new floor
            self._budget.reset()

    def will_collect(self, step: int) -> bool:
        """True when ``step`` is a collected step under the current frequency."""
        return self.enabled and step % self.collect_freq == 0

    def pause(self) -> None:
        """Hold the loop at the next step boundary until ``resume()`` or ``stop()``."""
        self.paused = True

    def resume(self) -> None:
        """Let a paused loop go on."""
        self.paused = False

    def stop(self, reason: str | None = None) -> None:
        """End the loop cleanly at the next step boundary; the run is marked stopped.

        ``reason`` (e.g. "10 updates skipped in a row (limit 10): ...") is printed, kept
        in the run's marker as ``stop_reason`` and carried by the ``StopTraining``.
        """
        self._stop_requested = True
        if reason is not None and self._stop_reason is None:
            self._stop_reason = reason
            self._marker["stop_reason"] = reason
            print(f"msmon: stopping: {reason}", flush=True)

    @property
    def stop_requested(self) -> bool:
        """True when a stop waits for the next step boundary."""
        return self._stop_requested

    def add_boundary_hook(self, hook: Callable[[Monitor], None]) -> None:
        """Call ``hook(monitor)`` at every step boundary (the panel processes UI events here)."""
        self._boundary_hooks.append(hook)

    def remove_boundary_hook(self, hook: Callable[[Monitor], None]) -> None:
        """Undo ``add_boundary_hook``."""
        if hook in self._boundary_hooks:
            self._boundary_hooks.remove(hook)

    # --- the Recorder interface (collect/recorder.py): what the ways in call -----------

    def record_step(self, inputs: StepInputs, *, collect: bool) -> None:
        """Count a finished step; on collected steps compute and emit its scalars."""
        self._record_step(inputs, collect)

    def add_timing(self, data_secs: float, compute_secs: float) -> None:
        """Where the step's time went: waiting for the next batch, or computing."""
        self._add_timing(data_secs, compute_secs)

    def mark_step_start(self, restart: bool = False) -> None:
        """Step time counts from now: for the first step, or always with ``restart``."""
        if restart:
            self._t_mark = time.perf_counter()
        else:
            self._mark_step_start()

    def boundary(self, raise_stop: bool) -> bool:
        """Run the step-boundary controls; True when the loop must stop."""
        return self._boundary(raise_stop)

    def skip_gate(self) -> Any:
        """The ``collect.skip.SkipGate`` a way in puts before the optimizer update when
        ``alerts`` asks for ``action: skip``; None otherwise (or if it cannot be made)."""
        if self._actions is None or not self._actions.skip_kinds:
            return None
        return self._guard("making the skip gate", self._actions.skip_gate)

    @property
    def outputs(self) -> Fanout:
        """The outputs the run writes to (``sinks.base.Fanout``): a failing one is warned
        about once and dropped, the rest go on."""
        return self._sinks

    def guard(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; on failure warn once and return None (training goes on)."""
        return self._guard(what, fn, *args)

    def warn_once(self, key: str, message: str) -> None:
        """One ``MonitorWarning`` per ``key``."""
        self._warn_once(key, message, stacklevel=4)

    def attached(self, how: str) -> None:
        """A way in is active (``verbose`` prints where the run goes)."""
        self._attached(how)

    # --- internals ----------------------------------------------------------------------

    def _attached(self, how: str) -> None:
        if self.config.verbose and not self._attach_reported:
            self._attach_reported = True
            print(
                f"msmon: monitoring via {how} -> {self.run_dir} (every {self.collect_freq} "
                f"steps; {mindspore_brief()})"
            )

    def _mark_step_start(self) -> None:
        if self._t_mark is None:
            self._t_mark = time.perf_counter()

    def _add_timing(self, data_secs: float, compute_secs: float) -> None:
        """Where the step's time went: waiting for the next batch, or computing."""
        self._data_secs += max(0.0, data_secs)
        self._compute_secs += max(0.0, compute_secs)

    def _record_step(self, inputs: StepInputs, collect: bool) -> None:
        """Count a finished step; on collected steps compute and emit its scalars."""
        step = self.step_count
        if self._late.pending is not None:  # step >= s+1 was dispatched: read s's norm
            self._record_late_norm()
        if self._actions is not None and self._actions.skip_kinds:
            # before the step counts: the skip alert and a stop land on this step
            self._guard("checking for a skipped update", self._actions.after_update, step, collect)
        self.step_count = step + 1
        self.last_step = step
        self._steps_since += 1
        self._samples_since += inputs.batch_size or self.config.batch_size or 0
        if not collect:
            return
        now = time.perf_counter()
        cpu = 0.0
        if self._budget is not None:
            if inputs.loss is not None:  # reading it waits for the step itself: not our cost
                loss = self._guard("reading the loss", to_float, inputs.loss)
                inputs = dataclasses.replace(inputs, loss=loss)
            cpu = time.thread_time()
        step_time = (now - self._t_mark) / self._steps_since if self._t_mark is not None else None
        samples = self._samples_since
        values = self._guard(
            "collecting step values",
            step_values,
            self.config,
            inputs,
            step,
            step_time,
            int(samples),
            self._late,
        )
        if values is not None and self.config.tracks("step_time") and self._compute_secs > 0:
            values[DATA_TAG] = self._data_secs / self._steps_since
            values[COMPUTE_TAG] = self._compute_secs / self._steps_since
        if values is not None and self._comm is not None:
            self._guard("recording the all-reduce wait", self._comm.add_values, values)
        self._t_mark = time.perf_counter()
        self._steps_since = 0
        self._samples_since = 0
        self._data_secs = self._compute_secs = 0.0
        if self._actions is not None and (inputs.params is not None or inputs.grads is not None):
            self._guard(
                "keeping step tensors", self._actions.tensors, step, inputs.params, inputs.grads
            )
        if values is None:
            return
        if self.config.tracks("optimizer_state"):
            values.update(self._optimizer_state(inputs.optimizer))
        if inputs.extra:
            values.update({tag: float(v) for tag, v in inputs.extra.items()})
        self.emit(step, values)
        if self._budget is not None:
            self._check_budget(step, cpu, step_time)

    def _record_late_norm(self) -> None:
        """Record the device grad_norm launched at an earlier collected step, at that
        step (``collect.devnorm``: read one step late so the read never stalls)."""
        got = self._guard("reading the device grad_norm", self._late.take)
        if got is not None:
            self.emit(got[0], {TAGS["grad_norm"]: got[1]})

    def _check_budget(self, step: int, started: float, step_time: float | None) -> None:
        """``overhead_budget``: double the interval when collecting costs too much
        (``collect.budget``); the first widening is reported once, as a warning and as
        an alert in the run. The cost is this thread's CPU time, so that time the OS
        gave to other processes (a shared machine) is not counted as ours."""
        cost = time.thread_time() - started
        wider = self._budget.observe(cost, step_time, self.collect_freq)
        if wider is None:
            return
        before, self.collect_freq = self.collect_freq, wider
        share = self._budget.last_share or 0.0
        if "overhead_budget" in self._warned:
            log.info("msmon: collection interval widened to every %d steps", wider)
            return
        message = (
            f"collecting costs {share:.1%} of training time (overhead_budget "
            f"{self.config.overhead_budget:.1%}), so from step {step} on it collects every "
            f"{wider} steps instead of every {before} (it widens again if still over; "
            "mon.set_collect_freq(n) sets a new floor)"
        )
        self._warn_once("overhead_budget", message)
        alert = Alert(step, "overhead_budget", "warning", message, step, "", share)
        self.alerts.append(alert)
        self.records.alert(alert)

    def _optimizer_state(self, optimizer: Any) -> dict[str, float]:
        """``param/<name>/<moment>_norm`` of a collected step (``collect.optstate``)."""
        if optimizer is None:
            self._warn_once("optimizer_state none", missing_optimizer_message())
            return {}
        if self._optstate is None:
            self._optstate = OptimizerState(self.config.param_targets, self._warn_once)
        return self._guard("reading the optimizer state", self._optstate.read, optimizer) or {}

    def expected_tags(self) -> list[str]:
        """The scalar tags this monitor will record that are known before the first step
        (the panel builds its figure for them): the tracked core metrics, the step-time
        split of watched loops and ``Model.train``, and the system metrics."""
        cfg = self.config
        tags = [tag for metric, tag in TAGS.items() if cfg.tracks(metric)]
        if cfg.tracks("step_time"):
            tags += [DATA_TAG, COMPUTE_TAG]
        if cfg.tracks("system"):
            from msmon_nb.collect.system import SYSTEM_TAGS

            tags += SYSTEM_TAGS
        return tags

    def emit(self, step: int, values: Mapping[str, float]) -> None:
        """Scalars of ``step`` to the live series, every output and the rules: how the
        ways in, the actions and ``log`` record (one path, so nothing skips the rules).
        Under ``hold_emits`` fast steps' scalars go on in batches, in order."""
        if not values:
            return
        wall = time.time()
        batch = self._batch
        if batch.on and batch.hold(step, wall, values):
            if batch.due():
                self._release_held()
            return
        self._pass_on([(step, wall, dict(values))])

    def hold_emits(self, on: bool) -> None:
        """Let ``emit`` hold the scalars of collected steps that come less than 20 ms
        apart and pass them on together once the oldest has waited 50 ms, or at a pause,
        a stop, ``flush`` or ``close`` (``monitor.batch`` says why: 517 -> 371 us of
        callback time a step on the bench MLP, ``bench/overhead.py --not-held``). For a
        way in where no user code reads the monitor between steps (the ``Model.train``
        callback). Not while an alert would act on the step it fires at (``snapshot``,
        ``stop``, ``debug``, ``skip``, ``break_on``, a flight recorder): then every step
        is judged as it ends. Off: what is held goes on now."""
        self._batch.on = on and (self._actions is None or self._actions.can_wait())
        if not self._batch.on:
            self._release_held()

    def _release_held(self) -> None:
        """Pass the held scalars on (``_pass_on``), if any."""
        items = self._batch.take()
        if items:
            self._pass_on(items)

    def _pass_on(self, items: list[tuple[int, float, dict[str, float]]]) -> None:
        """Scalars of one or more steps to the series, the outputs and the rules: each
        takes the whole list in turn (its code and data stay in the caches), the rules
        last, in step order."""
        for step, wall, values in items:
            self.series.add(step, wall, values)
        for step, wall, values in items:
            self._sinks.scalars(step, wall, values)
        if self._actions is not None:
            for step, _, values in items:
                self._guard("diagnosing", self._actions.observe, step, values)

    def _boundary(self, raise_stop: bool) -> bool:
        """Run the step-boundary controls; returns True when the loop must stop."""
        if self._actions is not None and self._actions.pending_debug is not None:
            self._actions.at_boundary()  # a debugger session is the user's: not guarded
        control = self._control
        if control is not None and control.due(time.monotonic()):  # ~0.1 us between polls
            self._guard("reading msmon ctl commands", self._obey)
        for hook in list(self._boundary_hooks):
            self._guard(f"boundary hook {getattr(hook, '__name__', hook)}", hook, self)
        batch = self._batch
        if batch.items and (self.paused or self._stop_requested or batch.due()):
            self._release_held()
        while self.paused and not self._stop_requested:
            if control is not None and control.due(time.monotonic()):
                self._guard("reading msmon ctl commands", self._obey)
            for hook in list(self._boundary_hooks):
                self._guard(f"boundary hook {getattr(hook, '__name__', hook)}", hook, self)
            time.sleep(0.05)
        if self._stop_requested:
            self._stop_requested = False
            self._stopped = True
            if raise_stop:
                why = f": {self._stop_reason}" if self._stop_reason else ""
                raise StopTraining(f"msmon: stopped at step {self.last_step}{why}")
            return True
        return False

    def _obey(self) -> None:
        """Apply the commands ``msmon ctl`` or the viewer appended to the run's control
        file (``rundir.control``), each acknowledged in the run dir."""
        assert self._control is not None
        for command in self._control.read():
            result = interpret(self, command.cmd, command.arg, source=command.source)
            self._control.ack(command, self.last_step, result.ok, result.message)

    def command(self, cmd: str, arg: Any = None, source: str = "") -> str:
        """Act on one control command (``rundir.control.SPECS``: pause, resume, stop,
        freq N, snapshot) through the one interpreter (``monitor.controls``); returns
        what was done, raises ``ControlError`` saying why when it is refused."""
        result = interpret(self, cmd, arg, source=source)
        if not result.ok:
            raise ControlError(result.message)
        return result.message

    def _guarded_finish(self, fn: Callable[[], None], raise_stop: bool) -> None:
        try:
            fn()
        except StopTraining:
            if raise_stop:
                raise

    def _guard(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run monitoring code; on failure warn once and carry on (training must not die)."""
        try:
            return fn(*args, **kwargs)
        except StopTraining:
            raise
        except Exception as exc:
            self._warn_once(what, f"{what} failed ({type(exc).__name__}: {exc}); training goes on")
            log.debug("msmon: %s failed", what, exc_info=True)
            return None

    def _warn_once(self, key: str, message: str, stacklevel: int = 3) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(f"msmon: {message}", MonitorWarning, stacklevel=stacklevel)

    def flush(self) -> None:
        """Push everything recorded so far to disk."""
        self._release_held()
        self._sinks.flush()
