"""``mon.watch()``: monitor an unchanged MindSpore loop, built before or after it began.

While active it replaces, class- or module-level (so existing objects see it), the ways
in that ``collect.hooks`` finds in the installed MindSpore:

* the PyNative forward pass and backward of ``value_and_grad``/``grad`` functions: the
  loss, the batch size (first argument) and the gradients before any clipping;
* ``nn.Optimizer.__call__``: the learning rate, read from the optimizer's Parameters just
  before the update (a schedule cell's, from the optimizer tap: the value its own
  ``get_lr()`` returned, never a call of ours), and the gradients the optimizer
  receives; a top-level optimizer call ends a step;
* ``nn.Cell.__call__`` for top-level calls only: a train cell driven by hand
  (``TrainOneStepCell``, ``TrainOneStepWithLossScaleCell``, any Cell holding an
  optimizer) is one step, its output the loss, and its time is framework time;
* ``nn.DistributedGradReducer.__call__``: in data parallel, the all-reduced gradients;
* ``_JitExecutor.__call__``: a step compiled with ``mindspore.jit``. Its insides are a
  graph, so at the first one ``collect.graph.OptimizerTap`` wraps every optimizer
  class's ``construct``, and a step that holds an optimizer compiles again (once) with
  the wrapper, which stores the gradients' global norm and the lr in Parameters read on
  collected steps; jit functions that hold nothing we wrap keep their compiled graphs
  (``collect.recompile``);
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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from msmon_nb.collect.accumulation import holds_buffer
from msmon_nb.collect.activations import INSIDE_METRICS, Activations, graph_mode, jit_root
from msmon_nb.collect.active import ACTIVE
from msmon_nb.collect.gradsource import GradSeen, param_norms, resolve, scaling_artifact
from msmon_nb.collect.hooks import find_ways_in, is_optimizer, original
from msmon_nb.collect.optstate import find_optimizer
from msmon_nb.collect.parts import Namer, Part, Parts, merge, user_namespaces
from msmon_nb.collect.patches import Patches
from msmon_nb.collect.recorder import Recorder, StepInputs, StopTraining
from msmon_nb.collect.several import attribute, grouped, optimizers_held, read_lrs, values_for
from msmon_nb.collect.tapguard import TapSet, run_collected, run_unwrapped_on_failure
from msmon_nb.collect.tensors import batch_size_of, flatten_tensors, to_float
from msmon_nb.collect.torchstyle import TorchStyle, is_torch_optimizer, step_loss
from msmon_nb.collect.torchstyle import imported as torch_imported  # (a dict lookup)
from msmon_nb.collect.unscale import received_factor
from msmon_nb.collect.values import (
    cell_loss_scale,
    lr_on_host,
    norm_now,
    read_global_step,
    read_lr,
    unscale_received,
)
from msmon_nb.config.blame import keeps_param_norms

log = logging.getLogger(__name__)


FIX = (
    "one-line fix: return it from your step, e.g. `return loss, mm.global_norm(grads)`, "
    "or record it with mon.step(grad_norm=...)"
)


# grad calls a first step may hold before it is known whether they are micro-batches of
# one update (``Watch._hold``)
UNDECIDED = 32


class WatchError(RuntimeError):
    """``watch()`` cannot start (another watch is active)."""


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, tuple | list) and value else value


def _returned_tuples(out: Any) -> list[Any]:
    """The tuples a jit step returned beside its loss that may be its gradients: the
    items after the loss that are non-empty tuples or lists of tensors only, in order."""
    items = out if isinstance(out, tuple | list) else ()
    found = []
    for item in items[1:]:
        if isinstance(item, tuple | list) and item:
            leaves = flatten_tensors(item)
            if len(leaves) == len(item) and all(hasattr(t, "shape") for t in leaves):
                found.append(item)
    return found


def _helper(executor: Any) -> str | None:
    """The name of a jit function MindSpore itself defines (``mindspore.amp``'s
    ``_grad_scale_map``/``_grad_unscale_map``/``_all_finite``, an optimizer's compiled
    ``construct``...); None for the user's own. Those are framework calls inside the
    user's step, never a step of their own (the loss-scale recipe calls three). A
    function MindSpore builds for the user (``ms.jit(ms.value_and_grad(f))`` compiles a
    closure defined in ``mindspore.ops``) is the user's: only module-level ones count."""
    fn = getattr(executor, "fn", None)
    module = getattr(fn, "__module__", None) or ""
    qualname = getattr(fn, "__qualname__", "") or ""
    if getattr(executor, "obj", None) is not None or "<locals>" in qualname:
        return None
    return getattr(fn, "__name__", "?") if module.startswith("mindspore.") else None


