"""``Monitor``: one run, fed by any of the three ways in, feeding every output.

The three ways in -- ``mon.step(...)``, ``mon.callback()`` for ``Model.train`` and
``mon.watch()`` for unchanged functional loops -- all end in ``record_step``, so they
produce the same records. A step is *collected* when its index is a multiple of the
collection frequency; on other steps only a counter moves. What a collected step's
tensors are worth in numbers is collect's business (``collect.collector``): the Monitor
gets plain ``{tag: float}`` and passes it on with ``emit``.

Step boundaries are where the user can act on a running loop: pause, stop, checkpoint,
lr xF and the alert actions take effect there (the controls: ``monitor.steering``, which
``Monitor`` inherits). ``StopTraining`` (a ``BaseException``, so a user's ``except
Exception`` does not swallow it) ends a loop cleanly; ``watch()`` and the ``%%msmonitor``
magic absorb it and the run is marked ``stopped``.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from msmon_nb.collect.collector import StepCollector, expected_tags
from msmon_nb.collect.comm import attach
from msmon_nb.collect.guard import Guard
from msmon_nb.collect.rankinfo import detect
from msmon_nb.collect.recorder import StepInputs, StopTraining
from msmon_nb.collect.watch import Watch
from msmon_nb.config import ConfigError, MonitorConfig, check_tag
from msmon_nb.monitor import registry
from msmon_nb.monitor.actions import Actions
from msmon_nb.monitor.boundary import Boundary
from msmon_nb.monitor.levers import Levers
from msmon_nb.monitor.opening import close_marker, open_run
from msmon_nb.monitor.outlet import Outlet
from msmon_nb.monitor.rankwatch import RankWatcher
from msmon_nb.monitor.records import RunRecords
from msmon_nb.monitor.steering import Steering
from msmon_nb.rundir.control import ControlReader
from msmon_nb.rundir.facts import mindspore_brief
from msmon_nb.sinks.base import Fanout
from msmon_nb.sinks.factory import make_sinks

log = logging.getLogger(__name__)


class Monitor(Steering):
    """Monitor one training run (see the module docstring and docs/guide/python-api.md).

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
        self.alerts: list[Any] = []
        self.snapshots: list[dict[str, Any]] = []
        self.step_count = 0
        self.last_step: int | None = None
        self.status = "created"
        self.run_dir: Path | None = None  # the run (shared by all ranks of a job)
        self.write_dir: Path | None = None  # where this process writes: run_dir or rank_<k>/
        self.run_name: str | None = None
        self.ranks = detect()
        self.enabled = cfg.enable_monitor
        self._guard = Guard()  # one warning per fault, training goes on
        self.collector = StepCollector(cfg, self._guard)
        self.outlet = Outlet(self._guard)
        self.series = self.outlet.series  # the live series (the panel draws it)
        self.records = RunRecords(None, self.guard)  # alerts/snapshots.jsonl (none yet)
        self.boundary_state = Boundary(self._guard)  # the one paused/stopping state
        self._marker: dict[str, Any] = {}
        self._attach_reported = False
        self._actions: Actions | None = None
        self._rankwatch: RankWatcher | None = None
        self._callbacks: list[weakref.ref] = []  # the Model.train callbacks made here
        self.levers = Levers()  # what the loop trains: for checkpoint and lr xF
        if not self.enabled:
            # MindFormers' templates spell monitor_on: False out (their default): a YAML
            # copied from one turns everything off, which must not pass without a word
            self.warn_once(
                "disabled",
                "monitoring is off (enable_monitor: false, or MindFormers' monitor_on: "
                "False, its template's default): nothing is recorded and no run is "
                "written; set enable_monitor: true (monitor_on: True) to monitor",
            )
            return
        try:
            self._open()
        except OSError as exc:  # a read-only or missing disk must not stop training
            self.run_dir = None
            self.warn_once(
                "open",
                f"cannot create a run in {cfg.save_dir!r} ({exc.strerror or exc}; is it "
                "read-only or full?); curves stay live in the notebook but nothing is "
                "written to disk",
            )
        self.status = "running"
        self.collector.mark_start(restart=True)
        registry.opened(self)
        self._actions = Actions(self)
        self.outlet.observe = self._actions.observe
        self.outlet.can_hold = self._actions.can_wait

    def __repr__(self) -> str:
        run_dir = str(self.run_dir)
        return f"Monitor(run_dir={run_dir!r}, status={self.status!r}, steps={self.step_count})"

    # --- lifecycle ----------------------------------------------------------------------

    def _open(self) -> None:
        """The run on disk (``monitor.opening``), its outputs, the control file, and in a
        distributed job the cross-rank watcher (rank 0) and the all-reduce tap."""
        opened = open_run(self.config, self.ranks)
        self.run_dir, self.write_dir, self._marker = opened.run_dir, opened.write_dir, opened.marker
        self.run_name = self.run_dir.name
        rank = self.ranks.rank
        self.outlet.sinks = make_sinks(
            self.config.sink_types, self.write_dir, rank=rank, config=self.config
        )
        self.records = RunRecords(self.write_dir, self.guard)
        self.boundary_state.control = ControlReader(self.run_dir, rank)
        if self.ranks.distributed and rank == 0:
            self._rankwatch = RankWatcher(self).start()
        if self.ranks.distributed:  # all-reduce wait and local grad norm, whatever the loop
            self.collector.comm = attach(self)

    def close(self, status: str | None = None) -> None:
        """Flush and close every output; mark the run finished, stopped or interrupted."""
        if self.status not in ("running", "created"):
            return
        if status is None:
            status = "stopped" if self.boundary_state.stopped else "finished"
        self.status = status
        registry.closed(self)
        for ref in self._callbacks:  # a Model.train that raised never ran on_train_end
            callback = ref()
            if callback is not None:
                self.guard("unwrapping after Model.train", callback.close)
        if self._actions is not None:
            self.guard("unwrapping the optimizers", self._actions.close)
        if self.collector.comm is not None:
            self.guard("unwrapping the gradient all-reduce", self.collector.comm.uninstall)
        self._emit_late()  # the last collected step's device grad_norm
        self.outlet.release()
        self.outlet.sinks.close()
        failed = self.outlet.sinks.failed
        if self._rankwatch is not None:  # after our own records reached the disk
            self._rankwatch.close()
        if self.run_dir is None:
            return
        facts = dict(steps=self.step_count, last_step=self.last_step, alerts=len(self.alerts))
        try:
            close_marker(self.write_dir, self._marker, status, failed_outputs=failed, **facts)
        except OSError as exc:
            if failed:  # the same disk fault was already reported once
                log.debug("msmon: cannot update the marker of %s: %s", self.run_dir, exc)
            else:
                self.warn_once("marker", f"cannot update {self.run_dir}/msmon_run.json: {exc}")

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and issubclass(exc_type, StopTraining):
            self.boundary_state.stopped = True
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
        if optimizer is not None:
            self.trains(optimizer=optimizer)  # what checkpoint saves and lr xF scales
        if step is not None:
            self.step_count = int(step)
        self.collector.mark_start()
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
        self.record_step(inputs, collect=self.will_collect(self.step_count))
        self.boundary(raise_stop=True)

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
        """A ``mindspore.train.Callback`` that records ``Model.train`` (see the guide)."""
        from msmon_nb.collect.callback import MonitorCallback

        callback = MonitorCallback(self)
        self._callbacks.append(weakref.ref(callback))
        return callback

    def watch(self, names: Mapping[str, Any] | None = None):
        """Context manager that monitors an unchanged functional loop (see ``collect.watch``).

        ``names``: what to call each optimizer's series where two or more step in one
        iteration (a GAN's D and G): series name -> the optimizer, a train cell holding
        it, or the network it trains (``{"netd": optD, "netg": optG}``); else they are
        named after the code's variables (``collect.parts.derive_names``)."""
        return Watch(self, names)

    # --- the Recorder interface (collect/recorder.py): what the ways in call -----------

    def record_step(self, inputs: StepInputs, *, collect: bool, ended: float | None = None) -> None:
        """Count a finished step; on collected steps emit its scalars (``collect.collector``).
        ``ended``: when it ended, where that was before now (``collect.parts``)."""
        step = self.step_count
        self._emit_late()  # step >= s+1 was dispatched: s's device norm reads at once
        actions = self._actions
        if actions is not None and actions.skip_kinds:
            # before the step counts: the skip alert and a stop land on this step
            self.guard("checking for a skipped update", actions.after_update, step, collect)
        self.step_count = step + 1
        self.last_step = step
        values = self.collector.finish(inputs, step, collect, ended)
        if values is None:
            return
        first = None  # the per-layer judgement, before the rules see the step
        if actions is not None and actions.layers.on:
            first = actions.layer_values(step, values)
        self.outlet.emit(step, values, first)
        wider = self.collector.widened(self.collect_freq)
        if wider is not None and actions is not None:
            actions.widen_interval(step, wider)

    def part_values(self, inputs: StepInputs) -> dict[str, float]:
        """One optimizer's values of a step made of parts (``collect.parts``)."""
        return self.collector.part_values(inputs)

    def add_timing(self, data_secs: float, compute_secs: float) -> None:
        """Where the step's time went: waiting for the next batch, or computing."""
        self.collector.add_timing(data_secs, compute_secs)

    def mark_step_start(self, restart: bool = False) -> None:
        """Step time counts from now: for the first step, or always with ``restart``."""
        self.collector.mark_start(restart)

    def skip_gate(self) -> Any:
        """The ``collect.skip.SkipGate`` a way in puts before the optimizer update when
        ``alerts`` asks for ``action: skip``; None otherwise (or if it cannot be made)."""
        if self._actions is None or not self._actions.skip_kinds:
            return None
        return self.guard("making the skip gate", self._actions.skip_gate)

    @property
    def outputs(self) -> Fanout:
        """The outputs the run writes to (``sinks.base.Fanout``): a failing one is warned
        about once and dropped, the rest go on."""
        return self.outlet.sinks

    def guard(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run monitoring code ``fn(*args)``; on failure warn once and return None
        (training must not die; ``collect.guard``)."""
        return self._guard(what, fn, *args, **kwargs)

    def warn_once(self, key: str, message: str, stacklevel: int = 3) -> None:
        """One ``MonitorWarning`` per ``key``."""
        self._guard.warn_once(key, message, stacklevel)

    def attached(self, how: str) -> None:
        """A way in is active (``verbose`` prints where the run goes)."""
        if self.config.verbose and not self._attach_reported:
            self._attach_reported = True
            print(
                f"msmon: monitoring via {how} -> {self.run_dir} (every {self.collect_freq} "
                f"steps; {mindspore_brief()})"
            )

    def expected_tags(self) -> list[str]:
        """The scalar tags known before the first step (``collect.collector.expected_tags``):
        the panel builds its figure for them."""
        return expected_tags(self.config)

    # --- scalars to the series, the outputs and the rules --------------------------------

    def emit(self, step: int, values: Mapping[str, float]) -> None:
        """Scalars of ``step`` to the live series, every output and the rules
        (``monitor.outlet``): how the ways in, the actions and ``log`` record (one path,
        so nothing skips the rules)."""
        self.outlet.emit(step, values)

    def hold_emits(self, on: bool) -> None:
        """Let ``emit`` hold fast collected steps' scalars and pass them on in batches
        (``monitor.outlet``: for a way in where no user code reads the monitor between
        steps, the ``Model.train`` callback); off: what is held goes on now."""
        self.outlet.hold(on)

    def flush(self) -> None:
        """Push everything recorded so far to disk."""
        self.outlet.release()
        self.outlet.sinks.flush()

    def _emit_late(self) -> None:
        """The device grad_norm an earlier collected step launched, recorded at that step
        (``collect.devnorm``: read one step late so the read never stalls)."""
        late = self.collector.late()
        if late is not None:
            self.emit(*late)
