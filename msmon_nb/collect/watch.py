"""``mon.watch()``: monitor an unchanged functional MindSpore loop.

While active it observes, for objects created before or after it began:

* ``mindspore.ops.composite.base._pynative_forward_run`` -- every PyNative call of a
  ``value_and_grad``/``grad`` function runs its forward pass through it: the loss, and
  the batch size from the first argument;
* ``..._pynative_func_grad_backward`` -- the gradients it returns (before clipping, which
  is what shows an explosion);
* ``nn.Optimizer.__call__`` (set on the class, so existing optimizers see it) -- a step
  ends when the optimizer returns; the learning rate is read just before the update;
* ``nn.DistributedGradReducer.__call__`` -- in data parallel, the all-reduced gradients:
  grad_norm is then the same on every rank;
* ``mindspore.graph.api._JitExecutor.__call__`` -- a step compiled with ``mindspore.jit``
  hides its insides; its returned loss is recorded, and ``grad_norm`` when it returns
  ``(loss, mm.global_norm(grads), ...)``;
* ``mindspore.train.Model.train`` (when ``use_callback`` is on) -- the monitor's callback
  is added to the call's callbacks, and the hooks above stay quiet inside it so its
  steps are counted once.

When no optimizer call is ever seen (a jit step, a hand-written update), each call of a
grad function or jit step is one step, finished when the next begins or the watch ends.
Everything patched is restored on exit, also after an exception. On steps that are not
collected the hooks keep no tensors and read nothing from the device.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from msmon_nb.collect.tensors import batch_size_of, flatten_tensors
from msmon_nb.collect.values import read_global_step, read_lr

if TYPE_CHECKING:
    from msmon_nb.monitor import Monitor

_ACTIVE: list[Watch] = []


def _jit_api() -> Any:
    """The module holding ``_JitExecutor``: ``mindspore.graph.api`` since 2.9, where the
    old ``mindspore.common.api`` path still works but logs a deprecation warning."""
    import importlib.util

    if importlib.util.find_spec("mindspore.graph.api") is not None:
        import mindspore.graph.api as api
    else:  # MindSpore < 2.9
        import mindspore.common.api as api
    return api


class WatchError(RuntimeError):
    """``watch()`` cannot start (another watch is active)."""


class Watch:
    """Context manager returned by ``Monitor.watch()``."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self._saved: list[tuple[Any, str, Any, bool]] = []
        self._reset()
        self.opt_seen = False
        self.pending = False  # a grad/jit call happened that no optimizer call has ended
        self._in_opt = 0
        self._in_jit = 0
        self._in_forward = 0
        self._in_model = 0
        self._callback: Any = None
        self._t_begin: float | None = None
        self._t_end: float | None = None
        self.batch_size: int | None = None

    def _reset(self) -> None:
        self.loss: Any = None
        self.grads: Any = None
        self.reduced: Any = None
        self.grad_norm: Any = None

    # --- patching -----------------------------------------------------------------------

    def __enter__(self) -> Watch:
        if _ACTIVE:
            raise WatchError(
                "another monitor is already watching this process; end it first "
                "(one watch() at a time, e.g. one %%msmonitor cell)"
            )
        import mindspore.ops.composite.base as base
        from mindspore import nn

        self.collect = self.monitor.will_collect(self.monitor.step_count)
        watch = self
        orig_forward = base._pynative_forward_run
        orig_backward = base._pynative_func_grad_backward
        cell_call = nn.Cell.__call__
        api = _jit_api()
        jit_call = api._JitExecutor.__call__
        from mindspore.train import Model

        def forward_run(fn, sens_param, *args, **kwargs):
            if watch._in_model:
                return orig_forward(fn, sens_param, *args, **kwargs)
            if watch._in_jit == 0 and watch._in_opt == 0 and not watch._in_forward:
                watch._begin_unit()
            watch._in_forward += 1
            try:
                run_args, res = orig_forward(fn, sens_param, *args, **kwargs)
            finally:
                watch._in_forward -= 1
            if watch._in_forward:  # a grad taken inside the forward pass: not the step's loss
                return run_args, res
            if watch.batch_size is None:
                watch.batch_size = batch_size_of(args)
            if watch.collect:
                watch.loss = res
            return run_args, res

        def grad_backward(fn, grad_op, weights, grad_position, has_aux, *run_args):
            out = orig_backward(fn, grad_op, weights, grad_position, has_aux, *run_args)
            if watch.collect and not watch._in_model:
                watch.grads = out
            return out

        def optimizer_call(opt, *args, **kwargs):
            if watch._in_opt or watch._in_model:
                return cell_call(opt, *args, **kwargs)
            watch._in_opt += 1
            try:
                lr = (
                    watch._guard(read_lr, opt)
                    if watch.collect and watch._wants("learning_rate")
                    else None
                )
                out = cell_call(opt, *args, **kwargs)
            finally:
                watch._in_opt -= 1
            watch.opt_seen = True
            watch._finish(opt=opt, opt_grads=args[0] if args else None, lr=lr)
            return out

        def jit_executor_call(executor, *args, **kwargs):
            if watch._in_jit or watch._in_opt or watch._in_model:
                return jit_call(executor, *args, **kwargs)
            watch._begin_unit()
            watch._in_jit += 1
            try:
                out = jit_call(executor, *args, **kwargs)
            finally:
                watch._in_jit -= 1
            if watch.batch_size is None:
                watch.batch_size = batch_size_of(args[1:] if executor.obj is not None else args)
            if watch.collect:
                watch._take_jit_output(out)
            return out

        self._patch(base, "_pynative_forward_run", forward_run)
        self._patch(base, "_pynative_func_grad_backward", grad_backward)

        def reducer_call(reducer, *args, **kwargs):
            watch._in_opt += 1  # its own jit graphs are not steps
            try:
                out = cell_call(reducer, *args, **kwargs)
            finally:
                watch._in_opt -= 1
            if watch.collect and not watch._in_model:
                watch.reduced = out  # data parallel: the gradients every rank applies
            return out

        self._patch(nn.Optimizer, "__call__", optimizer_call)
        self._patch(nn.DistributedGradReducer, "__call__", reducer_call)
        self._patch(api._JitExecutor, "__call__", jit_executor_call)
        if self.monitor.config.use_callback:
            # where `callbacks` sits: train(epoch, dataset, callbacks, ...), eval(dataset,
            # callbacks), fit(epoch, dataset, valid_dataset, valid_frequency, callbacks, ...)
            for name, index in (("train", 2), ("fit", 4), ("eval", 1)):
                self._patch(Model, name, self._with_callback_kw(getattr(Model, name), index))
        _ACTIVE.append(self)
        self.monitor._attached("watch")
        return self

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        had = name in vars(owner)
        self._saved.append((owner, name, vars(owner).get(name), had))
        setattr(owner, name, value)

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            for owner, name, old, had in reversed(self._saved):
                if had:
                    setattr(owner, name, old)
                else:
                    delattr(owner, name)
            self._saved.clear()
        finally:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
        if exc_type is None and self.pending and not self.opt_seen:
            self.monitor._guarded_finish(self._record_pending, raise_stop=False)
        from msmon_nb.monitor import StopTraining

        return exc_type is not None and issubclass(exc_type, StopTraining)

    def _with_callback_kw(self, method: Any, callbacks_index: int) -> Any:
        """``method`` with the monitor's callback added (positional or keyword)."""
        watch = self

        def wrapped(model, *args, **kwargs):
            if len(args) > callbacks_index:
                i = callbacks_index
                args = (*args[:i], watch._with_callback(args[i]), *args[i + 1 :])
            else:
                kwargs["callbacks"] = watch._with_callback(kwargs.get("callbacks"))
            watch._in_model += 1
            try:
                return method(model, *args, **kwargs)
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

    # --- step bookkeeping ---------------------------------------------------------------

    def _wants(self, metric: str) -> bool:
        return self.monitor.config.tracks(metric)

    def _guard(self, fn, *args):
        return self.monitor._guard("reading " + fn.__name__, fn, *args)

    def _begin_unit(self) -> None:
        """A grad call or jit step starts: without optimizers, it ends the previous step.

        The collect decision is taken here, so ``set_collect_freq`` between two steps
        applies to the very next one.
        """
        if self.pending and not self.opt_seen:
            self._record_pending()
        monitor = self.monitor
        if monitor.stop_requested or monitor.paused:  # asked between steps: start no new one
            monitor._boundary(raise_stop=True)
        self.pending = True
        self.collect = monitor.will_collect(monitor.step_count)
        monitor._mark_step_start()
        self._t_begin = time.perf_counter()

    def _record_pending(self) -> None:
        self.pending = False
        self._finish(opt=None, opt_grads=None, lr=None)

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

    def _finish(self, opt: Any, opt_grads: Any, lr: Any) -> None:
        """Record the step that just ended, then run the step-boundary controls."""
        self.pending = False
        monitor = self.monitor
        now = time.perf_counter()
        if self._t_begin is not None:
            waited = self._t_begin - self._t_end if self._t_end is not None else 0.0
            monitor._add_timing(waited, now - self._t_begin)
            self._t_begin = None
        if self.collect:
            # all-reduced gradients first (identical on every rank), else the raw ones
            # before any clipping, else what the optimizer received
            grads = next((g for g in (self.reduced, self.grads, opt_grads) if g is not None), None)
            global_step = None
            if opt is not None and self._wants("global_step"):
                global_step = self._guard(read_global_step, opt)
                global_step = None if global_step is None else global_step - 1
            params = list(getattr(opt, "parameters", ())) if opt is not None else None
            monitor._record_step(
                loss=self.loss,
                grads=grads,
                grad_norm=self.grad_norm,
                lr=lr,
                batch_size=self.batch_size,
                global_step=global_step,
                params=params,
                collect=True,
            )
        else:
            monitor._record_step(batch_size=self.batch_size, collect=False)
        self._reset()
        self.collect = monitor.will_collect(monitor.step_count)
        try:
            monitor._boundary(raise_stop=True)
        finally:
            self._t_end = time.perf_counter()  # our own boundary work is not data time


def active_watch() -> Watch | None:
    """The watch currently active in this process, if any."""
    return _ACTIVE[-1] if _ACTIVE else None
