"""One conformance case: a tiny model trained twice, unmonitored and monitored, compared.

A case picks an optimizer (``optimizers.BUILD``), an lr form, a loop shape, a scaling or
clipping recipe and a collection frequency. Both arms build the same model from the same
seed and see the same batches. The plain arm also records, before each step, what the
contract says the monitor must find: the loss the step returns, the lr the form gives at
the optimizer's ``global_step``, whether the step overflowed or applied an update, and
the gradient norm of the unscaled loss in float64 (before clipping; the mean gradient of
the micro-batches under accumulation). ``check`` then asserts that monitoring changed
nothing (every Parameter of the model, the optimizer, the loss scaler and the train cell
bit-identical) and recorded what it should (loss and lr exactly, grad_norm to 1e-3, loss
scale, overflow), with no exception and no alert.

The loop shapes are the ways users write MindSpore training:

* ``pynative``: a ``value_and_grad`` + optimizer loop under ``mon.watch()``;
* ``jit``: the same step decorated with ``@ms.jit``, under ``mon.watch()``;
* ``cell``: a train cell in GRAPH_MODE driven by hand (``nn.TrainOneStepCell``, or a
  cell of ours for scaling, clipping and accumulation), under ``mon.watch()``;
* ``model``: ``Model.train`` in GRAPH_MODE with ``mon.callback()``.

Precision: float32, or MindSpore's mixed precision ``O2``/``O3`` (``amp.auto_mixed_precision``,
``Model(..., amp_level=...)``): float16 forward and backward.

Who undoes the loss scale (``scaling``): the train cell or amp scaler (``static``,
``dynamic``); the optimizer's own ``loss_scale=`` behind ``TrainOneStepCell(sens=S)``,
which is what ``Model(..., loss_scale_manager=FixedLossScaleManager(S,
drop_overflow_update=False))`` builds (``optscale``: ``nn.Optimizer``'s ``scale_grad``,
or the optimizer's own ``construct`` as MindCV's AdamW and Lion do theirs, or nothing, as
MindCV's NAdam); MindCV's ``create_trainer(loss_scale_type="fixed", loss_scale=S,
drop_overflow_update=False)`` with ``create_optimizer(loss_scale=S)`` (``trainer``); and
its ``drop_overflow_update=True`` form (``trainer_drop``: the optimizer's scale 1, a
``TrainOneStepWithLossScaleCell`` with a ``FixedLossScaleUpdateCell``, as
``build_train_network`` makes it on a device; on the CPU ``create_trainer`` refuses it, so
it is built as MindSpore would build it, with the CPU overflow check of ``suites``).

Loss scaling follows MindSpore's own recipes: ``mindspore.amp``'s scalers in function
steps (the mixed-precision tutorial's ``all_finite`` / ``adjust``), a ``scale_sense`` and
``nn.DynamicLossScaleUpdateCell`` in cells (MindSpore's ``TrainOneStepWithLossScaleCell``
checks overflow with NPU-only kernels, so the cell checks with ``amp.all_finite``). The
dynamic scale starts at 2**120 and the first batch's inputs are scaled by 1e4: its scaled
gradients overflow float32 (the injected overflow), the scale drops by 16 and rises back
after two good steps.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.amp import DynamicLossScaler, StaticLossScaler, all_finite
from mindspore.train import Callback, FixedLossScaleManager, Model

from tests.conformance.optimizers import BUILD

LOOPS = ("pynative", "jit", "cell", "model")
LR_FORMS = ("float", "list", "schedule", "group", "parameter")
SCALINGS = ("none", "static", "dynamic", "clip", "accumulate", "optscale")
# MindCV's trainer, both drop_overflow_update forms (model loop, MindCV's names)
TRAINER = ("trainer", "trainer_drop")
# a jit step per micro-batch returning its unscaled gradients, no optimizer in its graph;
# the host sums them and calls the optimizer every MICRO-th (MindYOLO's ms_jit Trainer
# with accumulate > 1): jit loop only, kept off the pairwise axes
HOST = ("host_accumulate",)
# who undoes the loss scale: the cell or amp scaler, the optimizer, MindCV's trainer
UNDO = ("static", "optscale", *TRAINER)
FREQS = (1, 3)
PRECISIONS = ("fp32", "O2", "O3")

STEPS, BATCH, FEATURES, HIDDEN, CLASSES = 6, 8, 8, 16, 3
LR = 0.01
LR_LIST = [0.01 * (1 + (i % 4)) for i in range(4 * STEPS)]  # varies at every step
LR_CHANGED_AT, LR_CHANGED_TO = 3, 0.005  # the "parameter" form: set by hand before step 3
STATIC_SCALE = 1024.0
# the dynamic scale: 2**120, divided by 16 on an overflow, multiplied by 16 after two good
# steps (never past float32's range in STEPS steps); the first batch's inputs x 1e4 make
# its scaled gradients overflow (its unscaled ones are finite): the injected overflow
DYNAMIC_SCALE, DYNAMIC_FACTOR, DYNAMIC_WINDOW, POISON = 2.0**120, 16, 2, 1e4
CLIP = 0.05  # below every step's gradient norm here, so every step clips
# suites whose train cells accumulate with MindSpore's own accumulation op
# (``mindspore.boost.grad_accumulation``), seen inside their graphs: micro_grad_norm
MICRO_IN_GRAPH = ("mindcv", "mindone", "mindocr")
MICRO = 2  # micro-batches per update under "accumulate"
# (clip_accumulate: a suite cell's only; host_accumulate: a jit loop's only)
ACCUMULATING = ("accumulate", "clip_accumulate", *HOST)
SPLIT = 3  # the plain arm's steps before the monitored arm; the rest train after it


@dataclass(frozen=True)
class Case:
    optimizer: str
    loop: str = "model"
    lr: str = "list"
    scaling: str = "none"
    freq: int = 1
    suite: str = ""  # a suite's own train cell (suites.SUITES) instead of ours
    precision: str = "fp32"  # or mixed precision O2/O3
    # the monitor also records the inside of the model (INSIDE: activations, their
    # gradients, every param_stat_kinds of weights, gradients and moments)
    inside: bool = False

    @property
    def id(self) -> str:
        cell = f"{self.suite}-" if self.suite else ""
        amp = f"-{self.precision}" if self.precision != "fp32" else ""
        more = "-inside" if self.inside else ""
        return (
            f"{cell}{self.optimizer}-{self.loop}-{self.lr}-{self.scaling}-f{self.freq}{amp}{more}"
        )

    @property
    def line(self) -> str:
        """The case as a line of ``cases.py`` (``FOUND``)."""
        args = [repr(self.optimizer), repr(self.loop), repr(self.lr), repr(self.scaling)]
        args.append(str(self.freq))
        if self.suite:
            args.append(f"suite={self.suite!r}")
        if self.precision != "fp32":
            args.append(f"precision={self.precision!r}")
        if self.inside:
            args.append("inside=True")
        return f"Case({', '.join(args)})"


def supported(case: Case) -> bool:
    """Whether the case can exist: the optimizer trains in the loop (``Spec.pynative``)
    and takes the lr form; ``Model`` takes the
    optimizer (``nn.Optimizer`` only: "The type of 'optimizer' should be one of
    '['Optimizer', ...]'" for the experimental API's); a suite's train cell is a cell
    (driven by hand or by ``Model``) around an ``nn.Optimizer``, and only it has EMA."""
    spec = BUILD[case.optimizer]
    if case.loop == "pynative" and not spec.pynative:
        return False
    if case.precision != "fp32" and case.scaling == "dynamic":
        return False  # 2**120 overflows float16 on every step: no update to compare
    if case.scaling == "clip_accumulate" and case.suite not in ("mindone", "mindocr"):
        return False  # clipping the accumulated gradient (MindCV clips each micro-batch)
    if case.suite:
        return case.loop in ("cell", "model") and spec.family == "nn" and case.lr in spec.forms
    if case.scaling == "ema":
        return False
    if case.scaling in HOST and (case.loop != "jit" or not spec.pynative):
        return False  # (its optimizer is called from Python: an update in PyNative)
    if case.scaling == "optscale" and not (case.loop in ("cell", "model") and spec.loss_scale):
        return False  # a train cell's sens, undone by the optimizer's own loss_scale=
    if case.scaling == "trainer" and not (case.loop == "model" and spec.mindcv):
        return False  # MindCV's create_trainer, over its create_optimizer
    if case.scaling == "trainer_drop" and not (case.loop in ("cell", "model") and spec.mindcv):
        return False
    if case.loop == "model" and spec.family == "experimental":
        return False
    return case.lr in spec.forms


def default_lr(optimizer: str) -> str:
    """The lr form every optimizer is run with at the default: a list schedule (it moves
    ``global_step``), where the optimizer takes one."""
    return "list" if "list" in BUILD[optimizer].forms else "float"


@dataclass
class Arm:
    """What one run did, step by step (index = the loop's step, from 0)."""

    losses: list[float] = field(default_factory=list)
    lrs: list[float | None] = field(default_factory=list)  # plain arm: the form's lr
    applied: list[bool] = field(default_factory=list)  # plain arm: the weights moved
    overflow: list[bool] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    norms: list[float | None] = field(default_factory=list)  # plain arm: the reference
    micro: list[float] = field(default_factory=list)  # plain arm: largest micro-batch norm
    own: list[float] = field(default_factory=list)  # plain arm: the step's last batch's norm
    weights: list[dict] = field(default_factory=list)  # plain arm: at each step's start
    state: dict[str, np.ndarray] = field(default_factory=dict)
    run: Any = None
    alerts: list = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# --- the model, data, lr forms ---------------------------------------------------------


def network(precision: str = "fp32") -> nn.Cell:
    """The MLP; under ``O2``/``O3`` as ``amp.auto_mixed_precision`` makes it (float16
    inside, float32 out; the Parameters stay float32)."""
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(FEATURES, HIDDEN), nn.ReLU(), nn.Dense(HIDDEN, CLASSES)])
    if precision != "fp32":
        net = ms.amp.auto_mixed_precision(net, precision)
    return net