class Watch:
    """Context manager returned by ``Monitor.watch()``."""

    def __init__(self, recorder: Recorder, names: Mapping[str, Any] | None = None) -> None:
        self.monitor = recorder
        self._patches = Patches()
        # two or more optimizers in one iteration (collect.parts): the steps they make,
        # the user's names for them (name -> optimizer, train cell or network) and ours
        self._parts = Parts()
        self._namer = Namer(names, recorder.config.optimizer_names)
        self._held: dict[int, tuple[Any, list[Any]]] = {}  # id -> (owner, its optimizers)
        self.tap: Any = None  # collect.gradtaps.StepTaps
        self._tap_why: str | None = None
        self._train_cells: dict[int, bool] = {}
        self._reset()
        self.opt_seen = False  # steps end at optimizer (or train cell) returns
        self.pending = False  # a step began that has not been recorded yet
        self.collect = False
        self._depth = 0  # nesting of framework calls we hooked: 0 = the user's code
        self._in_opt = 0
        self._in_forward = 0
        self._in_model = 0
        self._opt_calls = 0
        self._opt_at_begin = 0  # _opt_calls when the collected step began
        self._callback: Any = None
        self._t_first: float | None = None
        self.held_start: float | None = None  # when the last held grad call began
        self.grad_steps = False  # every grad call is a step (seen: _finish_held)
        self._t_end: float | None = None
        self.batch_size: int | None = None
        self._norm_seen = False
        self._owners: dict[int, tuple[Any, Any]] = {}  # id -> (train cell/jit step, its optimizer)
        # (ids of a jit function and its bound object) -> (function, object, its optimizer)
        self._fn_optimizers: dict[tuple[int, int], tuple[Any, Any, Any]] = {}
        self._told: tuple[Any, Any] = (None, None)  # (train cell, optimizer) told the recorder
        self.gate: Any = None  # collect.skip.SkipGate when alerts ask for action: skip
        self._loss_tapped: list[Any] = []  # train cells whose network got a LossTap
        # keep per-parameter gradient norms (blame, param_stats)
        self._blame = keeps_param_norms(recorder.config)
        self._names: dict[int, tuple[Any, tuple[str, ...]]] = {}  # id -> (optimizer, names)
        self._buffers: dict[int, tuple[Any, bool | None]] = {}  # id -> (owner, holds_buffer)
        self._torch = TorchStyle(self)  # torch-style optimizers, MindNLP's (collect.torchstyle)
        config = recorder.config
        self.acts: Activations | None = None  # activations (opt-in: collect.activations)
        if any(config.tracks(m) for m in INSIDE_METRICS):
            self.acts = Activations(
                config.module_targets,
                config.tracks("act_grad"),
                recorder.warn_once,
                outputs=config.tracks("activations"),
                attention=config.tracks("attention"),
                attention_targets=config.attention_targets,
                moe=config.tracks("moe"),
                offer_module=self._offer_module,
            )

    def _offer_module(self, module: Any) -> None:
        """A mindtorch module is called while a collected step waits for its network
        (``collect.torchmodules.RootHook``): the first one inside its forward pass is it,
        as ``_cell_hook`` takes a Cell's."""
        acts = self.acts
        if acts is not None and acts.wants_root and self._wants_root():
            self._guard(acts.see, module)

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
        # the last top-level jit call returned gradients from a graph that runs no
        # optimizer update (a micro-batch of host accumulation, or a step whose update
        # is the user's): held like a grad call until an optimizer call decides
        self.jit_grads = False
        self.scalar_declined = False  # a scalar beside returned gradients, not taken
        # tuples of tensors returned beside the loss, none shaped as the Parameters of the
        # optimizer the step's function refers to: not gradients (``_gradients_returned``)
        self.tuples_declined = False
        self.owner: Any = None  # the train cell or jit executor that ran the step
        self.amp_scale: float | None = None  # the amp loss scale the forward applied
        self.raw_loss: Any = None  # the loss before the amp loss scaler scaled it
        self.micro: list[float] = []  # earlier micro-batches' gradient norms this step
        self.calls = 0  # grad and jit calls in this step (> 1: accumulation)
        # optimizers stepped inside one top-level call (a PyNative outer cell stepping a
        # GAN's D then G), each with the gradients it received and its lr, in order
        self.inner: list[tuple[Any, Any, Any]] = []
        self.outputs: Any = None  # what the top-level train cell or jit step returned
        self.lrs: dict[int, float] = {}  # each held optimizer's lr before a graph step
        self.overflowed = False  # amp.all_finite found inf/nan in this step's gradients
        # earlier grad calls of a first step not yet known to be one (``_hold``): their
        # loss and start time
        self.held: list[tuple[float | None, float]] = []
        # each parameter's gradient norm as a graph step's optimizer tap measured it
        self.param_norms: tuple[Sequence[str], Any] | None = None
        self.update: Any = None  # the torch-style update that ended the step (torchstyle)
        self.losses: list[Any] = []  # earlier micro-batches' losses this step
        # each earlier micro-batch's norm before a clip of its own (``_note_micro_clip``),
        # and the clip calls counted when the last was taken
        self.micro_clipped: list[float] = []
        self.clips_at: int | None = None

    # --- patching -----------------------------------------------------------------------

    def __enter__(self) -> Watch:
        if ACTIVE:
            raise WatchError(
                "another monitor is already watching this process; end it first "
                "(one watch() at a time, e.g. one %%msmonitor cell)"
            )
        rec = self.monitor
        self.collect = rec.will_collect(rec.step_count)
        ACTIVE.append(self)
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

        from msmon_nb.collect.graph import probe_host_writes

        # before any hook of ours is in place (its graph is not a step)
        self.monitor.guard("checking in-place writes", probe_host_writes)
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
                self._patches.put(target.owner, target.name, makers[name](function, target))
            except (TypeError, AttributeError) as exc:
                missing.append(f"not observed: {ways[name].observes} ({target.path}: {exc})")
        self.monitor.guard("attaching to torch-style optimizers", self._torch.attach)
        gate = self.monitor.skip_gate()
        if ways["optimizer"].available:
            from msmon_nb.collect.gradtaps import StepTaps

            # without the cache, steps first compiled inside the watch still get the tap
            self.tap = StepTaps(gate, self._blame)
            self._tap_why = ways["compile_cache"].missing_message(version)
            # clip and loss-scale functions run in Python in PyNative loops: wrapped now
            # (a compiled graph compiles again only if it holds one: collect.recompile)
            self.monitor.guard(
                "wrapping the clip and loss-scale functions", self.tap.install, False
            )
            if gate is not None:  # every optimizer call is gated, PyNative ones too
                self.gate = gate
                self.monitor.guard(
                    "wrapping the optimizers to skip bad updates", self.tap.optimizer.install
                )
        elif gate is not None:
            missing.append("not able to skip bad updates (no optimizer to wrap)")
        if missing:
            self.monitor.warn_once(
                "ways in",
                "; ".join(missing) + ". The loop runs; the rest is recorded, and "
                "mon.step(...) records what is missing",
            )

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            last = self.pending and self.kind != "cell"
            skipped = self.overflowed and self.opt is None  # an overflow-skipped update
            if exc_type is None and last and (not self.opt_seen or skipped):
                self._finish()  # before the tap goes: a jit step's norm is still there
            for parts in self._parts.flush():  # a held part, an iteration left open
                self._record_parts(parts)
        except StopTraining:
            pass
        try:
            if self.acts is not None:
                self.acts.close()
            self._patches.restore()
            self._torch.detach()
            if self.tap is not None:
                self.tap.uninstall()
            if self._loss_tapped:
                from msmon_nb.collect.skip import remove_loss_tap

                for cell in self._loss_tapped:
                    remove_loss_tap(cell)
        finally:
            if self in ACTIVE:
                ACTIVE.remove(self)
        return exc_type is not None and issubclass(exc_type, StopTraining)

    # --- the hooks ------------------------------------------------------------------------

    def _forward_hook(self, original: Any, target: Any) -> Any:
        watch, skip = self, target.skip

        def forward_run(*args, **kwargs):
            if watch._in_model:
                return original(*args, **kwargs)
            if watch._depth == 0:
                watch._begin("grad")
                watch.calls += 1
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
                if watch.loss is not None and watch.calls > 1:  # accumulation: a torch-style
                    watch.losses.append(watch.loss)  # update's loss sums them (torchstyle)
                watch.loss = out[1]
            return out

        return forward_run

    def _backward_hook(self, original: Any, target: Any) -> Any:
        watch = self

        def grad_backward(*args, **kwargs):
            out = original(*args, **kwargs)
            if watch.collect and not watch._in_model and not watch._in_forward:
                if watch.grads is not None and watch._depth == 0:  # an earlier micro-batch's
                    watch._keep_micro_norm()
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
                if lr is None and not watch._guard(lr_on_host, opt):
                    watch._install_tap()  # a schedule cell: only the optimizer's graph knows
            watch._in_opt += 1
            watch._depth += 1
            if top and watch.loss is not None and watch._gate_loss():
                # a loop's own optimizer call (a train cell's loss is tapped in its graph)
                watch._guard(watch.gate.feed_loss, watch.loss)
            tap_mode = watch.tap.optimizer.mode if watch.tap is not None else None
            if tap_mode is not None:
                tap_mode.python = True  # we see this call: the tap need not compute
            try:
                out = watch._graph_call(original, opt, args, kwargs, "optimizer")
            finally:
                watch._in_opt -= 1
                watch._depth -= 1
                if tap_mode is not None:
                    tap_mode.python = False
            watch._opt_calls += 1
            if not top and watch.collect:  # inside the user's call: whose gradients
                watch.inner.append((opt, args[0] if args else kwargs.get("gradients"), lr))
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
                acts = watch.acts
                if acts is not None and acts.wants_root and watch._wants_root():
                    watch._guard(acts.see, cell)
                return original(cell, *args, **kwargs)
            train = watch._is_train_cell(cell)
            watch._begin("train_cell" if train else "cell")
            if train and watch.acts is not None and graph_mode():
                keyed = watch._guard(watch._key_cell, cell)
                watch._guard(watch.acts.compiled_root, cell, None, keyed)  # before it compiles
            if train:
                watch._tap_loss(cell)
                watch._prepare_graph_cell(cell)
                watch._lr_before(cell)
            calls = watch._opt_calls
            watch._depth += 1
            try:
                out = watch._graph_call(original, cell, args, kwargs, "train cell", train)
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
                watch.outputs = out
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
            helper = _helper(executor)
            if helper is not None:
                return watch._framework_jit(helper, original, executor, args, kwargs)
            top = watch._depth == 0
            if top:
                watch._begin("jit")
            watch.calls += top
            if top and watch.acts is not None:  # before it compiles (collect.acttaps)
                if watch.acts.graph is None:  # (found once: not a walk every step)
                    root = watch._guard(jit_root, executor)
                    keyed = watch._act_keyer() is not None
                    watch._guard(watch.acts.compiled_root, root, None, keyed)
                else:
                    watch.acts.wants_root = False
            watch._install_tap()
            if top:
                watch._lr_before(executor)
                watch._expect_graph()
            watch._depth += 1
            try:
                out = watch._graph_call(original, executor, args, kwargs, "jit step", top)
            finally:
                watch._depth -= 1
            watch.jit_ran = True
            if top:
                watch.owner = executor
                if watch.batch_size is None:
                    obj = getattr(executor, "obj", None)
                    watch.batch_size = batch_size_of(args[1:] if obj is not None else args)
                grads = watch._guard(watch._gradients_returned, out)
                watch.jit_grads = grads is not None and watch._graph_updates() is False
                if watch.collect:
                    if watch.jit_grads and watch.grads is not None:  # an earlier micro-batch's
                        with watch.ours():  # (a norm on the device is a jit call of ours)
                            watch._keep_micro_norm()
                    watch.outputs = out
                    watch._take_jit_output(out, grads)
            return out

        return jit_executor_call

    # --- torch-style optimizers: collect.torchstyle's hooks call these -------------------

    def busy(self) -> bool:
        """Inside a call the hooks pass through (``Model.train``, an optimizer's, the
        monitor's own work): a torch-style update or clip there is not the user's."""
        return bool(self._in_model or self._in_opt)

    def update_begins(self) -> bool:
        """A torch-style optimizer's ``step()`` begins: it joins the open step or opens
        one, as an ``nn.Optimizer`` call does; True where the user's code called it."""
        top = self._depth == 0
        if top:
            self._begin("opt")
        self.opt_seen = True  # a closure's forward and backward inside step() join it
        return top

    def update_ends(self, update: Any, grads: Any) -> None:
        """A torch-style ``step()`` returned (``update``: ``torchstyle.Update``): it ends
        the step as an ``nn.Optimizer`` call does. ``grads``: what it received, where no
        clip call says better."""
        self._opt_calls += 1
        if not update.top and update.collect:  # inside the user's call: whose gradients
            self.inner.append((update.optimizer, grads, update.lr))
        self.opt, self.lr, self.update = update.optimizer, update.lr, update
        if update.collect:
            self.opt_grads = grads
        self.opt_seen = True
        if update.top:
            self._finish()

    def _framework_jit(self, name: str, original: Any, executor: Any, args, kwargs) -> Any:
        """A jit function of MindSpore's own, called from Python: it joins the open step
        (or opens one that the user's next call starts). ``mindspore.amp``'s loss scaling,
        seen in the forward pass: the scale and the unscaled loss."""
        if self._depth == 0:
            self._begin("cell")
        if name == "_grad_scale_map" and self._in_forward and self.collect and len(args) >= 2:
            self.amp_scale = to_float(args[0])
            if hasattr(args[1], "shape") and int(getattr(args[1], "size", 0) or 0) == 1:
                self.raw_loss = args[1]  # scale(loss): the loss the loop computed
        self._depth += 1
        self._in_opt += 1  # what it calls inside is framework work too
        try:
            out = original(executor, *args, **kwargs)
        finally:
            self._depth -= 1
            self._in_opt -= 1
        if name == "_all_finite" and self._depth == 0 and not self.overflowed:
            # one bool read a step: an overflow skips the optimizer call that would end
            # the step, so the next grad call must end it instead
            self.overflowed = self._guard(to_float, out) == 0.0
        return out

    def _keep_micro_norm(self) -> None:
        """The gradients of an earlier micro-batch of this step (accumulation): their
        norm, loss scale undone, before the next backward replaces them."""
        norm = self._guard(norm_now, self.grads)
        if norm is not None:
            self.micro.append(norm / (self.amp_scale or 1.0))

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
            tap = watch.tap
            try:
                if tap is None:
                    return original(model, *args, **kwargs)
                with tap.suspended():  # the callback's own taps measure Model.train
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

    def _lr_before(self, owner: Any) -> None:
        """Before a collected graph step (a jit step, a train cell) runs: its optimizer's
        lr, where its Parameters tell it (``lr_on_host``), read now. At the step's end --
        for a graph step, when the next one begins -- the loop may already have set the
        next step's lr; and a step whose update an overflow skipped never calls the
        ``get_lr()`` the tap keeps. Other lrs (a schedule cell) come from the tap."""
        if not self.collect or self.lr is not None or not self._wants("learning_rate"):
            return
        self.owner = owner
        opt = self._step_optimizer()
        if opt is not None:
            self.lr = self._guard(read_lr, opt)  # None unless its Parameters tell it
        held = self._held_optimizers(owner)
        if len(held) > 1:  # each one's, should several step inside (collect.several)
            self.lrs = self._guard(read_lrs, held, read_lr) or {}

    def _install_tap(self) -> None:
        """Before the first graph step (or PyNative optimizer call whose lr only its graph
        knows) runs: wrap the optimizers and drop compiled phases. The step under way
        began unwrapped: if it is collected, its reading begins now, before it runs."""
        tap = self.tap
        if tap is None or tap.optimizer.installed:
            return
        if not self._wants("grad_norm", "learning_rate"):
            return
        self.monitor.guard("wrapping the optimizers for jit steps", tap.install)
        if tap.optimizer.installed and self.pending and self.collect:
            self._guard(tap.set_collect, True)
            if tap.begun:  # the clip and loss-scale taps' reading began with the step
                self._guard(tap.optimizer.arm_lr)
            else:
                self._guard(tap.begin)
                self._opt_at_begin = self._opt_calls

    def _graph_call(
        self, original: Any, obj: Any, args: tuple, kwargs: dict, where: str, step: bool = False
    ) -> Any:
        """The user's call, run once without our taps if it fails compiling one of them
        (``collect.tapguard``): that path is then not monitored, training goes on.
        ``step``: the call is a step (a top-level jit call, a train cell); a collected
        one runs the graph compiled with the activation classes (``collect.acttaps``),
        without them if they cannot compile."""
        acts = self.acts

        def call() -> Any:
            return original(obj, *args, **kwargs)

        keyer = self._act_keyer(obj) if step and acts is not None and acts.switched() else None
        if keyer is not None:
            plain = call

            def call() -> Any:
                def warn(message: str) -> None:
                    self.monitor.warn_once("acts failed", message)

                graph = acts.graph  # None once they failed (a retry below runs then)
                if graph is None:
                    return plain()
                return run_collected(plain, graph, keyer, acts.tap_failed, warn, where)

        taps = TapSet(self.tap, acts.graph if acts is not None else None)
        if not taps.installed and keyer is None:
            return call()

        def warn(message: str) -> None:
            self.tap = None  # no tap again in this watch
            if acts is not None and acts.graph is not None:
                acts.tap_failed()
            self.monitor.warn_once("tap failed", message)

        return run_unwrapped_on_failure(call, taps, [obj], warn, where)

    def _act_keyer(self, obj: Any = None) -> Any:
        """The recompiler that keys the graph a collected step of ``obj`` (a train cell;
        None or a jit executor: a jit step) compiles with the activation classes apart
        from the other steps' (``collect.recompile``); None where it cannot."""
        tap = self.tap
        if tap is None:
            return None
        recompiler = tap.recompiler
        from mindspore import nn

        if not isinstance(obj, nn.Cell):
            return recompiler if recompiler.keys_jit() else None
        return recompiler if recompiler.keys(obj) else None

    def _key_cell(self, cell: Any) -> bool:
        """A train cell run in GRAPH_MODE with activations: its graphs keyed under a
        phase of their own (``Recompiler.prepare_cell``), so that its collected steps'
        graph can be keyed apart. Whether it is."""
        tap = self.tap
        if tap is None:
            return False
        tap.recompiler.prepare_cell(cell)
        return tap.recompiler.keys(cell)

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
        graphs compiled again once with it (``collect.recompile``)."""
        import mindspore as ms

        if ms.get_context("mode") != ms.GRAPH_MODE:
            return
        self.jit_ran = True
        self._install_tap()
        if self.tap is not None and self.tap.optimizer.installed:
            self.tap.recompiler.prepare_cell(cell)

    def _is_train_cell(self, cell: Any) -> bool:
        known = self._train_cells.get(id(cell))
        if known is None:
            from mindspore import nn

            known = isinstance(cell, nn.TrainOneStepCell) or any(
                is_optimizer(c) for _, c in cell.cells_and_names()
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
            if self.kind == "cell" and kind != "cell":
                self.kind = kind  # only framework work so far: this call starts the step
                return
            # an update skipped for a loss-scale overflow: no optimizer call ends the step
            skipped = self.overflowed and self.opt is None and kind in ("grad", "jit")
            if (kind in ("opt", "cell") or self.opt_seen) and not skipped:
                if kind in ("grad", "jit"):  # the next micro-batch of an accumulating step
                    self._guard(self._note_micro_clip)
                return
            if kind in ("grad", "jit") and not skipped and self._hold(kind):
                self._guard(self._note_micro_clip)
                return
            self._finish()
        rec = self.monitor
        if not self._torch.attached and torch_imported():  # MindNLP imported in the loop
            rec.guard("attaching to torch-style optimizers", self._torch.attach)
        if rec.stop_requested or rec.paused:  # asked between steps: start no new one
            rec.boundary(raise_stop=True)
        self.pending = True
        self.kind = kind
        self.collect = rec.will_collect(rec.step_count)
        rec.mark_step_start()
        self._t_first = time.perf_counter()
        tap = self.tap
        if tap is not None and tap.installed:
            self._guard(tap.set_collect, self.collect)
            if self.collect:
                self._guard(tap.begin)
                self._opt_at_begin = self._opt_calls
        if self.acts is not None:
            self._guard(self.acts.arm, self.collect)

    def _hold(self, kind: str) -> bool:
        """A grad call begins while a grad-only step is open and no optimizer call has
        been seen yet: the loop accumulates (its optimizer call comes after the
        micro-batches) or updates without one (every grad call is a step). Which, only
        its first optimizer call tells: until then, up to ``UNDECIDED`` calls are held
        in one step, each call's loss and start kept (its gradient norm goes to
        ``micro`` as under accumulation). An optimizer call then ends them as one
        accumulated step; anything else (the limit, a train-cell call, another kind of
        call, the watch's end) ends them as a step each (``_finish_held``).

        A jit call is held the same way after a jit call whose graph returned gradients
        and runs no optimizer update (``jit_grads``: MindYOLO's ``ms_jit`` step with
        ``optimizer_update=False``, its Trainer accumulating on the host); a jit call
        whose graph updates is a step, as before."""
        if kind == "jit":
            open_kind = self.kind == "jit" and self.jit_grads
        else:
            open_kind = self.kind == "grad" and not self.jit_ran
        if not open_kind or self.opt_seen or self.grad_steps:
            return False
        if len(self.held) + 1 >= UNDECIDED:
            return False
        loss = self._guard(to_float, _first(self.loss)) if self.loss is not None else None
        start = self.held_start if self.held else self._t_first
        self.held.append((loss, start if start is not None else time.perf_counter()))
        self.held_start = time.perf_counter()
        return True

    def _finish_held(self) -> None:
        """The held grad calls were steps of their own: record each (its loss, its
        micro-batch gradient norm, its time), then the open step is the last call only."""
        rec = self.monitor
        starts = [start for _, start in self.held] + [self.held_start]
        norms = list(self.micro)
        for i, (loss, start) in enumerate(self.held):
            rec.add_timing(0.0, starts[i + 1] - start)
            collect = rec.will_collect(rec.step_count)
            norm = norms[i] if collect and i < len(norms) else None
            loss = loss if collect else None
            inputs = StepInputs(loss=loss, grad_norm=norm, batch_size=self.batch_size)
            rec.record_step(inputs, collect=collect)
            rec.boundary(raise_stop=False)
        self.micro = norms[len(self.held) :]
        self.grad_steps = True  # this loop updates without an optimizer call: hold no more
        self.calls = 1
        self._t_first = self.held_start
        self.held = []

    def _gradients_returned(self, out: Any) -> Any:
        """The gradients a top-level jit step returned: the tuple of tensors beside its
        loss shaped as the Parameters of the optimizer its function refers to, where it
        refers to one (``find_optimizer``, looked up once per function: MindYOLO's step
        does), whatever its place (logits returned for a metric may come first); None
        otherwise, and where tuples were returned but none is so shaped, none of them
        nor a scalar beside them is taken (``tuples_declined``). (A step that refers to
        no optimizer -- a micro-batch step over ``value_and_grad(f, None, params)`` --
        cannot be checked so: its first tuple is taken as gradients, as a ``return loss,
        grads`` always was.)"""
        self.tuples_declined = False
        tuples = _returned_tuples(out)
        if not tuples:
            return None
        # (MindSpore makes the executor anew for each call: keyed by its function)
        fn, obj = getattr(self.owner, "fn", None), getattr(self.owner, "obj", None)
        known = self._fn_optimizers.get((id(fn), id(obj)))
        if known is None or known[0] is not fn or known[1] is not obj:
            known = (fn, obj, self._guard(find_optimizer, self.owner))
            self._fn_optimizers[(id(fn), id(obj))] = known
        opt = known[2]
        if opt is None:
            return tuples[0]
        shapes = [tuple(p.shape) for p in getattr(opt, "parameters", ()) or ()]
        for grads in tuples:  # (logits for a metric may come first: MindYOLO's do not)
            if [tuple(g.shape) for g in grads] == shapes:
                return grads
        self.tuples_declined = True  # none is: neither they nor a scalar beside them
        return None

    def _expect_graph(self) -> None:
        """Before a top-level jit call: the recompiler notes the phase it compiles
        under (``Recompiler.expect_call``), to tell what its graph runs."""
        tap = self.tap
        if tap is not None and tap.recompiler.installed:
            tap.recompiler.expect_call()

    def _graph_updates(self) -> bool | None:
        """Whether the graph of the jit call that just ran holds an optimizer update,
        read from its Parameters without running anything (``collect.recompile``);
        None where the recompiler did not see it compile (no taps: not known)."""
        tap = self.tap
        if tap is None or not tap.recompiler.installed:
            return None
        return self._guard(tap.recompiler.call_updates)

    def _note_micro_clip(self) -> None:
        """A micro-batch's call joins a collected step (host accumulation): if clip
        calls ran since the step began, before this call, an earlier micro-batch was
        clipped on its own (MindYOLO's ``clip_grad`` with ``accumulate``): the step
        clips each micro-batch, and that micro-batch's norm before clipping is kept (the
        clip sum zeroed for the next). Without this, one step's clip sum mixed both
        micro-batches' (43.31 recorded for an accumulated norm of 41.37)."""
        tap = self.tap
        if not self.collect or tap is None or not tap.begun:
            return
        clips = tap.graph.counts()[0]
        since = self.clips_at if self.clips_at is not None else tap.reading.begun.clips
        if clips > since:
            self.micro_clipped.append(tap.graph.clip_norm())
            self.clips_at = clips

    def _take_jit_output(self, out: Any, grads: Any = None) -> None:
        """A collected jit step's output: its loss (first), and its gradients or their
        norm. ``grads``: the gradient tuple it returned (``_gradients_returned``).
        Beside returned gradients a scalar is not taken as grad_norm: nothing proves it
        is one (MindYOLO returns its ``loss_items`` there, a one-element tensor holding
        the loss); the norm is taken from the gradients where they are the step's
        (a graph that runs no update, or the documented ``return loss, grads``)."""
        items = out if isinstance(out, tuple | list) else (out,)
        if not items:
            return
        self.loss = items[0]
        if grads is not None:
            if self.jit_grads or grads is items[1]:
                self.grads = grads
            else:  # (the optimizer tap's norm is used where the graph's update ran)
                second = items[1]
                self.scalar_declined = int(getattr(second, "size", 0) or 0) == 1
            return
        if len(items) > 1 and not self.tuples_declined:
            second = items[1]
            if hasattr(second, "shape") and int(getattr(second, "size", 0)) == 1:
                self.grad_norm = second
            elif isinstance(second, tuple | list) and flatten_tensors(second):
                self.grads = second  # (as before: ``return loss, grads``)

    def _gradients(self) -> tuple[Any, Any, float, dict[str, float]]:
        """What the step that just ended shows of its gradients, as ``collect.gradsource``
        reads it: (tensors whose norm the recorder takes, or None; grad_norm when already
        a number; the loss scale their norms are divided by; the extra tags).

        PyNative gradients are seen where they are produced (a ``value_and_grad``, or the
        backward inside a train cell called by hand): their loss scale is the amp
        scaler's (seen in the forward pass) or the train cell's. Graph steps (``@jit``,
        graph-mode cells) show what their optimizer and clip calls received, through the
        taps. What the optimizer received is read only where the contract needs it.
        """
        tap = self.tap
        seen, tap_lr = GradSeen(), None
        names: Sequence[str] | None = None
        if tap is not None and tap.begun:
            names = self._guard(self._tapped_names) if self._blame else None
            tap.each = len(names) if names else 0
            got = self._guard(tap.end, self._opt_calls - self._opt_at_begin, self._holds_buffer())
            if got is not None:
                seen, tap_lr = got
        if tap_lr is not None and self.lr is None and self._wants("learning_rate"):
            self.lr = tap_lr
        if self.kind == "train_cell":
            # reduced gradients of a train cell may or may not carry its loss scale
            produced = self.grads if self.reduced is None else None
            cell_scale = self._guard(cell_loss_scale, self.owner)
            if seen.loss_scale is None:
                seen.loss_scale = cell_scale
            scale = seen.loss_scale or 1.0
        else:
            produced = self.reduced if self.reduced is not None else self.grads
            # no amp scaler seen: an optimizer made with loss_scale=S says its gradients
            # arrive scaled by S, as MindSpore's own loss_scale= means (collect.unscale)
            own = None if self.amp_scale else self._guard(self._optimizer_scale)
            if seen.loss_scale is None:
                seen.loss_scale = self.amp_scale or own
            scale = self.amp_scale or own or 1.0
        seen.accumulating = seen.accumulating or self.calls > 1
        if self.grad_norm is not None and not seen.optimizer_ran:
            # a jit step's second output, a scalar: ``return loss, mm.global_norm(grads)``
            # (where its graph's optimizer call was seen, the tap knows better: a suite's
            # step may return other scalars there)
            seen.produced = to_float(self.grad_norm)
        elif produced is not None:
            seen.produced_later = True
            if self.micro or seen.accumulating:
                seen.produced = self._guard(norm_now, produced)
                if seen.produced is not None:
                    seen.produced /= scale
        if seen.produced is not None and self.micro:
            seen.micro = [*self.micro, seen.produced]
        per_micro = tap.pattern.per_micro_clip if tap is not None else False
        if self.micro_clipped and seen.clip_input is not None:
            # each micro-batch clipped before the host added them: their norms before
            # clipping, the last one's what the tap read at the end
            seen.micro = [*self.micro_clipped, seen.clip_input]
            per_micro = True
        in_python = False  # seen.received is a norm taken here, not the tap's
        if self.update is not None:  # a torch-style update: its clip call (torchstyle)
            self._guard(self._torch.fill, seen, self.update)
        if self.opt_grads is not None:
            seen.optimizer_ran = True
            unseen = seen.produced is None and not seen.produced_later
            if seen.clip_input is not None or seen.accumulating or unseen:
                got = self._guard(norm_now, self.opt_grads)
                if got is not None:
                    seen.received, in_python = got, True
        if seen.received is not None:  # its own loss-scale undo (collect.unscale)
            opt = self.opt if self.opt is not None else self._step_optimizer()
            cell = self.owner if self.kind == "train_cell" else None
            warn = self.monitor.warn_once
            self._guard(unscale_received, seen, opt, in_python, warn, cell)
        out = resolve(seen, clip_per_micro=per_micro)
        if out.note is not None:
            self.monitor.warn_once(out.note, out.note)
        several = len({id(o) for o, _, _ in self.inner}) > 1
        if out.mixed or several:  # its loss and lr are one of several networks'
            self.loss = self.raw_loss = self.lr = None
            self._norm_seen = True
            return None, None, 1.0, self._guard(self._several, seen) or {}
        if names:
            self.param_norms = param_norms(seen, out.grad_norm, names)
        if out.source is not None or out.note is not None or seen.overflow:
            self._norm_seen = True
        if out.source == "produced" and out.grad_norm is None:
            return produced, None, scale, out.values
        if out.grad_norm is None:
            return None, None, 1.0, out.values
        return produced, out.grad_norm, scale, out.values

    def _finish(self, opt_ran: bool = True) -> None:
        """Record the step that just ended, then run the step-boundary controls."""
        if self.held and self.opt is None:
            self._finish_held()
        self.pending = False
        rec = self.monitor
        now = time.perf_counter()
        waited = compute = 0.0
        if self._t_first is not None:
            waited = self._t_first - self._t_end if self._t_end is not None else 0.0
            compute = now - self._t_first
            self._t_first = None
        opt = self.opt if self.opt is not None else self._step_optimizer()
        cell = self.owner if self.kind == "train_cell" else None
        if opt is not self._told[1] or cell is not self._told[0]:  # once per change
            self._told = (cell, opt)
            rec.trains(cell, opt)  # what checkpoint saves and lr xF scales
        if self.collect:
            grads, grad_norm, scale, extra = self._gradients()
            if self.acts is not None:
                extra = {**(extra or {}), **(self._guard(self._activations) or {})}
            global_step = None
            if self.opt is not None and self._wants("global_step"):
                global_step = self._guard(read_global_step, self.opt)
                global_step = None if global_step is None else global_step - 1
            if opt_ran and not self._norm_seen and self._wants("grad_norm"):
                rec.warn_once("grad_norm", f"grad_norm is not observed: {self._why()}; {FIX}")
            # a graph step's optimizer too, for blame's detail after an alert and the
            # weights stable_rank reads
            needs = self._blame or self._wants("stable_rank")
            owner = self.opt if self.opt is not None or not needs else self._step_optimizer()
            params = list(getattr(owner, "parameters", ())) if owner is not None else None
            loss = self.raw_loss if self.raw_loss is not None else self.loss
            if self.update is not None and self.losses:  # the micro-batches it applies
                loss = self._guard(step_loss, self.losses, loss)
            if self._guard(scaling_artifact, extra, loss):
                loss = None
            with self.ours():  # the monitor's own device work (devnorm's jit) is no step
                inputs = StepInputs(
                    loss=loss,
                    grads=grads,
                    grad_norm=grad_norm,
                    grad_scale=scale,
                    lr=self.lr,
                    batch_size=self.batch_size,
                    global_step=global_step,
                    params=params,
                    optimizer=self._optimizer(),
                    extra=extra or None,
                    param_norms=self.param_norms,
                )
        else:
            inputs = StepInputs(batch_size=self.batch_size)
        if opt is not None and not self._parts.order:
            # the first part: a loop whose namespace holds two or more optimizers may
            # step them in turn; then the next part tells (collect.parts)
            self._parts.hold_first = bool(self._guard(self._several_optimizers))
        part = Part(opt, inputs, self.collect, waited, compute, now)
        steps = self.monitor.guard("grouping optimizer steps", self._parts.add, part)
        if steps is None:  # (a failure of ours: the part is recorded as a step)
            steps = [[part]]
        for parts in steps:
            self._record_parts(parts)
        self._reset()
        if not steps:  # the step goes on: the next optimizer's part comes
            self._t_end = time.perf_counter()
            return
        self.collect = rec.will_collect(rec.step_count)
        try:
            rec.boundary(raise_stop=True)
        finally:
            self._t_end = time.perf_counter()  # our own boundary work is not data time

    def _wants_root(self) -> bool:
        """Whether a nested cell call is the first of a collected PyNative step's
        forward pass (the network ``collect.activations`` hooks), not the optimizer's
        or ``Model.train``'s."""
        forward = self._in_forward or self.kind == "train_cell"
        return bool(forward and not self._in_opt and not self._in_model)

    def _activations(self) -> dict[str, float]:
        """The step's ``act/...`` values; a compiled step, which runs no hook, says so."""
        acts = self.acts
        compiled = self.kind in ("jit", "train_cell") and acts.graph is not None
        if acts.wants_root and self.kind in ("jit", "train_cell") and acts.graph is None:
            acts.compiled("jit step" if self.kind == "jit" else "train cell")
        return acts.take(compiled)

    def _several(self, seen: GradSeen) -> dict[str, float]:
        """Two or more optimizers stepped inside the step's one call (``collect.several``):
        each one's values, or none and one warning where they cannot be told apart."""
        if not self.inner:  # a graph: the tap's calls, by fingerprint
            calls = attribute(seen.calls, optimizers_held(self.owner))
            count, lrs = len(seen.calls), self.lrs
        else:  # PyNative: each inner call seen, with its gradients
            norms = []
            for opt, grads, _ in self.inner:
                norm = norm_now(grads) if grads is not None else None
                factor, _ = received_factor(opt, to_float)
                norms.append((opt, None if norm is None or factor is None else norm * factor))
            calls = None if any(n is None for _, n in norms) else grouped(norms)
            count, lrs = len(self.inner), {id(o): lr for o, _, lr in self.inner if lr is not None}
        warn = self.monitor.warn_once
        return values_for(calls, count, self.outputs, lrs, self._namer, warn)

    def _record_parts(self, parts: list[Part]) -> None:
        """Record one step made of ``parts`` (``collect.parts``): a plain step as it
        is; an iteration of several optimizers with each one's values as its own
        ``opt/<name>/...`` series and no whole-step ``train/loss``/grad_norm/lr."""
        rec = self.monitor
        for part in parts:
            rec.add_timing(part.data_secs, part.compute_secs)
        last = parts[-1]
        if not self._parts.multi:
            collect = last.collect and (not last.held or rec.will_collect(rec.step_count))
            rec.record_step(last.inputs, collect=collect, ended=last.ended)
            return
        collect = parts[0].collect
        extra = None
        if collect:
            names = self._names_now()
            named = [
                (names[id(p.key)], rec.part_values(p.inputs))
                for p in parts
                if p.collect and p.key is not None and id(p.key) in names
            ]
            extra = merge(named) or None
        inputs = StepInputs(batch_size=parts[0].inputs.batch_size, extra=extra)
        rec.record_step(inputs, collect=collect, ended=last.ended)

    def _names_now(self) -> dict[int, str]:
        """Each optimizer's series name (``parts.derive_names``), kept once given: the
        first time two step, and again for one that joins later. Says once what the
        steps are from now on."""
        order = self._parts.order
        if any(id(o) not in self._namer.names for o in order):
            names = self._namer(order)
            listed = ", ".join(names[id(o)] for o in order)
            since = self._parts.switched_at
            before = (
                f"; the first {since} steps trained {listed.split(', ')[0]} alone and "
                "were recorded as plain steps"
                if since
                else ""
            )
            self.monitor.warn_once(
                "several optimizers",
                f"{len(order)} optimizers step in this loop ({listed}): one step is one "
                "iteration of the loop, and each optimizer's loss, grad_norm, "
                "grad_norm_clipped and learning_rate are recorded as opt/<name>/...; "
                "train/loss, train/grad_norm and train/learning_rate are not recorded (they "
                f"would mix networks){before}. Name them with mon.watch(names={{...}})",
            )
        return self._namer.names

    def _several_optimizers(self) -> bool:
        """Whether the loop's namespace holds two or more optimizers (directly or in a
        train cell): read only, once, at the first part."""
        from mindspore import nn

        seen: list[Any] = []
        for space in user_namespaces():
            for value in list(space.values()):
                held = value if is_optimizer(value) or is_torch_optimizer(value) else None
                if held is None and isinstance(value, nn.Cell):
                    held = getattr(value, "optimizer", None)  # a train cell's
                mine = held is not None and (is_optimizer(held) or is_torch_optimizer(held))
                if mine and not any(held is o for o in seen):
                    seen.append(held)
        return len(seen) > 1

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
        """The step's optimizer for the optimizer state: the one called from Python, else
        the one its graph-mode train cell or jit step holds."""
        return self._step_optimizer() if self._wants("optimizer_state") else self.opt

    def _step_optimizer(self) -> Any:
        """The optimizer called from Python, else the one the step's graph-mode train
        cell or jit step holds (looked up once per cell or step function)."""
        if self.opt is not None or self.owner is None:
            return self.opt
        known = self._owners.get(id(self.owner))
        if known is None or known[0] is not self.owner:
            known = (self.owner, self._guard(find_optimizer, self.owner))
            self._owners[id(self.owner)] = known
        return known[1]

    def _optimizer_scale(self) -> float | None:
        """The loss scale the step's optimizer undoes itself (``loss_scale=`` in its own
        way: ``collect.unscale``), where it holds one; None for most."""
        opt = self.opt if self.opt is not None else self._step_optimizer()
        if opt is None:
            return None
        factor, _ = received_factor(opt, to_float)
        return 1.0 / factor if factor and factor != 1.0 else None

    def _held_optimizers(self, owner: Any) -> list[Any]:
        """The optimizers a train cell or jit step holds (``several.optimizers_held``),
        looked up once per owner."""
        known = self._held.get(id(owner))
        if known is None or known[0] is not owner:
            known = (owner, self._guard(optimizers_held, owner) or [])
            self._held[id(owner)] = known
        return known[1]

    def _holds_buffer(self) -> bool | None:
        """Whether the step's train cell holds a gradient accumulation buffer
        (``collect.accumulation``), read once per cell. None for other steps: a jit step
        may accumulate across calls in Python (``calls``), so counts still decide there."""
        owner = self.owner if self.kind == "train_cell" else None
        if owner is None:
            return None
        known = self._buffers.get(id(owner))
        if known is None or known[0] is not owner:
            known = self._buffers[id(owner)] = (owner, self._guard(holds_buffer, owner))
        return known[1]

    def _tapped_names(self) -> tuple[str, ...]:
        """The names of the parameters whose gradient norms the optimizer tap keeps for
        this step's optimizer (``gradtaps.tapped_names``), looked up once per optimizer."""
        from msmon_nb.collect.gradtaps import tapped_names

        optimizer = self._step_optimizer()
        if optimizer is None:
            return ()
        known = self._names.get(id(optimizer))
        if known is None or known[0] is not optimizer:
            known = self._names[id(optimizer)] = (optimizer, tapped_names(optimizer))
        return known[1]

    def _why(self) -> str:
        if self.jit_ran and self.scalar_declined:
            return (
                "the jit step returns gradients and a one-element tensor beside them, and "
                "nothing proves that tensor is their norm (MindYOLO's loss_items sits "
                "there), so it is not recorded as one; its graph's update was not seen"
            )
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
        if not {"_pynative_func_grad_backward", "grad"} & set(self._patches.names()):
            return "this MindSpore's PyNative gradients could not be hooked (see the warning)"
        return "no gradients passed through a grad function or an optimizer this step"
