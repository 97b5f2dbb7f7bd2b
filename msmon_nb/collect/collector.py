"""``StepCollector``: a finished step's tensors in, the Monitor's plain scalars out.

The ways in hand over ``StepInputs`` (MindSpore tensors, numpy, numbers). Turning them
into numbers is collect's job, so the Monitor never touches a tensor and never calls
back into collect's value code: it gets ``{tag: float}`` per collected step and passes
it on. What is gathered here, all of it read only on collected steps:

- the step's own values (``collect.values.step_values``: loss, grad_norm, lr, ...);
- grad_norm launched on the device and read one step late (``collect.devnorm``), handed
  out by ``late()`` for the step it belongs to, so the read never stalls a step;
- step time and throughput since the previous collected step, and where that time went
  (waiting for data, or computing) when the way in knows;
- the optimizer's moment norms (``collect.optstate``), the selected weights' stable
  ranks every few collected steps (``collect.stablerank``) and the all-reduce wait
  (``collect.comm``, in a distributed job);
- each parameter's gradient norm (``param_norms``, for ``diagnose.blame``): taken from
  the squares the host path sums for grad_norm anyway, or as a graph tap measured them;
- ``overhead_budget``: this thread's CPU time spent on a collected step, from which
  ``collect.budget`` decides whether the interval must widen.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from msmon_nb.collect.budget import OverheadBudget
from msmon_nb.collect.devnorm import DeferredNorm
from msmon_nb.collect.guard import Guard
from msmon_nb.collect.optstate import OptimizerState, missing_optimizer_message
from msmon_nb.collect.recorder import StepInputs
from msmon_nb.collect.stablerank import StableRanks
from msmon_nb.collect.tensors import flatten_tensors, to_float, to_numpy
from msmon_nb.collect.values import TAGS, norm_on_device, param_names, step_values
from msmon_nb.config import COMPUTE_TAG, DATA_TAG, MonitorConfig
from msmon_nb.config.blame import resolve_blame
from msmon_nb.metrics.norms import sum_of_squares


def expected_tags(config: MonitorConfig) -> list[str]:
    """The scalar tags a run with ``config`` records that are known before its first step
    (the panel lays out its charts for them): the tracked core metrics, the step-time
    split of watched loops and ``Model.train``, and the system metrics."""
    tags = [tag for metric, tag in TAGS.items() if config.tracks(metric)]
    if config.tracks("step_time"):
        tags += [DATA_TAG, COMPUTE_TAG]
    if config.tracks("system"):
        from msmon_nb.collect.system import SYSTEM_TAGS

        tags += SYSTEM_TAGS
    return tags


class StepCollector:
    """Counts every step and computes the scalars of the collected ones (module docstring).

    ``guard`` is the run's ``collect.guard.Guard``: a failure here warns once and the
    value is left out (training goes on).
    """

    def __init__(self, config: MonitorConfig, guard: Guard) -> None:
        self.config = config
        self.comm: Any = None  # collect.comm.CommTap in a distributed job
        self.budget = OverheadBudget(config.overhead_budget) if config.overhead_budget else None
        self._guard = guard
        self._late = DeferredNorm()
        self._optstate: OptimizerState | None = None  # made at first use
        self.stable_ranks: StableRanks | None = None  # made at first use
        self._t_mark: float | None = None  # when the steps since the last collected began
        self._steps = 0  # since the last collected step
        self._samples = 0
        self._data_secs = 0.0  # summed since the last collected step, when the way in knows
        self._compute_secs = 0.0
        self._cpu_start = 0.0
        self._step_time: float | None = None  # of the last collected step
        # the last collected step's tensors, for snapshot() and the flight recorder
        self.last_params: list | None = None
        self.last_grads: Any = None
        self.flight: Any = None  # collect.snapshot.FlightRecorder (snapshot.on: alert)
        # (step, names, norms) of the last collected step, for the Monitor's NormRing
        self.param_norms: tuple[int, Sequence[str], np.ndarray] | None = None
        blame = resolve_blame(config.blame)
        self._per_param = bool(blame["enabled"]) and config.tracks("grad_norm")

    @property
    def optimizer_reads(self) -> int:
        """How many times the optimizer's moments were reduced (one per collected step)."""
        return self._optstate.reads if self._optstate is not None else 0

    def mark_start(self, restart: bool = False) -> None:
        """Step time counts from now: for the first step, or always with ``restart``."""
        if restart or self._t_mark is None:
            self._t_mark = time.perf_counter()

    def add_timing(self, data_secs: float, compute_secs: float) -> None:
        """Where the step's time went: waiting for the next batch, or computing."""
        self._data_secs += max(0.0, data_secs)
        self._compute_secs += max(0.0, compute_secs)

    def late(self) -> tuple[int, dict[str, float]] | None:
        """``(step, {grad_norm tag: value})`` of the device grad_norm an earlier collected
        step launched, read now (a later step was dispatched, so the read waits for
        nothing); None when none is pending or it could not be read."""
        if self._late.pending is None:
            return None
        got = self._guard("reading the device grad_norm", self._late.take)
        return None if got is None else (got[0], {TAGS["grad_norm"]: got[1]})

    def finish(
        self, inputs: StepInputs, step: int, collect: bool, ended: float | None = None
    ) -> dict[str, float] | None:
        """Count step ``step``; on a collected step return its scalars (None when they
        could not be computed, or on a step that is not collected). ``ended``: when the
        step ended (``perf_counter()``), where it is recorded later than that (a step
        of parts, ``collect.parts``); now by default."""
        self._steps += 1
        self._samples += inputs.batch_size or self.config.batch_size or 0
        if not collect:
            return None
        if self.budget is not None:
            if inputs.loss is not None:  # reading it waits for the step itself: not our cost
                loss = self._guard("reading the loss", to_float, inputs.loss)
                inputs = dataclasses.replace(inputs, loss=loss)
            self._cpu_start = time.thread_time()
        self.param_norms = None
        if self._per_param:
            got = self._guard("measuring each parameter's gradient norm", self._each, inputs, step)
            inputs = got if got is not None else inputs
        now = time.perf_counter() if ended is None else ended
        steps = self._steps
        step_time = (now - self._t_mark) / steps if self._t_mark is not None else None
        self._step_time = step_time
        values = self._guard(
            "collecting step values",
            step_values,
            self.config,
            inputs,
            step,
            step_time,
            self._samples,
            self._late,
        )
        if values is not None and self.config.tracks("step_time") and self._compute_secs > 0:
            values[DATA_TAG] = self._data_secs / steps
            values[COMPUTE_TAG] = self._compute_secs / steps
        if values is not None and self.comm is not None:
            self._guard("recording the all-reduce wait", self.comm.add_values, values)
        self._t_mark = time.perf_counter() if ended is None else ended
        self._steps = self._samples = 0
        self._data_secs = self._compute_secs = 0.0
        if inputs.params is not None or inputs.grads is not None:
            self._keep_tensors(step, inputs.params, inputs.grads)
        if values is None:
            return None
        if inputs.grads is None and inputs.param_norms is not None:
            self._graph_kinds()
        if self.config.tracks("optimizer_state"):
            values.update(self._optimizer_state(inputs.optimizer))
        if self.config.tracks("stable_rank"):
            values.update(self._stable_rank(inputs.params))
        if inputs.extra:
            values.update({tag: float(v) for tag, v in inputs.extra.items()})
        return values

    def part_values(self, inputs: StepInputs) -> dict[str, float]:
        """The ``train/...`` values of one optimizer's part of a step
        (``collect.parts``), as ``finish`` computes them from ``inputs``, without
        counting a step or timing one: no throughput, step time or global step, and a
        device grad_norm read at once."""
        values = self._guard(
            "collecting an optimizer's values", step_values, self.config, inputs, 0
        )
        if values is None:
            return {}
        for metric in ("global_step", "step_time", "throughput"):
            values.pop(TAGS[metric], None)
        if inputs.extra:
            values.update({tag: float(v) for tag, v in inputs.extra.items()})
        return values

    @property
    def per_param(self) -> bool:
        """Whether collected steps measure each parameter's gradient norm (``blame``)."""
        return self._per_param

    def _each(self, inputs: StepInputs, step: int) -> StepInputs:
        """Keep ``(step, names, norms)`` in ``param_norms``: as the way in measured them,
        or from ``grads`` on the host, where the squares are the ones grad_norm sums (so
        grad_norm is filled in from them, the same sum in the same order as
        ``step_values``' own, and nothing is computed twice). On the device path
        (``norm_on_device``) the host does not read the gradients: nothing is kept."""
        if inputs.param_norms is not None:
            # the way in's names as they are (the same list every step: the ring then
            # compares them by identity, not name by name)
            names, norms = inputs.param_norms
            self.param_norms = (step, names, np.asarray(norms, dtype=np.float64))
            return inputs
        if inputs.grads is None:
            return inputs
        leaves = flatten_tensors(inputs.grads)
        if not leaves or norm_on_device(leaves):
            return inputs
        squares = [sum_of_squares(to_numpy(g)) for g in leaves]
        scale = inputs.grad_scale
        norms = np.sqrt(np.array(squares, dtype=np.float64)) / scale
        self.param_norms = (step, param_names(inputs.params, len(leaves)), norms)
        if inputs.grad_norm is None:
            return dataclasses.replace(inputs, grad_norm=math.sqrt(sum(squares)) / scale)
        return inputs

    def widened(self, interval: int) -> int | None:
        """``overhead_budget``: after a collected step's values went on, the doubled
        interval when collecting costs too much (``collect.budget``), else None. The
        cost is this thread's CPU time since ``finish`` began timing, so time the OS gave
        to other processes (a shared machine) is not counted as ours."""
        if self.budget is None:
            return None
        cost = time.thread_time() - self._cpu_start
        return self.budget.observe(cost, self._step_time, interval)

    def _keep_tensors(self, step: int, params: list | None, grads: Any) -> None:
        """Remember a collected step's tensors (``snapshot()`` summarises them) and feed
        the flight recorder, which keeps the steps before an alert."""
        if params is not None:
            self.last_params = params
        if grads is not None:
            self.last_grads = grads
        if self.flight is not None:
            self._guard("keeping step tensors", self.flight.record, step, self.last_params, grads)

    def _graph_kinds(self) -> None:
        """Say once that a graph step's gradients give their norm only: they never reach
        the host, and the optimizer tap measures each one's norm alone."""
        config = self.config
        extra = [k for k in config.param_stat_kinds if k != "norm"]
        if extra and config.tracks("param_stats"):
            self._guard.warn_once(
                "param_stat_kinds graph",
                f"param_stat_kinds {extra} of the gradients are measured where the gradients "
                "reach Python (PyNative loops); inside this compiled step only each "
                "gradient's norm is (param/<name>/grad_norm). Weights and optimizer moments "
                "get every kind",
            )

    def _stable_rank(self, params: list | None) -> dict[str, float]:
        """``param/<name>/stable_rank`` and ``sigma_max`` on every
        ``stable_rank_every``-th collected step (``collect.stablerank``)."""
        if self.stable_ranks is None:
            config = self.config
            self.stable_ranks = StableRanks(
                config.stable_rank_selection, config.stable_rank_every, self._guard.warn_once
            )
        if not self.stable_ranks.due():
            return {}
        return self._guard("measuring stable ranks", self.stable_ranks.read, params) or {}

    def _optimizer_state(self, optimizer: Any) -> dict[str, float]:
        """``param/<name>/<moment>_norm`` of a collected step (``collect.optstate``)."""
        if optimizer is None:
            self._guard.warn_once("optimizer_state none", missing_optimizer_message())
            return {}
        if self._optstate is None:
            self._optstate = OptimizerState(
                self.config.param_targets, self._guard.warn_once, self.config.param_stat_kinds
            )
        return self._guard("reading the optimizer state", self._optstate.read, optimizer) or {}