def loss_function() -> nn.Cell:
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def batches(count: int, poison: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` batches; ``poison``: the first one's inputs x ``POISON``."""
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(CLASSES, FEATURES)).astype(np.float32)
    out = []
    for i in range(count):
        y = rng.integers(0, CLASSES, size=BATCH).astype(np.int32)
        x = (centres[y] + rng.normal(size=(BATCH, FEATURES))).astype(np.float32)
        out.append((x * POISON if poison and i == 0 else x, y))
    return out


def schedule() -> nn.LearningRateSchedule:
    return nn.ExponentialDecayLR(LR, 0.8, 1)


def lr_argument(form: str, params: list) -> tuple[Any, Any]:
    """(params as the optimizer is given them, its lr argument) for an lr form."""
    if form == "list":
        return params, list(LR_LIST)
    if form == "schedule":
        return params, schedule()
    if form == "group":  # the first group's lr is a list schedule, the second a float
        return [{"params": params[:2], "lr": list(LR_LIST)}, {"params": params[2:], "lr": LR}], LR
    return params, LR


def form_lr(form: str, step: int, global_step: int | None) -> float:
    """The lr a step uses under a form: what the monitor must record (float32 values)."""
    if form in ("list", "group"):
        return float(np.float32(LR_LIST[global_step]))
    if form == "schedule":
        with pynative():
            value = schedule()(Tensor(global_step, ms.int32))
        return float(value.asnumpy())
    if form == "parameter" and step >= LR_CHANGED_AT:
        return float(np.float32(LR_CHANGED_TO))
    return float(np.float32(LR))


def set_lr(optimizer: Any, value: float) -> None:
    """Change an lr Parameter by hand, as users (and ``LearningRateScheduler``) do."""
    groups = getattr(optimizer, "param_groups", None)
    target = groups[0]["lr"] if groups else optimizer.learning_rate
    ops.assign(target, Tensor(value, ms.float32))


def global_step(optimizer: Any) -> int | None:
    counter = getattr(optimizer, "global_step", None)
    return None if counter is None else int(counter.asnumpy().reshape(-1)[0])


@contextmanager
def pynative() -> Iterator[None]:
    mode = ms.get_context("mode")
    if mode != ms.PYNATIVE_MODE:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        if mode != ms.PYNATIVE_MODE:
            ms.set_context(mode=mode)


# --- the float64 reference ---------------------------------------------------------------


def reference_norms(
    weights: list[dict], windows: list[list], suite: str = "", precision: str = "fp32"
) -> tuple[list, list, list]:
    """For each step: (norm of the mean gradient of the unscaled loss over its batches,
    largest norm of one batch's, the norm of its last batch's -- the step's own, where a
    cell accumulates across calls), in float64, with the weights the step started from.

    Taken after the plain run, in PyNative on a fresh copy of the model that is given each
    step's weights: no graph to compile (in a graph-mode case it would be a third), and
    the plain run itself is only ever trained. A suite that rebuilds the network before
    training it (MindSpore's boost) gets its rebuilt network (``suites.reference_network``).
    """
    with pynative():
        net = network(precision)
        if suite:
            from tests.conformance.suites import reference_network

            net = reference_network(suite, net)
        params = {p.name: p for p in net.trainable_params()}
        loss_fn = loss_function()

        def forward(x, y):
            return loss_fn(net(x), y)

        grad = ms.value_and_grad(forward, None, list(params.values()))
        norms, largest, lasts = [], [], []
        for step_weights, micro in zip(weights, windows, strict=True):
            for name, value in step_weights.items():
                # a suite's cells may prefix the names (MindCV's accumulation cell holds
                # the optimizer: "optimizer.0.weight")
                (own,) = [n for n in params if name == n or name.endswith("." + n)]
                params[own].set_data(Tensor(value))
            norm, big, last = _norm(grad, micro)
            norms.append(norm)
            largest.append(big)
            lasts.append(last)
    return norms, largest, lasts


def _norm(grad: Callable, micro: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float, float]:
    total, largest, last = None, 0.0, 0.0
    for x, y in micro:
        _, grads = grad(Tensor(x), Tensor(y))
        arrays = [g.asnumpy().astype(np.float64) for g in grads]
        last = math.sqrt(sum(float((a * a).sum()) for a in arrays))
        largest = max(largest, last)
        total = arrays if total is None else [a + b for a, b in zip(total, arrays, strict=True)]
    mean = math.sqrt(sum(float(((g / len(micro)) ** 2).sum()) for g in total))
    return mean, largest, last


# --- the steps users write ---------------------------------------------------------------


def function_step(net, optimizer, scaling: str, jit: bool) -> tuple[Callable, Any]:
    """A value_and_grad step as MindSpore's tutorials write it; returns (step, scaler).
    ``step(x, y)`` (or ``step(x1, y1, x2, y2)`` under accumulation) returns the loss
    (the last micro-batch's, unscaled) and whether the gradients were finite."""
    loss_fn = loss_function()
    scaler = None
    if scaling in ("static", *HOST):
        scaler = StaticLossScaler(STATIC_SCALE)
    elif scaling == "dynamic":
        scaler = DynamicLossScaler(DYNAMIC_SCALE, DYNAMIC_FACTOR, DYNAMIC_WINDOW)
    params = net.trainable_params()

    def forward(x, y):
        loss = loss_fn(net(x), y)
        if scaler is not None:
            loss = scaler.scale(loss)
        return loss

    grad_fn = ms.value_and_grad(forward, None, params)

    def apply(loss, grads):
        if scaler is not None:
            loss = scaler.unscale(loss)
        finite = all_finite(grads) if scaling == "dynamic" else Tensor(True)
        if finite:
            if scaler is not None:
                grads = scaler.unscale(grads)
            if scaling == "clip":
                grads = ops.clip_by_global_norm(grads, CLIP)
            optimizer(grads)
        if scaling == "dynamic":
            scaler.adjust(finite)
        return loss, finite

    def step(x, y):
        loss, grads = grad_fn(x, y)
        return apply(loss, grads)

    def accumulated(x1, y1, x2, y2):
        _, first = grad_fn(x1, y1)
        loss, second = grad_fn(x2, y2)
        grads = tuple((a + b) / MICRO for a, b in zip(first, second))  # noqa: B905 (graph)
        return apply(loss, grads)

    if scaling in HOST:
        return _host_accumulation(grad_fn, optimizer, scaler)
    fn = accumulated if scaling == "accumulate" else step
    return (ms.jit(fn) if jit else fn), scaler


def _host_accumulation(grad_fn: Callable, optimizer: Any, scaler: Any) -> tuple[Callable, Any]:
    """MindYOLO's ``ms_jit`` step with ``optimizer_update=False`` and its Trainer's
    accumulation: each micro-batch one jit call that scales the loss (a static amp
    scaler), unscales and returns ``(loss, grads)`` with no optimizer in its graph; the
    host adds the gradients up and calls the optimizer with their mean every MICRO-th.
    ``scaler``: the static scaler ``grad_fn``'s forward scales with."""

    @ms.jit
    def micro_step(x, y):
        loss, grads = grad_fn(x, y)
        return scaler.unscale(loss), scaler.unscale(grads)

    def step(*pairs):
        total = None
        for x, y in zip(pairs[::2], pairs[1::2], strict=True):
            loss, grads = micro_step(x, y)
            total = grads if total is None else [a + b for a, b in zip(total, grads, strict=True)]
        optimizer(tuple(g / MICRO for g in total))
        return loss, Tensor(True)

    return step, scaler


class TrainCell(nn.Cell):
    """A train cell for scaling, clipping and accumulation, written as MindSpore's (and the
    suites') cells are: ``GradOperation`` with a sensitivity, unscale, overflow check,
    ``DynamicLossScaleUpdateCell``, ``ops.clip_by_global_norm``, an accumulation buffer
    applied on every ``MICRO``-th call. Returns (loss, whether it updated)."""

    def __init__(self, net: nn.Cell, optimizer: Any, scaling: str) -> None:
        super().__init__(auto_prefix=False)
        self.network = nn.WithLossCell(net, loss_function())
        self.optimizer = optimizer
        self.weights = ParameterTuple(net.trainable_params())
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.hyper_map = ops.HyperMap()
        self.scaling = scaling
        scale = {"static": STATIC_SCALE, "dynamic": DYNAMIC_SCALE}.get(scaling, 1.0)
        self.scale_sense = Parameter(Tensor(scale, ms.float32), name="scale_sense")
        self.updater = None
        if scaling == "dynamic":
            self.updater = nn.DynamicLossScaleUpdateCell(scale, DYNAMIC_FACTOR, DYNAMIC_WINDOW)
        self.accumulate = scaling == "accumulate"
        if self.accumulate:
            self.buffer = self.weights.clone(prefix="accumulated", init="zeros")
            self.micro = Parameter(Tensor(0, ms.int32), name="micro_step")

    def construct(self, x, y):
        loss = self.network(x, y)
        sens = ops.ones_like(loss) * self.scale_sense
        grads = self.grad(self.network, self.weights)(x, y, sens)
        grads = self.hyper_map(ops.partial(_unscale, self.scale_sense), grads)
        applied = Tensor(True)
        if self.scaling == "dynamic":
            overflow = ops.logical_not(all_finite(grads))
            overflow = self.updater(self.scale_sense, overflow)
            applied = ops.logical_not(overflow)
            if applied:
                loss = ops.depend(loss, self.optimizer(grads))
        elif self.accumulate:
            loss = ops.depend(loss, self.hyper_map(_accumulate, self.buffer, grads))
            loss = ops.depend(loss, ops.assign_add(self.micro, Tensor(1, ms.int32)))
            applied = self.micro >= MICRO
            if applied:
                loss = ops.depend(loss, self.optimizer(self.buffer))
                loss = ops.depend(loss, self.hyper_map(_clear, self.buffer))
                loss = ops.depend(loss, ops.assign(self.micro, Tensor(0, ms.int32)))
        else:
            if self.scaling == "clip":
                grads = ops.clip_by_global_norm(grads, CLIP)
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, applied


_unscale = ops.MultitypeFuncGraph("conformance_unscale")
_accumulate = ops.MultitypeFuncGraph("conformance_accumulate")
_clear = ops.MultitypeFuncGraph("conformance_clear")


@_unscale.register("Tensor", "Tensor")
def _unscale_tensor(scale, grad):
    return grad / scale


@_accumulate.register("Tensor", "Tensor")
def _accumulate_tensor(buffer, grad):
    return ops.assign_add(buffer, grad / MICRO)


@_clear.register("Tensor")
def _clear_tensor(buffer):
    return ops.assign(buffer, ops.zeros_like(buffer))


# --- the two arms ------------------------------------------------------------------------


def run_case(case: Case, tmp_path: Any) -> tuple[Arm, Arm]:
    """Train ``case`` unmonitored and monitored; (plain arm, monitored arm).

    The plain arm's first ``SPLIT`` steps, then the whole monitored arm, then the plain
    arm's other steps: the plain arm is a second instance beside the monitored one and
    trains after its monitor closed. Every attribute the monitor replaced on a class or a
    module must be the original again once it closed (``patched.leftovers``)."""
    from tests.conformance.patched import leftovers, snapshot

    mode = ms.GRAPH_MODE if case.loop in ("cell", "model") else ms.PYNATIVE_MODE
    before = ms.get_context("mode")
    ms.set_context(mode=mode)
    try:
        plain = Training(case, None)
        plain.steps(0, SPLIT)
        held = snapshot()
        monitored = Training(case, tmp_path)
        monitored.steps(0, STEPS)
        monitored.finish()
        left = leftovers(held, snapshot())
        plain.steps(SPLIT, STEPS)
        plain.finish()
    finally:
        ms.set_context(mode=before)
    assert not left, f"not the original after the monitor closed: {left}"
    return plain.arm, monitored.arm


class Training:
    """One arm: the case's model, optimizer and loop, trained a range of steps at a time
    (``steps``), then ``finish``ed (its state read; the plain arm's reference norms)."""

    def __init__(self, case: Case, save_dir: Any) -> None:
        self.case, self.save_dir = case, save_dir
        self.plain = save_dir is None
        self.arm = Arm()
        # Model's amp_level converts the network itself (the user's form); elsewhere
        # amp.auto_mixed_precision does, as MindCV's custom train steps do
        by_model = case.loop == "model" and _model_builds(case)
        self.net = network("fp32" if by_model else case.precision)
        params, lr = lr_argument(case.lr, self.net.trainable_params())
        scale = STATIC_SCALE if case.scaling in ("optscale", "trainer") else 1.0
        self.optimizer = BUILD[case.optimizer].build(params, lr, loss_scale=scale)
        looped = case.loop in ("pynative", "jit")
        micro = MICRO if case.scaling in ACCUMULATING and looped else 1
        data = batches(STEPS * micro, poison=case.scaling == "dynamic")
        self.batches = [data[i * micro : (i + 1) * micro] for i in range(STEPS)]
        self.windows = self.batches
        if case.scaling in ACCUMULATING and micro == 1:
            # a cell accumulating across calls applies, on every MICRO-th, the mean
            # gradient of that call's batch and the ones before it since the last update
            self.windows = [data[i - i % MICRO : i + 1] for i in range(STEPS)]
        self.model: Any = None
        self.step: Any = None
        self.scale: Any = None  # the train cell or amp scaler holding the loss scale
        if case.loop == "model":
            self.model = model_of(case, self.net, self.optimizer)
            self.scale = self.model.train_network
        elif case.loop == "cell":
            self.step = self.scale = train_cell(case, self.net, self.optimizer)
        else:
            jit = case.loop == "jit"
            self.step, self.scale = function_step(self.net, self.optimizer, case.scaling, jit)

    def steps(self, start: int, stop: int) -> None:
        """Train steps ``start`` to ``stop`` (monitored, when this is that arm)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _monitored(self.save_dir, self.case, self.arm) as mon:
                if self.model is not None:
                    self._model_steps(start, stop, mon)
                else:
                    self._loop_steps(start, stop, mon)
        ours = [str(w.message) for w in caught if w.category.__module__.startswith("msmon")]
        self.arm.warnings += ours

    def _loop_steps(self, start: int, stop: int, mon: Any) -> None:
        """The three loops under ``mon.watch()`` (unmonitored when ``mon`` is None)."""
        case, optimizer, arm, plain = self.case, self.optimizer, self.arm, self.plain
        with mon.watch() if mon is not None else _nothing():
            for i in range(start, stop):
                weights = _before_step(case, i, optimizer, arm, plain, self.scale)
                out = self.step(*[Tensor(a) for pair in self.batches[i] for a in pair])
                _after_step(case, out, weights, optimizer, arm, self.scale)

    def _model_steps(self, start: int, stop: int, mon: Any) -> None:
        x = np.concatenate([m[0][0] for m in self.batches[start:stop]])
        y = np.concatenate([m[0][1] for m in self.batches[start:stop]])
        dataset = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
        steps = _Steps(self.case, self.optimizer, self.arm, self.plain, self.scale, start)
        callbacks = [steps] if mon is None else [steps, mon.callback()]
        self.model.train(1, dataset, callbacks=callbacks, dataset_sink_mode=False)

    def finish(self) -> None:
        cells = [self.scale] if self.scale is not None else []
        self.arm.state = state_of(self.net, self.optimizer, *cells)
        if self.plain:
            case = self.case
            self.arm.norms, self.arm.micro, self.arm.own = reference_norms(
                self.arm.weights, self.windows, case.suite, case.precision
            )


def _before_step(case, i, optimizer, arm, plain, scale) -> list:
    """What a step starts from: the by-hand lr change, and (plain arm) the form's lr, the
    weights (for the reference norms) and the loss scale in force. Returns the weights,
    to see them move."""
    if case.lr == "parameter" and i == LR_CHANGED_AT:
        set_lr(optimizer, LR_CHANGED_TO)
    params = trained(case, optimizer, scale)
    weights = [p.asnumpy().copy() for p in params]
    if plain:
        counter = global_step(optimizer)
        if case.suite:
            from tests.conformance.suites import schedule_index

            counter = schedule_index(case.suite, counter, i)
        arm.lrs.append(form_lr(case.lr, i, counter))
        arm.weights.append({p.name: w for p, w in zip(params, weights, strict=True)})
    held = getattr(scale, "scale_sense", None)  # a train cell's; an amp scaler's:
    held = getattr(scale, "scale_value", None) if held is None else held
    arm.scales.append(float(held.asnumpy()) if held is not None else 1.0)
    return weights


def trained(case: Case, optimizer: Any, cell: Any) -> list:
    """The Parameters the step updates: the optimizer's, or those of the optimizer a
    suite's train cell put in its place (``suites.trained_params``)."""
    if case.suite:
        from tests.conformance.suites import trained_params

        return trained_params(case.suite, optimizer, cell)
    return list(optimizer.parameters)


def _after_step(case, out, weights, optimizer, arm, cell=None) -> None:
    """The loss the step returned (first output), and whether it updated the weights."""
    loss = out[0] if isinstance(out, tuple | list) else out
    arm.losses.append(float(loss.asnumpy()))
    now = [p.asnumpy() for p in trained(case, optimizer, cell)]
    arm.applied.append(any(not np.array_equal(a, b) for a, b in zip(weights, now, strict=True)))
    arm.overflow.append(case.scaling == "dynamic" and not arm.applied[-1])


def train_cell(case, net, optimizer) -> nn.Cell:
    """The train cell of the ``cell`` and ``model`` loops: MindSpore's ``TrainOneStepCell``
    when nothing scales, clips or accumulates (with ``sens`` the loss scale the optimizer
    undoes under ``optscale``), MindSpore's ``TrainOneStepWithLossScaleCell`` over a
    ``FixedLossScaleUpdateCell`` (MindCV's ``trainer_drop``), else ours, or the suite's."""
    if case.suite:
        from tests.conformance.suites import suite_cell

        return suite_cell(case.suite, net, loss_function(), optimizer, case)
    if case.scaling in ("none", "optscale"):
        sens = STATIC_SCALE if case.scaling == "optscale" else 1.0
        return nn.TrainOneStepCell(nn.WithLossCell(net, loss_function()), optimizer, sens)
    if case.scaling == "trainer_drop":
        from tests.conformance.suites import fixed_update_cell

        return fixed_update_cell(nn.WithLossCell(net, loss_function()), optimizer)
    return TrainCell(net, optimizer, case.scaling)


def _model_builds(case: Case) -> bool:
    """Whether ``Model`` (or MindCV's ``create_trainer``) builds the train cell itself."""
    return not case.suite and case.scaling in ("none", "optscale", "trainer")


def model_of(case: Case, net: nn.Cell, optimizer: Any) -> Model:
    """The ``Model`` of the ``model`` loop, as users make it: ``Model(net, loss, opt)``
    (``amp_level`` the case's precision; on the CPU an fp16 level's default dynamic loss
    scale is refused, so it gets a fixed one, as users there must), with
    ``FixedLossScaleManager(S, drop_overflow_update=False)`` under ``optscale``; MindCV's
    ``create_trainer`` under ``trainer``; else ``Model`` over the case's train cell."""
    amp = "O0" if case.precision == "fp32" else case.precision
    if case.scaling == "trainer" and not case.suite:
        from mindcv.utils.trainer_factory import create_trainer

        return create_trainer(
            net, loss_function(), optimizer, None, amp_level=amp, amp_cast_list=None,
            loss_scale_type="fixed", loss_scale=STATIC_SCALE, drop_overflow_update=False,
        )  # fmt: skip
    if _model_builds(case):
        scale = STATIC_SCALE if case.scaling == "optscale" else 1.0
        kwargs: dict[str, Any] = {"amp_level": amp}
        if case.scaling == "optscale" or case.precision == "O2":
            kwargs["loss_scale_manager"] = FixedLossScaleManager(scale, drop_overflow_update=False)
        return Model(net, loss_function(), optimizer, **kwargs)
    return Model(train_cell(case, net, optimizer))


class _Steps(Callback):
    """The plain arm's record of a ``Model.train`` step (and the by-hand lr change);
    ``start``: the case's step the ``Model.train`` call began at."""

    def __init__(self, case, optimizer, arm, plain, cell, start: int = 0) -> None:
        super().__init__()
        self.case, self.optimizer = case, optimizer
        self.arm, self.plain, self.cell, self.start = arm, plain, cell, start
        self.weights: list = []

    def on_train_step_begin(self, run_context):
        i = self.start + run_context.original_args().cur_step_num - 1
        self.weights = _before_step(self.case, i, self.optimizer, self.arm, self.plain, self.cell)

    def on_train_step_end(self, run_context):
        out = run_context.original_args().net_outputs
        _after_step(self.case, out, self.weights, self.optimizer, self.arm, self.cell)


@contextmanager
def _monitored(save_dir, case: Case, arm: Arm) -> Iterator[Any]:
    if save_dir is None:
        yield None
        return
    # here, not at the top: the reference process (test_after_close) never imports it
    from msmon_nb.events.runs import load_run
    from msmon_nb.monitor import Monitor

    more = INSIDE if case.inside else {}
    with Monitor(save_dir=str(save_dir), log_interval=case.freq, **more) as mon:
        yield mon
    arm.run = load_run(mon.run_dir)
    arm.alerts = list(mon.alerts)


# what an ``inside`` case's monitor records beside the defaults (issue 45; stable_rank too)
INSIDE = {
    "track_metrics": [
        *("loss", "grad_norm", "learning_rate", "throughput", "step_time", "global_step"),
        *("param_stats", "optimizer_state", "activations", "act_grad", "stable_rank"),
    ],
    "param_stat_kinds": ["norm", "max_abs", "nonfinite", "zero_frac"],
    "stable_rank_every": 1,  # the weights read on every collected step
}


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def state_of(*owners: Any) -> dict[str, np.ndarray]:
    """Every Parameter the model, the optimizer, the scaler and the train cells hold, by
    name (the optimizer's moments, ``global_step``, lr Parameters, the loss scale and its
    counters, accumulation buffers)."""
    out: dict[str, np.ndarray] = {}
    seen: set[int] = set()
    for owner in owners:
        if isinstance(owner, nn.Cell):
            items = list(owner.parameters_and_names())
        else:  # an amp scaler: its Parameters are attributes
            items = [(k, v) for k, v in vars(owner).items() if isinstance(v, Parameter)]
        for name, param in items:
            if id(param) in seen:
                continue
            seen.add(id(param))
            value = param.asnumpy() if param.dtype != ms.bfloat16 else param.float().asnumpy()
            out[f"{type(owner).__name__}:{name}"] = value.copy()
    return out


# --- the verdict -------------------------------------------------------------------------


def check(case: Case, plain: Arm, mon: Arm) -> None:
    """Everything the contract promises for this case, with messages that name the step."""
    assert plain.state.keys() == mon.state.keys(), "monitoring changed which Parameters exist"
    changed = [k for k in plain.state if not np.array_equal(plain.state[k], mon.state[k])]
    assert not changed, f"monitoring changed training state: {changed}"
    assert mon.losses == plain.losses, "monitoring changed the losses the loop saw"
    assert not mon.alerts, [a.message for a in mon.alerts]
    if case.scaling == "dynamic":
        assert any(plain.overflow), "the injected overflow did not happen"
    run = mon.run
    first = 1 if case.loop == "model" else 0  # Model.train counts from 1
    collected = [i for i in range(STEPS) if (i + first) % case.freq == 0]
    assert collected, "no collected step"
    loss = _series(run, "train/loss", first)
    expected_loss = {i: plain.losses[i] for i in collected if not _inf_loss(plain, i)}
    assert loss == expected_loss, "train/loss differs from the loss the loop returned"
    lr = _series(run, "train/learning_rate", first)
    rtol = 1e-6 if case.lr == "schedule" else 0.0
    for i in collected:
        if i in lr or plain.applied[i]:
            assert i in lr, f"no learning_rate at step {i}"
            assert math.isclose(lr[i], plain.lrs[i], rel_tol=rtol), (
                f"learning_rate at step {i}: {lr[i]} recorded, {plain.lrs[i]} used"
            )
    # float16 gradients of the compiled graph and of the PyNative twin round differently
    # (0.32% seen at O3): the norms' tolerance is float16's, 1e-2, as for the trainers'
    tol = 1e-3 if case.precision == "fp32" else 1e-2
    norms = _series(run, "train/grad_norm", first)
    for i in collected:
        expected = plain.norms[i] if plain.applied[i] and not plain.overflow[i] else None
        if expected is None:
            assert i not in norms, f"grad_norm at step {i}, which applied no update"
            continue
        assert i in norms, f"no grad_norm at step {i}; warnings: {mon.warnings}"
        assert math.isclose(norms[i], expected, rel_tol=tol), (
            f"grad_norm at step {i}: {norms[i]} recorded, {expected} by the contract"
        )
    if case.scaling in ("clip", "clip_accumulate"):  # (accumulating: on updates only)
        clipped = _series(run, "train/grad_norm_clipped", first)
        for i in collected:
            if plain.applied[i]:
                assert math.isclose(clipped[i], min(plain.norms[i], CLIP), rel_tol=tol)
    if case.scaling in ACCUMULATING:
        micro = _series(run, "train/micro_grad_norm", first)
        # each micro-batch's gradient is seen where produced, or where a jit step returned it
        if case.loop == "pynative" or case.scaling in HOST:
            for i in collected:
                assert math.isclose(micro[i], plain.micro[i], rel_tol=tol), f"micro at {i}"
        elif case.loop in ("cell", "model") and case.suite in MICRO_IN_GRAPH:
            # each call adds its micro-batch's gradient with MindSpore's accumulation op,
            # which the taps see inside the graph
            assert sorted(micro) == collected, f"micro_grad_norm at {sorted(micro)}"
            for i in collected:
                assert math.isclose(micro[i], plain.own[i], rel_tol=tol), f"micro at {i}"
            assert not any("micro_grad_norm is not recorded" in w for w in mon.warnings)
        elif case.loop in ("cell", "model"):  # inside the cell's graph: said once, not faked
            assert not micro
            assert sum("micro_grad_norm is not recorded" in w for w in mon.warnings) == 1
        # (a jit step taking both micro-batches' gradients inside one graph shows the
        # monitor one update of one gradient: nothing tells it the step accumulates)
    if case.scaling in ("static", "dynamic", "trainer_drop"):
        scales = _series(run, "train/loss_scale", first)
        assert scales == {i: plain.scales[i] for i in collected}, "train/loss_scale"
    if case.scaling in ("optscale", "trainer"):  # the cell's sens: recorded or not, not wrong
        scales = _series(run, "train/loss_scale", first)
        assert all(v == STATIC_SCALE for v in scales.values()), f"train/loss_scale {scales}"
    if case.scaling == "dynamic":
        flags = _series(run, "train/overflow", first)
        assert flags == {i: float(plain.overflow[i]) for i in collected}, "train/overflow"


def _series(run: Any, tag: str, first: int) -> dict[int, float]:
    if tag not in list(run.tags()):
        return {}
    series = run.scalars(tag)
    return {int(s) - first: float(v) for s, v in zip(series.steps, series.values, strict=True)}


def _inf_loss(arm: Arm, i: int) -> bool:
    """An overflow step whose scaled loss overflowed: the monitor drops that Inf."""
    return arm.overflow[i] and math.isinf(arm.losses[i])
