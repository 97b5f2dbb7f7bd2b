"""``mon.watch()``: monitor an unchanged MindSpore loop, built before or after it began.

While active it replaces, class- or module-level (so existing objects see it), the ways
in that ``collect.hooks`` finds in the installed MindSpore:

* the PyNative forward pass and backward of ``value_and_grad``/``grad`` functions: the
  loss, the batch size (first argument) and the gradients before any clipping;
* ``nn.Optimizer.__call__``: the learning rate, read just before the update, and the
  gradients the optimizer receives; a top-level optimizer call ends a step;
* ``nn.Cell.__call__`` for top-level calls only: a train cell driven by hand
  (``TrainOneStepCell``, ``TrainOneStepWithLossScaleCell``, any Cell holding an
  optimizer) is one step, its output the loss, and its time is framework time;
* ``nn.DistributedGradReducer.__call__``: in data parallel, the all-reduced gradients;
* ``_JitExecutor.__call__``: a step compiled with ``mindspore.jit``. Its insides are a
  graph, so at the first one ``collect.graph.OptimizerTap`` wraps every optimizer
  class's ``construct`` and drops the compiled phases: the step compiles again (once)
  with the wrapper, which stores the gradients' global norm and the lr in Parameters
  read on collected steps;
* ``Model.train``/``fit``/``eval`` (when ``use_callback`` is on): the monitor's callback
  is added, and the hooks above stay quiet inside.

Without optimizer calls seen from Python (a jit step, a hand-written update) each grad
function or jit step call is one step, finished when the next begins or the watch ends.

Step time is split into *data* (from the end of a step to the first framework call of
the next: the user's batch loading) and *compute* (from there to the step's end), so
framework work -- a train cell's forward pass included -- never counts as waiting.

A way in that is missing in this MindSpore, or cannot be replaced, is reported in one
``MonitorWarning`` naming what is not observed; the loop runs and ``mon.step`` works.
Everything replaced is restored on exit, also after an exception. On steps that are not
collected the hooks keep no tensors and read nothing from the device.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from msmon_nb.collect.recorder import Recorder, StopTraining
from msmon_nb.collect.tensors import batch_size_of, flatten_tensors
from msmon_nb.collect.values import read_global_step, read_lr

log = logging.getLogger(__name__)

_ACTIVE: list[Watch] = []

FIX = (
    "one-line fix: return it from your step, e.g. `return loss, mm.global_norm(grads)`, "
    "or record it with mon.step(grad_norm=...)"
)


class WatchError(RuntimeError):
    """``watch()`` cannot start (another watch is active)."""


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, tuple | list) and value else value


class Watch:
    """Context manager returned by ``Monitor.watch()``."""

    def __init__(self, recorder: Recorder) -> None:
        self.monitor = recorder
        self._saved: list[tuple[Any, str, Any, bool]] = []
        self.tap: Any = None
        self._tap_before = 0
        self._tap_why: str | None = None
        self._train_cells: dict[int, bool] = {}
        self._recompiled_cells: list[Any] = []
        self._reset()
        self.opt_seen = False  # steps end at optimizer (or train cell) returns
        self.pending = False  # a step began that has not been recorded yet
        self.collect = False
        self._depth = 0  # nesting of framework calls we hooked: 0 = the user's code
        self._in_opt = 0
        self._in_forward = 0
        self._in_model = 0
        self._opt_calls = 0
        self._callback: Any = None
        self._t_first: float | None = None
        self._t_end: float | None = None
        self.batch_size: int | None = None
        self._norm_seen = False
        self._owners: dict[int, tuple[Any, Any]] = {}  # id -> (train cell/jit step, its optimizer)
        self.gate: Any = None  # collect.skip.SkipGate when alerts ask for action: skip
        self._loss_tapped: list[Any] = []  # train cells whose network got a LossTap

    def _reset(self) -> None:
        self.loss: Any = None
        self.grads: Any = None
        self.reduced: Any = None
        self.grad_norm: Any = None
        self.opt: Any = None
        self.opt_grads: Any = None
        self.lr: Any = None
        self.kind: str | None = None  # what began the step: grad, jit, cell, opt
        self.jit_ran = False
        self.owner: Any = None  # the train cell or jit executor that ran the step

    # --- patching -----------------------------------------------------------------------

    def __enter__(self) -> Watch:
        if _ACTIVE:
            raise WatchError(
                "another monitor is already watching this process; end it first "
                "(one watch() at a time, e.g. one %%msmonitor cell)"
            )
        rec = self.monitor
        self.collect = rec.will_collect(rec.step_count)
        _ACTIVE.append(self)
        try:
            self._attach()
        except Exception as exc:  # the user's cell must run even so
            log.debug("msmon: watch() could not attach", exc_info=True)
            rec.warn_once(
                "watch",
                f"watch() could not attach to MindSpore ({type(exc).__name__}: {exc}); "
                "the loop runs unobserved; record steps with mon.step(...)",
            )
        rec.attached("watch")
        return self

    def _attach(self) -> None:
        import mindspore

        from msmon_nb.collect.hooks import compile_cache, find_ways_in, original

        ways = find_ways_in()
        makers = {
            "forward": self._forward_hook,
            "backward": self._backward_hook,
            "optimizer": self._optimizer_hook,
            "cell": self._cell_hook,
            "reducer": self._reducer_hook,
            "jit": self._jit_hook,
        }
        if self.monitor.config.use_callback:
            makers["model"] = self._model_hook
        version = getattr(mindspore, "__version__", "?")
        used = [*makers, "compile_cache"]
        missing = [m for m in (ways[n].missing_message(version) for n in used) if m]
        # read every original first: the Cell hook would otherwise be inherited as the
        # optimizer's "original"
        plan = [(name, t, original(t)) for name in makers for t in ways[name].targets]
        for name, target, function in plan:
            try:
                self._patch(target.owner, target.name, makers[name](function, target))
            except (TypeError, AttributeError) as exc:
                missing.append(f"not observed: {ways[name].observes} ({target.path}: {exc})")
        gate = self.monitor.skip_gate()
        if ways["optimizer"].available:
            from msmon_nb.collect.graph import OptimizerTap

            # without the cache, steps first compiled inside the watch still get the tap
            self.tap = OptimizerTap(compile_cache(), gate)
            self._tap_why = ways["compile_cache"].missing_message(version)
            if gate is not None:  # every optimizer call is gated, PyNative ones too
                self.gate = gate
                self.monitor.guard("wrapping the optimizers to skip bad updates", self.tap.install)
        elif gate is not None:
            missing.append("not able to skip bad updates (no optimizer to wrap)")
        if missing:
            self.monitor.warn_once(
                "ways in",
                "; ".join(missing) + ". The loop runs; the rest is recorded, and "
                "mon.step(...) records what is missing",
            )

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        had = name in vars(owner)
        old = vars(owner).get(name)
        setattr(owner, name, value)
        self._saved.append((owner, name, old, had))

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None and self.pending and not self.opt_seen and self.kind != "cell":
                self._finish()  # before the tap goes: a jit step's norm is still there
        except StopTraining:
            pass
        try:
            for owner, name, old, had in reversed(self._saved):
                if had:
                    setattr(owner, name, old)
                else:
                    delattr(owner, name)
            self._saved.clear()
            if self.tap is not None:
                self.tap.uninstall()
            if self._loss_tapped:
                from msmon_nb.collect.skip import remove_loss_tap

                for cell in self._loss_tapped:
                    remove_loss_tap(cell)
            for cell in self._recompiled_cells:
                cell.compile_cache.clear()
        finally:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
        return exc_type is not None and issubclass(exc_type, StopTraining)

    # --- the hooks ------------------------------------------------------------------------

    def _forward_hook(self, original: Any, target: Any) -> Any:
        watch, skip = self, target.skip

        def forward_run(*args, **kwargs):
            if watch._in_model:
                return original(*args, **kwargs)
            if watch._depth == 0:
                watch._begin("grad")
            watch._depth += 1
            watch._in_forward += 1
            try:
                out = original(*args, **kwargs)
            finally:
                watch._depth -= 1
                watch._in_forward -= 1
            if watch._in_forward:  # a grad taken inside the forward pass: not the step's loss
                return out
            if watch.batch_size is None:
                watch.batch_size = batch_size_of(args[skip:])
            # (run_args, output), or only run_args (GradOperation on MindSpore 2.7)
            pair = isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], tuple)
            if pair and (watch.collect or watch._gate_loss()):
                watch.loss = out[1]
            return out

        return forward_run

    def _backward_hook(self, original: Any, target: Any) -> Any:
        watch = self

        def grad_backward(*args, **kwargs):
            out = original(*args, **kwargs)
            if watch.collect and not watch._in_model and not watch._in_forward:
                watch.grads = out
            return out

        return grad_backward

    def _optimizer_hook(self, original: Any, target: Any) -> Any:
        watch = self

        def optimizer_call(opt, *args, **kwargs):
            if watch._in_opt or watch._in_model:
                return original(opt, *args, **kwargs)
            top = watch._depth == 0
            if top:
                watch._begin("opt")
            lr = None
            if watch.collect and watch._wants("learning_rate"):
                lr = watch._guard(read_lr, opt)
            watch._in_opt += 1
            watch._depth += 1
            if top and watch.loss is not None and watch._gate_loss():
                # a loop's own optimizer call (a train cell's loss is tapped in its graph)
                watch._guard(watch.gate.feed_loss, watch.loss)
            tap_mode = watch.tap.mode if watch.tap is not None else None
            if tap_mode is not None:
                tap_mode.python = True  # we see this call: the tap need not compute
            try:
                out = original(opt, *args, **kwargs)
            finally:
                watch._in_opt -= 1
                watch._depth -= 1
                if tap_mode is not None:
                    tap_mode.python = False
            watch._opt_calls += 1
            watch.opt, watch.lr = opt, lr
            if watch.collect:
                watch.opt_grads = args[0] if args else kwargs.get("gradients")
            watch.opt_seen = True
            if top:
                watch._finish()
            return out

        return optimizer_call

    def _cell_hook(self, original: Any, target: Any) -> Any:
        watch = self

        def cell_call(cell, *args, **kwargs):
            if watch._depth or watch._in_model:
                return original(cell, *args, **kwargs)
            train = watch._is_train_cell(cell)
            watch._begin("train_cell" if train else "cell")
            if train:
                watch._tap_loss(cell)
                watch._prepare_graph_cell(cell)
            calls = watch._opt_calls
            watch._depth += 1
            try:
                out = original(cell, *args, **kwargs)
            finally:
                watch._depth -= 1
            if not train and watch._opt_calls == calls:
                return out  # a forward pass of the user's (evaluation, logging): no step
            watch._train_cells[id(cell)] = True
            watch.kind = "train_cell"
            watch.owner = cell
            if watch.batch_size is None:
                watch.batch_size = batch_size_of(args)
            if watch.collect:
                loss = _first(out)
                if int(getattr(loss, "size", 0) or 0) == 1:
                    watch.loss = loss
            watch._finish(opt_ran=watch._opt_calls != calls or watch.jit_ran)
            return out

        return cell_call

    def _reducer_hook(self, original: Any, target: Any) -> Any:
        watch = self

        def reducer_call(reducer, *args, **kwargs):
            watch._in_opt += 1  # its own jit graphs are not steps
            watch._depth += 1
            try:
                out = original(reducer, *args, **kwargs)
            finally:
                watch._in_opt -= 1
                watch._depth -= 1
            if watch.collect and not watch._in_model:
                watch.reduced = out  # data parallel: the gradients every rank applies
            return out

        return reducer_call

    def _jit_hook(self, original: Any, target: Any) -> Any:
        watch = self

        def jit_executor_call(executor, *args, **kwargs):
            if watch._in_opt or watch._in_model:
                return original(executor, *args, **kwargs)
            top = watch._depth == 0
            if top:
                watch._begin("jit")
            watch._install_tap()
            watch._depth += 1
            try:
                out = original(executor, *args, **kwargs)
            finally:
                watch._depth -= 1
            watch.jit_ran = True
            if top:
                watch.owner = executor
                if watch.batch_size is None:
                    obj = getattr(executor, "obj", None)
                    watch.batch_size = batch_size_of(args[1:] if obj is not None else args)
                if watch.collect:
                    watch._take_jit_output(out)
            return out

        return jit_executor_call

    def _model_hook(self, original: Any, target: Any) -> Any:
        # where `callbacks` sits: train(epoch, dataset, callbacks, ...), eval(dataset,
        # callbacks), fit(epoch, dataset, valid_dataset, valid_frequency, callbacks, ...)
        index = {"train": 2, "fit": 4, "eval": 1}[target.name]
        watch = self

        def wrapped(model, *args, **kwargs):
            if len(args) > index:
                args = (*args[:index], watch._with_callback(args[index]), *args[index + 1 :])
            else:
                kwargs["callbacks"] = watch._with_callback(kwargs.get("callbacks"))
            watch._in_model += 1
            try:
                return original(model, *args, **kwargs)
            finally:
                watch._in_model -= 1

        return wrapped

    def _with_callback(self, callbacks: Any) -> list:
        """The user's callbacks plus the monitor's (once)."""
        from msmon_nb.collect.callback import MonitorCallback

        if callbacks is None:
            items = []
        elif isinstance(callbacks, list | tuple):
            items = list(callbacks)
        else:
            items = [callbacks]
        if any(isinstance(cb, MonitorCallback) for cb in items):
            return items
        if self._callback is None:
            self._callback = self.monitor.callback()
        return [*items, self._callback]

    # --- graphs ---------------------------------------------------------------------------

    def _install_tap(self) -> None:
        """Before the first jit step runs: wrap the optimizers and drop compiled phases."""
        tap = self.tap
        if tap is None or tap.installed or not self._wants("grad_norm", "learning_rate"):
            return
        self.monitor.guard("wrapping the optimizers for jit steps", tap.install)

    def _gate_loss(self) -> bool:
        """True when the skip gate judges the loss (loss_spike skip or nonfinite skip)."""
        gate = self.gate
        return gate is not None and gate.wants_loss

    def _tap_loss(self, cell: Any) -> None:
        """A train cell's loss never reaches Python before its update: put a LossTap on its
        ``network`` (once) so the gate in its graph can judge the loss."""
        if not self._gate_loss() or any(c is cell for c in self._loss_tapped):
            return
        from msmon_nb.collect.skip import install_loss_tap

        if self.monitor.guard("tapping the loss for skip", install_loss_tap, cell, self.gate):
            self._loss_tapped.append(cell)

    def _prepare_graph_cell(self, cell: Any) -> None:
        """A train cell run in GRAPH_MODE compiles like a jit step: same tap, and its own
        compile cache dropped once so that it compiles with the wrapper."""
        import mindspore as ms

        if ms.get_context("mode") != ms.GRAPH_MODE:
            return
        self.jit_ran = True
        if any(c is cell for c in self._recompiled_cells):
            return
        self._install_tap()
        cache = getattr(cell, "compile_cache", None)
        if isinstance(cache, set) and self.tap is not None and self.tap.installed:
            cache.clear()
            self._recompiled_cells.append(cell)

    def _is_train_cell(self, cell: Any) -> bool:
        known = self._train_cells.get(id(cell))
        if known is None:
            from mindspore import nn

            known = isinstance(cell, nn.TrainOneStepCell) or any(
                isinstance(c, nn.Optimizer) for _, c in cell.cells_and_names()
            )
            self._train_cells[id(cell)] = known
        return known

    # --- step bookkeeping ---------------------------------------------------------------

    def _wants(self, *metrics: str) -> bool:
        return any(self.monitor.config.tracks(m) for m in metrics)

    def _guard(self, fn, *args):
        return self.monitor.guard("reading " + fn.__name__, fn, *args)

    def _begin(self, kind: str) -> None:
        """A top-level framework call starts. Grad, jit and train-cell calls start a step
        (ending a previous one that no optimizer call ended); other calls join the open
        step or open one. The collect decision is taken here, so ``set_collect_freq``
        between two steps applies to the very next one."""
        if self.pending:
            if kind in ("opt", "cell") or self.opt_seen:
                return
            if self.kind == "cell":  # only framework work so far: this call starts the step
                self.kind = kind
                return
            self._finish()
        rec = self.monitor
        if rec.stop_requested or rec.paused:  # asked between steps: start no new one
            rec.boundary(raise_stop=True)
        self.pending = True
        self.kind = kind
        self.collect = rec.will_collect(rec.step_count)
        rec.mark_step_start()
        self._t_first = time.perf_counter()
        tap = self.tap
        if self.collect and tap is not None and tap.installed:
            self._tap_before = self._guard(tap.read_count) or 0

    def _take_jit_output(self, out: Any) -> None:
        items = out if isinstance(out, tuple | list) else (out,)
        if not items:
            return
        self.loss = items[0]
        if len(items) > 1:
            second = items[1]
            if hasattr(second, "shape") and int(getattr(second, "size", 0)) == 1:
                self.grad_norm = second
            elif isinstance(second, tuple | list) and flatten_tensors(second):
                self.grads = second

    def _read_tap(self) -> None:
        """On a collected step that ran a graph: the optimizer's norm and lr, if it ran."""
        tap = self.tap
        if tap is None or not tap.installed or not self.jit_ran:
            return
        got = self._guard(tap.read)
        if got is None or got[0] <= self._tap_before:
            return
        _, norm, lr = got
        self.grad_norm = norm
        if self.lr is None and self._wants("learning_rate"):
            self.lr = lr

    def _finish(self, opt_ran: bool = True) -> None:
        """Record the step that just ended, then run the step-boundary controls."""
        self.pending = False
        rec = self.monitor
        now = time.perf_counter()
        if self._t_first is not None:
            waited = self._t_first - self._t_end if self._t_end is not None else 0.0
            rec.add_timing(waited, now - self._t_first)
            self._t_first = None
        if self.collect:
            self._read_tap()
            if self.kind == "train_cell":
                # a train cell: what its optimizer received (unscaled when loss-scaled)
                grads = self.reduced if self.reduced is not None else self.opt_grads
            else:
                # all-reduced gradients first (identical on every rank), else the raw
                # ones before any clipping, else what the optimizer received
                candidates = (self.reduced, self.grads, self.opt_grads)
                grads = next((g for g in candidates if g is not None), None)
            global_step = None
            if self.opt is not None and self._wants("global_step"):
                global_step = self._guard(read_global_step, self.opt)
                global_step = None if global_step is None else global_step - 1
            if grads is not None or self.grad_norm is not None:
                self._norm_seen = True
            elif opt_ran and not self._norm_seen and self._wants("grad_norm"):
                rec.warn_once("grad_norm", f"grad_norm is not observed: {self._why()}; {FIX}")
            params = list(getattr(self.opt, "parameters", ())) if self.opt is not None else None
            with self.ours():  # the monitor's own device work (devnorm's jit) is no step
                rec.record_step(
                    loss=self.loss,
                    grads=grads,
                    grad_norm=self.grad_norm,
                    lr=self.lr,
                    batch_size=self.batch_size,
                    global_step=global_step,
                    params=params,
                    optimizer=self._optimizer(),
                    collect=True,
                )
        else:
            rec.record_step(batch_size=self.batch_size, collect=False)
        self._reset()
        self.collect = rec.will_collect(rec.step_count)
        try:
            rec.boundary(raise_stop=True)
        finally:
            self._t_end = time.perf_counter()  # our own boundary work is not data time

    @contextmanager
    def ours(self) -> Iterator[None]:
        """Framework calls made inside are the monitor's, not the user's: every hook
        passes them through, as it does for calls inside an optimizer call."""
        self._in_opt += 1
        self._depth += 1
        try:
            yield
        finally:
            self._in_opt -= 1
            self._depth -= 1

    def _optimizer(self) -> Any:
        """The step's optimizer: the one called from Python, else (for the optimizer state
        only) the one its graph-mode train cell or jit step holds, looked up once."""
        if self.opt is not None or self.owner is None or not self._wants("optimizer_state"):
            return self.opt
        known = self._owners.get(id(self.owner))
        if known is None or known[0] is not self.owner:
            from msmon_nb.collect.optstate import find_optimizer

            known = (self.owner, self._guard(find_optimizer, self.owner))
            self._owners[id(self.owner)] = known
        return known[1]

    def _why(self) -> str:
        if self.jit_ran:
            if self.tap is None or self._tap_why:
                return (
                    "the step is a graph compiled before the watch began, and it cannot be "
                    f"recompiled with the optimizer tap ({self._tap_why or 'no optimizer hook'})"
                )
            return (
                "the compiled step called no mindspore.nn optimizer taking (gradients) "
                "(a hand-written update, or an optimizer with another signature)"
            )
        if not any(s[1] in ("_pynative_func_grad_backward", "grad") for s in self._saved):
            return "this MindSpore's PyNative gradients could not be hooked (see the warning)"
        return "no gradients passed through a grad function or an optimizer this step"


def active_watch() -> Watch | None:
    """The watch currently active in this process, if any."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextmanager
def quiet() -> Iterator[None]:
    """Framework calls the monitor itself makes (a reduction compiled for the optimizer
    state) are not the user's steps: inside this block the active watch's hooks pass
    every call through, as they do inside an optimizer call."""
    watch = active_watch()
    if watch is None:
        yield
        return
    with watch.ours():
        yield
