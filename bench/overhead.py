"""Monitoring overhead, plain vs monitored, in one process, blocks alternating.

Model: MLP 784-512-512-10, batch 64, CPU, Momentum.

1. Functional PyNative loop (``value_and_grad`` + optimizer) unchanged under
   ``mon.watch()``, collecting loss, grad_norm and lr every step and every 10th step.
   Targets: <= 1.03 and <= 1.01.
2. ``Model.train`` in graph mode: plain (a model msmon never touched), with our callback
   collecting every step (grad_norm included; target <= 1.05) and every 10th step, and
   with MindSpore's ``SummaryCollector(collect_freq=1)`` (every other round; built once, outside
   the timer, like our monitor); also the callback's own time
   per step and the CPU time per step, which other processes on the machine do not move.
   Each variant runs on ``--instances`` models (identical models differ by several %).
   ``--not-held`` adds every step with ``Monitor.hold_emits`` off (each step's scalars
   passed on as it ends, not in batches): the A/B of that batching. The floor arm runs
   the monitored models with their grad_norm tap on and, instead of our callback, one
   that only reads the step's loss and grad_norm into a list: what any monitor that
   computes grad_norm inside the graph and reads it every step pays before it does
   anything with the numbers. "every step / floor" is then our own bookkeeping, on the
   same models (no instance draw).
   Blame (``monitor_config.blame``, on by default: each parameter's gradient norm kept
   on every collected step) is measured against the same monitor with ``blame:
   {enabled: false}``: in the functional loop on the same net, blocks alternating; in
   ``Model.train`` on models of its own (a blame-off callback on the blame-on model
   would recompile its graph at every switch), with the callbacks' own times beside,
   which no instance draw moves. Target: blame on / off <= 1.01. Blame on pays, after a
   gradient or loss alert (this bench's runs raise ``rising_trend`` ones), a detail
   window: ``param/<name>/grad_norm``, ``weight_norm`` and ``update_ratio`` recorded for
   ``detail_steps`` steps; so a ring-only arm, the same monitor with ``blame:
   {detail_steps: 0}`` (the ring of per-parameter norms kept, no window), is measured
   against blame off beside it (in ``Model.train`` on the blame-on models, whose taps
   it shares), and each line says how many of its steps were inside a window. Target:
   ring only / blame off <= 1.01. In the functional loop a third arm also measures each
   parameter's update ratio (``blame: {update_ratio: true}``, opt-in). Issue 43's budget
   for the per-layer part (the ring row, ``layer_rise``, the update ratios when on) is 1 %
   of a collected step, below what a ratio of block times resolves here: that part
   (``Actions.layer_values``) is timed directly, wall and CPU, and printed as a share of
   the plain step of the same process.
3. The grad_norm reduction inside the train graph alone (one model, its tap switched on
   and off), next to the floor of reading every gradient byte once.
4. Activations and the statistics beyond the norm (issue 45), functional PyNative loop with
   Adam: plain; the core metrics every 10th step; the same plus ``activations`` (the
   default modules: the three Dense layers), plus ``act_grad``, plus ``param_stats`` and
   ``optimizer_state`` with every ``param_stat_kinds``; and activations every step. Each
   ratio is against plain and against the core-only monitor beside it, per round.
   Then ``Model.train`` in GRAPH_MODE (statistics compiled into the graph,
   ``collect.acttaps``): plain, core every 10th, + activations every 10th and every step,
   each on models of its own (``--instances``), one epoch a block.

    python bench/overhead.py [--steps 20] [--rounds 30] [--train-steps 300]
                             [--only functional|model|activations]
                             [--lr-schedule] [--instances 3] [--not-held]

Prints ratios of block times (blocks interleaved, order rotated each round) with their
spread, and the time spent inside the monitor itself per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
from mindspore import nn
from mindspore.train import Callback, Model, SummaryCollector

from msmon_nb.monitor import Monitor

NO_BLAME = {"enabled": False}  # the blame-off arms: the same monitor, no per-parameter norms
# the ring-only arms: blame on (each collected step's per-parameter norms kept in the ring),
# no detail window after an alert (what blame costs on every step, alert or not)
RING_ONLY = {"detail_steps": 0}
DETAIL_TAGS = ("/grad_norm", "/weight_norm", "/update_ratio")


class DetailSteps:
    """Counts a monitor's collected steps and those inside a blame detail window (their
    scalars include ``param/<name>/grad_norm``, ``weight_norm`` or ``update_ratio``),
    by wrapping its public ``emit``, every collected step's one way out."""

    def __init__(self, mon: Monitor) -> None:
        self.steps: set[int] = set()
        self.detail: set[int] = set()
        inner = mon.emit

        def counted(step: int, values: dict[str, float], *a: Any, **k: Any) -> Any:
            self.steps.add(step)
            if any(t.startswith("param/") and t.endswith(DETAIL_TAGS) for t in values):
                self.detail.add(step)
            return inner(step, values, *a, **k)

        mon.emit = counted

    def reset(self) -> None:
        """Forget the steps so far (the compile and warm-up blocks): the timed ones count."""
        self.steps.clear()
        self.detail.clear()

    def __str__(self) -> str:
        return f"{len(self.detail)} of its {len(self.steps)} collected steps in a detail window"


# the two blame lines every section prints, each against blame off: (label, target)
RING_LINE = ("ring only (detail_steps 0) / blame off", " (target <= 1.01)")
ON_LINE = ("blame on / off, detail window after alerts included", "")
# the ring arm with each parameter's update ratio measured too (opt-in: its cost is why)
RATIOS = {"detail_steps": 0, "update_ratio": True}
RATIOS_LINE = ("ring + update ratios (blame.update_ratio) / blame off", "")


class LayerPart:
    """The per-layer part of a monitor's collected step -- keeping the ring row, the
    update ratios when on, and judging ``layer_rise`` (``Actions.layer_values``, and the
    judgement it returns, which runs when the step's scalars are passed on: for a batch
    of held steps in ``Model.train``) -- timed directly (wall and this thread's CPU
    time), both parts summed per collected step, so its share of the whole step is read
    beside the plain step of the same process: a ratio of block times cannot resolve 1 %
    on this machine."""

    def __init__(self, mon: Monitor) -> None:
        self.wall = self.cpu = 0.0
        self.calls = 0
        actions = mon._actions  # the bench reaches in: no public hook times this part
        inner = actions.layer_values

        def clocked(fn: Any, *a: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a)
            finally:
                self.wall += time.perf_counter() - t0
                self.cpu += time.thread_time() - c0

        def timed(*a: Any) -> Any:
            self.calls += 1
            later = clocked(inner, *a)
            return None if later is None else lambda: clocked(later)

        actions.layer_values = timed

    def reset(self) -> None:
        """Forget the calls so far (compile and warm-up): the timed blocks count."""
        self.wall = self.cpu = 0.0
        self.calls = 0

    def line(self, name: str, plain_step: float, plain_cpu: float | None = None) -> str:
        """What the part costs per collected step, against ``plain_step`` (seconds) and,
        given, the plain step's process CPU time (which other processes on a loaded
        machine move less than the wall clock)."""
        n = max(self.calls, 1)
        wall, cpu = self.wall / n, self.cpu / n
        of_cpu = f", {cpu / plain_cpu:.2%} of its CPU time" if plain_cpu else ""
        return (
            f"per-layer part of a collected step ({name}: ring push, layer_rise"
            f"{', update ratios' if 'ratio' in name else ''}), timed directly: "
            f"{wall * 1e6:.0f} us wall, {cpu * 1e6:.0f} us CPU = {wall / plain_step:.2%} of a "
            f"plain step{of_cpu} (target <= 1%)"
        )


def mlp() -> nn.Cell:
    ms.set_seed(0)
    return nn.SequentialCell(
        [nn.Dense(784, 512), nn.ReLU(), nn.Dense(512, 512), nn.ReLU(), nn.Dense(512, 10)]
    )


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 784)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def pynative_loop(steps: int, make_opt: Callable[[list], Any]) -> Callable[[], float]:
    """A ``value_and_grad`` + optimizer loop on the bench MLP in PyNative, warmed up: a
    function that times ``steps`` of it."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = mlp()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = make_opt(net.trainable_params())
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    x, y = data(64 * 8)
    batches = [(ms.Tensor(x[i : i + 64]), ms.Tensor(y[i : i + 64])) for i in range(0, 512, 64)]

    def block() -> float:
        t0 = time.perf_counter()
        for i in range(steps):
            loss, grads = grad_fn(*batches[i % len(batches)])
            opt(grads)
        float(loss.asnumpy())  # wait for the queued work, as a user printing the loss would
        return time.perf_counter() - t0

    block()  # warm up
    return block


def functional(steps: int, rounds: int, base: str) -> None:
    block = pynative_loop(
        steps, lambda params: nn.Momentum(params, learning_rate=0.01, momentum=0.9)
    )
    every = Monitor(save_dir=base, run_name="every_step", log_interval=1)
    tenth = Monitor(save_dir=base, run_name="every_10th", log_interval=10)
    off = Monitor(save_dir=base, run_name="every_blame_off", log_interval=1, blame=NO_BLAME)
    ring = Monitor(save_dir=base, run_name="every_ring_only", log_interval=1, blame=RING_ONLY)
    ratios = Monitor(save_dir=base, run_name="every_ratios", log_interval=1, blame=RATIOS)
    counts = {id(m): DetailSteps(m) for m in (every, ring, ratios)}
    spent = {id(m): 0.0 for m in (every, tenth, off, ring, ratios)}
    layer_part = {id(m): LayerPart(m) for m in (ring, ratios)}
    for mon in (every, tenth, off, ring, ratios):  # time inside the monitor, attributed directly
        inner = mon.record_step
        key = id(mon)

        def timed(*a, _inner=inner, _key=key, **k):
            t0 = time.perf_counter()
            try:
                return _inner(*a, **k)
            finally:
                spent[_key] += time.perf_counter() - t0

        mon.record_step = timed
    variants = {
        "plain": None,
        "every step": every,
        "every 10th step": tenth,
        "blame off": off,
        "ring only": ring,
        "update ratios": ratios,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    plain_cpu: list[float] = []  # the plain blocks' process CPU time
    order = list(variants)
    for r in range(rounds):
        shift = r % len(order)
        for name in order[shift:] + order[:shift]:  # rotate so no variant always runs first
            mon = variants[name]
            if mon is None:
                c0 = time.process_time()
                times[name].append(block())
                plain_cpu.append(time.process_time() - c0)
            else:
                with mon.watch():
                    times[name].append(block())
    for mon in (every, tenth, off, ring, ratios):
        mon.close()
    plain = statistics.median(times["plain"])
    print(f"functional loop (PyNative), {steps}-step blocks x {rounds} rounds, order rotated:")
    print(f"  plain: {plain / steps * 1e3:.1f} ms/step ({steps / plain:.0f} steps/s)")
    for name, mon in (("every step", every), ("every 10th step", tenth)):
        target = 1.03 if name == "every step" else 1.01
        ratio = statistics.median(times[name]) / plain
        q1, _, q3 = statistics.quantiles([t / plain for t in times[name]], n=4)
        inside = spent[id(mon)] / (rounds * steps)
        print(
            f"  monitored/plain, {name:16s}: {ratio:.3f} [IQR {q1:.2f}-{q3:.2f}] "
            f"(target <= {target}); inside the monitor {inside * 1e6:.0f} us/step "
            f"= {inside / (plain / steps):.2%} of a step"
        )
    q1, _, q3 = statistics.quantiles([t / plain for t in times["plain"]], n=4)
    print(f"  (plain blocks themselves vary: IQR {q1:.2f}-{q3:.2f} of their median)")
    inside = {name: spent[id(m)] / (rounds * steps) for name, m in variants.items() if m}
    for name, (label, target) in (
        ("ring only", RING_LINE),
        ("update ratios", RATIOS_LINE),
        ("every step", ON_LINE),
    ):
        per_round = [a / b for a, b in zip(times[name], times["blame off"], strict=True)]
        print(
            f"  every step, {label} (same net, per round): {_spread(per_round)}{target}; "
            f"inside the monitor {inside[name] * 1e6:.0f} vs {inside['blame off'] * 1e6:.0f} "
            f"us/step = {(inside[name] - inside['blame off']) / (plain / steps):+.2%} of a "
            f"plain step; {counts[id(variants[name])]}"
        )
    for name in ("ring only", "update ratios"):
        part = layer_part[id(variants[name])]
        print(f"  {part.line(name, plain / steps, statistics.median(plain_cpu) / steps)}")


def activations_cost(steps: int, rounds: int, base: str) -> None:
    """Section 4 of the module docstring."""
    block = pynative_loop(steps, lambda params: nn.Adam(params, learning_rate=1e-4))
    core = ["loss", "grad_norm", "learning_rate", "throughput", "step_time", "global_step"]
    kinds = ["norm", "max_abs", "nonfinite", "zero_frac"]
    arms = {
        "core, every 10th": dict(log_interval=10, track_metrics=core),
        "+ activations, every 10th": dict(log_interval=10, track_metrics=[*core, "activations"]),
        "+ act_grad, every 10th": dict(
            log_interval=10, track_metrics=[*core, "activations", "act_grad"]
        ),
        "+ param/moment stats (4 kinds), every 10th": dict(
            log_interval=10,
            track_metrics=[*core, "param_stats", "optimizer_state"],
            param_stat_kinds=kinds,
        ),
        "core, every step": dict(log_interval=1, track_metrics=core),
        "+ activations, every step": dict(log_interval=1, track_metrics=[*core, "activations"]),
    }
    mons = {
        name: Monitor(save_dir=base, run_name=f"act_{i}", blame=NO_BLAME, **cfg)
        for i, (name, cfg) in enumerate(arms.items())
    }
    # the activations' own work (hooks on and off, the statistics), timed where it runs:
    # a figure the other jobs on a shared machine move far less than block times
    from msmon_nb.collect.activations import Activations

    own = {"s": 0.0}
    for method in ("arm", "see", "take"):
        inner = getattr(Activations, method)

        def timed(self, *a, _inner=inner, **k):
            t0 = time.perf_counter()
            try:
                return _inner(self, *a, **k)
            finally:
                own["s"] += time.perf_counter() - t0

        setattr(Activations, method, timed)
    own_by: dict[str, float] = {name: 0.0 for name in arms}
    times: dict[str, list[float]] = {"plain": [], **{name: [] for name in arms}}
    order = list(times)
    for r in range(rounds):
        shift = r % len(order)
        for name in order[shift:] + order[:shift]:
            if name == "plain":
                times[name].append(block())
            else:
                before = own["s"]
                with mons[name].watch():
                    times[name].append(block())
                own_by[name] += own["s"] - before
    for mon in mons.values():
        mon.close()
    plain = statistics.median(times["plain"])
    print(f"activations (PyNative, Adam), {steps}-step blocks x {rounds} rounds, order rotated:")
    print(f"  plain: {plain / steps * 1e3:.1f} ms/step")
    for name in arms:
        anchor = "core, every step" if name.endswith("every step") else "core, every 10th"
        vs_plain = [t / p for t, p in zip(times[name], times["plain"], strict=True)]
        line = f"  {name:44s} / plain {_spread(vs_plain)}"
        if name != anchor:
            vs_core = [t / c for t, c in zip(times[name], times[anchor], strict=True)]
            line += f"; / {anchor} {_spread(vs_core)}"
        if own_by[name]:
            per = own_by[name] / (rounds * steps)
            line += f"; activations' own {per * 1e6:.0f} us/step = {per / (plain / steps):.2%}"
        print(line)


def activations_model(train_steps: int, rounds: int, base: str, instances: int) -> None:
    """Section 4's ``Model.train`` part (GRAPH_MODE)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = data(64 * train_steps, seed=1)
    core = ["loss", "grad_norm", "learning_rate", "throughput", "step_time", "global_step"]
    arms = {
        "plain": None,
        "core, every 10th": dict(log_interval=10, track_metrics=core),
        "+ activations, every 10th": dict(log_interval=10, track_metrics=[*core, "activations"]),
        "+ activations, every step": dict(log_interval=1, track_metrics=[*core, "activations"]),
    }
    blocks: dict[str, list[tuple[Model, mds.Dataset, Any]]] = {name: [] for name in arms}
    mons = []
    for name, cfg in arms.items():
        mon = None
        if cfg is not None:
            mon = Monitor(save_dir=base, run_name=f"actm_{len(mons)}", blame=NO_BLAME, **cfg)
            mons.append(mon)
        for _ in range(instances):
            net = mlp()
            opt = nn.Adam(net.trainable_params(), learning_rate=1e-4)
            loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
            dataset = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(64)
            model = Model(net, loss_fn=loss_fn, optimizer=opt)
            blocks[name].append((model, dataset, mon.callback() if mon else None))
    times = rotated_model_blocks(blocks, rounds)
    for mon in mons:
        mon.close()
    print(
        f"activations in Model.train (GRAPH_MODE, Adam), {train_steps}-step epochs x {rounds} "
        f"rounds x {instances} models a variant:"
    )
    print_vs_core(times, train_steps, _spread, 28)
    ms.set_context(mode=ms.PYNATIVE_MODE)


def rotated_model_blocks(
    blocks: dict[str, list[tuple[Model, mds.Dataset, Any]]], rounds: int
) -> dict[str, list[float]]:
    """Each arm's block time per round (one ``Model.train`` epoch of each of its models,
    their mean), arms in ``blocks``' order rotated each round; round 0 compiles and is
    not kept. A model's callback, where it has one, is its monitor's."""
    times: dict[str, list[float]] = {name: [] for name in blocks}
    order = list(blocks)
    for r in range(rounds + 1):  # round 0 compiles
        shift = r % len(order)
        for name in order[shift:] + order[:shift]:
            total = 0.0
            for model, dataset, cb in blocks[name]:
                t0 = time.perf_counter()
                model.train(1, dataset, callbacks=[cb] if cb else None, dataset_sink_mode=False)
                total += time.perf_counter() - t0
            if r:
                times[name].append(total / len(blocks[name]))
    return times


def print_vs_core(
    times: dict[str, list[float]],
    train_steps: int,
    spread: Callable[[list[float]], str],
    width: int,
) -> None:
    """The plain step, then each other arm's per-round ratio to plain and to the arm
    ``core, every 10th`` (the monitor without the part measured), as ``spread`` writes a
    ratio list."""
    core = "core, every 10th"
    plain = statistics.median(times["plain"])
    print(f"  plain: {plain / train_steps * 1e3:.2f} ms/step")
    for name in list(times)[1:]:
        vs_plain = [t / p for t, p in zip(times[name], times["plain"], strict=True)]
        line = f"  {name:{width}s} / plain {spread(vs_plain)}"
        if name != core:
            vs_core = [t / c for t, c in zip(times[name], times[core], strict=True)]
            line += f"; / core every 10th {spread(vs_core)}"
        print(line)


class _Own:
    """The callback's own time around its per-step methods, summed: wall (perf_counter)
    and this thread's CPU time (thread_time), which time given to other processes on a
    shared machine does not inflate."""

    def __init__(self, callback) -> None:
        self.secs = 0.0
        self.cpu = 0.0
        self.steps = 0
        for name in ("on_train_step_begin", "on_train_step_end"):
            inner = getattr(callback, name)
            end = name.endswith("end")

            def timed(run_context, _inner=inner, _end=end):
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    return _inner(run_context)
                finally:
                    self.secs += time.perf_counter() - t0
                    self.cpu += time.thread_time() - c0
                    self.steps += _end

            setattr(callback, name, timed)


class _Floor(Callback):
    """The least a grad_norm monitor does every step: read the loss and the norm the
    tapped graph stored, and keep them."""

    def __init__(self, monitored: Any) -> None:
        super().__init__()
        self.monitored = monitored  # our callback on the same model: its taps
        self.kept: list[tuple[float, float]] = []

    def on_train_begin(self, run_context: Any) -> None:
        self.monitored.tap.set_collect(True)  # the norm computed on every step

    def on_train_step_end(self, run_context: Any) -> None:
        loss = run_context.original_args().net_outputs
        self.kept.append((float(loss.asnumpy()), self.monitored.tap.optimizer.norm.item()))


OFF = "every, blame off"
RING = "every, ring only"


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):.3f} [IQR {q1:.3f}-{q3:.3f}, min {min(values):.3f}]"


def model_train(
    train_steps: int,
    rounds: int,
    base: str,
    schedule: bool = False,
    instances: int = 3,
    not_held: bool = False,
) -> None:
    """Blocks of one epoch each, alternating within every round (order rotated).

    What varies: two identical, untouched ``Model``s built from the same seed differ
    by up to 5-9 % in step time on this 2-core VM, for the whole life of the process
    (measured: four plain models, medians 0.978-1.065 of their mean), more than the
    overhead being measured. Comparing one plain model with one monitored model (as
    this bench did, giving 0.99x in one session and 1.10x in another) measures that
    draw. So every variant runs on ``instances`` models of its own, each round times
    every instance once, a round's variant time is the mean over its instances, and
    the ratio is the median over rounds of monitored / plain; the plain instances'
    own spread is printed as the noise floor of a one-pair comparison.

    Plain models are ones msmon never touched (the grad_norm tap changes a monitored
    model's graph for good). Besides wall-time ratios it prints what does not depend
    on other processes: the callback's own time per step (perf_counter inside it) and
    this process's CPU time per step (all MindSpore threads included).
    """
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = data(64 * train_steps, seed=1)

    def model() -> tuple[Model, mds.Dataset]:
        net = mlp()
        # --lr-schedule: a list schedule (warmup), as nn.warmup_lr/cosine_decay_lr give,
        # long enough for every round; its lr is read on each collected step
        n = train_steps * (2 * rounds + 5)  # the monitored model runs two variants
        lr = [0.01 * min(1.0, (i + 1) / 100) for i in range(n)] if schedule else 0.01
        opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
        loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        dataset = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(64)
        return Model(net, loss_fn=loss_fn, optimizer=opt), dataset

    every = Monitor(save_dir=base, run_name="model_train_every", log_interval=1)
    tenth = Monitor(save_dir=base, run_name="model_train_tenth", log_interval=10)
    # ring only (blame on, detail_steps 0): the blame-on graph, so it shares the monitored
    # models (their compiled taps serve it as they are)
    ring = Monitor(save_dir=base, run_name="model_train_ring_only", log_interval=1, blame=RING_ONLY)
    monitors = [("every step", every), ("every 10th", tenth), (RING, ring)]
    counts = {name: DetailSteps(mon) for name, mon in (("every step", every), (RING, ring))}
    ring_part = LayerPart(ring)
    if not_held:  # --not-held: every step, its scalars passed on one step at a time
        single = Monitor(save_dir=base, run_name="model_train_not_held", log_interval=1)
        single.hold_emits = lambda on, m=single: Monitor.hold_emits(m, False)
        monitors.append(("every, not held", single))
    off = Monitor(save_dir=base, run_name="model_train_blame_off", log_interval=1, blame=NO_BLAME)
    own: dict[str, list] = {name: [] for name, _ in monitors}
    own[OFF] = []
    tapped_off: tuple = ()  # the same, blame off
    tapped: tuple = ()  # the first every-step callback and its model: in_graph toggles its tap
    # (variant, instance) -> (model, dataset, callbacks for round r)
    blocks: dict[tuple[str, int], tuple[Model, mds.Dataset, Any]] = {}
    for i in range(instances):
        plain_model, plain_data = model()
        blocks[("plain", i)] = (plain_model, plain_data, lambda r: None)
        mon_model, mon_data = model()  # both monitored variants: one model, one tap
        for name, mon in monitors:
            cb = mon.callback()
            own[name].append(_Own(cb))
            if name == "every step":
                tapped = tapped or (cb, mon_model, mon_data)
                floor = _Floor(cb)  # reads this callback's taps
            blocks[(name, i)] = (mon_model, mon_data, lambda r, cb=cb: [cb])
        blocks[("floor", i)] = (mon_model, mon_data, lambda r, f=floor: [f])
        off_model, off_data = model()  # blame off: another graph (no per-parameter norms)
        cb = off.callback()
        own[OFF].append(_Own(cb))
        tapped_off = tapped_off or (cb, off_model, off_data)
        blocks[(OFF, i)] = (off_model, off_data, lambda r, cb=cb: [cb])
    # MindSpore's own arm, set up as its users do and as ours is: one collector per run,
    # built outside the timer. On one model: its 3-8x is far beyond the few % two models
    # differ by, and its blocks are most of this bench's time (three models made it
    # 40 % longer). Model.train opens and closes its SummaryRecord (a new file) on every
    # call, which a one-call run pays once: that open/close is timed on its own below and
    # taken out of the second ratio printed.
    sc_model, sc_data = model()
    collector = SummaryCollector(str(Path(base) / "collector"), collect_freq=1)
    blocks[("SummaryCollector", 0)] = (sc_model, sc_data, lambda r: [collector])

    def runs(name: str, r: int) -> bool:
        """Whether variant ``name`` runs in round ``r``: SummaryCollector's 3-8x needs no
        more than every other round (in all of them it took 1/5 of the bench)."""
        return name != "SummaryCollector" or r % 2 == 0

    def block(key: tuple[str, int], r: int) -> tuple[float, float]:
        m, dataset, callbacks = blocks[key]
        t0, c0 = time.perf_counter(), time.process_time()
        m.train(1, dataset, callbacks=callbacks(r), dataset_sink_mode=False)
        return (time.perf_counter() - t0) / train_steps, (time.process_time() - c0) / train_steps

    for key in blocks:  # compile each graph (the tapped ones included) before timing
        block(key, -1)
    for timers in own.values():
        for o in timers:
            o.secs, o.cpu, o.steps = 0.0, 0.0, 0
    for c in counts.values():  # the timed rounds' steps only
        c.reset()
    ring_part.reset()
    wall: dict[tuple[str, int], list[float]] = {k: [] for k in blocks}
    cpu: dict[tuple[str, int], list[float]] = {k: [] for k in blocks}
    order = list(blocks)
    for r in range(rounds):
        shift = r % len(order)
        for key in order[shift:] + order[:shift]:
            if not runs(key[0], r):
                continue
            w, c = block(key, r)
            wall[key].append(w)
            cpu[key].append(c)
    for _, mon in (*monitors, (OFF, off)):
        mon.close()

    def per_round(name: str, table: dict) -> list[float]:
        keys = [k for k in blocks if k[0] == name]
        return [statistics.mean(table[k][r] for k in keys) for r in range(len(table[keys[0]]))]

    opens = []
    for _ in range(20):  # what each Model.train call adds for the collector: its file
        t0 = time.perf_counter()
        with collector:
            pass
        opens.append(time.perf_counter() - t0)
    open_close = statistics.median(opens) / train_steps  # spread over a block's steps

    plain_w, plain_c = per_round("plain", wall), per_round("plain", cpu)
    med_w, med_c = statistics.median(plain_w), statistics.median(plain_c)
    print(
        f"Model.train (graph mode, dataset_sink_mode=False), {train_steps}-step epochs x "
        f"{rounds} rounds, {instances} models per variant (SummaryCollector: 1), "
        "blocks alternating:"
    )
    print(f"  plain: {med_w * 1e3:.2f} ms/step wall, {med_c * 1e3:.2f} ms/step CPU")
    inst = [statistics.median(wall[("plain", i)]) for i in range(instances)]
    print(
        "  plain instances, each one's median / their mean (the draw a one-model "
        f"comparison measures): {' '.join(f'{v / statistics.mean(inst):.3f}' for v in inst)}"
    )
    for name in (*own, "floor", "SummaryCollector"):
        w, c = per_round(name, wall), per_round(name, cpu)
        paired = [p for r, p in enumerate(plain_w) if runs(name, r)]  # its rounds' plain
        ratios = [a / b for a, b in zip(w, paired, strict=True)]
        cpu_ratio = statistics.median(c) / med_c
        line = f"  {name:16s} / plain, wall (per round): {_spread(ratios)}; CPU: {cpu_ratio:.3f}"
        if name in own:
            steps = max(sum(o.steps for o in own[name]), 1)
            per_step = sum(o.secs for o in own[name]) / steps
            per_cpu = sum(o.cpu for o in own[name]) / steps
            line += (
                f"; callback own {per_step * 1e6:.0f} us/step wall, {per_cpu * 1e6:.0f} us "
                f"CPU = {per_cpu / med_w:.2%} of a plain step"
            )
        if name == "every step":
            line += "  (target <= 1.05)"
        if name == "floor":
            line += "  (read loss + grad_norm only, tapped graph)"
        print(line)
        if name == OFF:
            blame_lines(per_round, wall, own, counts, med_w)
            plain_cpu = statistics.median(c for k, v in cpu.items() if k[0] == "plain" for c in v)
            print(f"  {ring_part.line('ring only', med_w, plain_cpu)}")
        if name == "floor":
            ours = [a / b for a, b in zip(per_round("every step", wall), w, strict=True)]
            print(f"  every step       / floor, same models, wall: {_spread(ours)}")
        if name == "SummaryCollector":
            net = [(a - open_close) / b for a, b in zip(w, paired, strict=True)]
            print(
                f"  {name:16s} / plain, without its per-call file open/close "
                f"({open_close * train_steps * 1e3:.1f} ms a call): {_spread(net)}"
            )
    on_cost = in_graph(tapped, train_steps, rounds, med_w, "grad_norm")
    off_cost = in_graph(tapped_off, train_steps, rounds, med_w, "blame off")
    kept = on_cost - off_cost
    print(
        f"  blame's part of it (per-parameter norms kept in the graph): "
        f"{kept * 1e6:+.0f} us/step ({kept / med_w:+.1%} of a plain step)"
    )


def blame_lines(per_round, wall: dict, own: dict, counts: dict, plain_step: float) -> None:
    """Blame's cost in ``Model.train``: ring only (detail_steps 0) and blame on (the detail
    window after alerts included), each against blame off (models of their own, so the
    instance draw is in it; the callbacks' own times are not), and blame on against ring
    only on the same models: the detail window alone."""
    off = per_round(OFF, wall)

    def own_us(name: str) -> float:
        return sum(o.secs for o in own[name]) / max(sum(o.steps for o in own[name]), 1)

    for name, (label, target) in ((RING, RING_LINE), ("every step", ON_LINE)):
        ratios = [a / b for a, b in zip(per_round(name, wall), off, strict=True)]
        print(
            f"  every step, {label}, wall (per round): {_spread(ratios)}{target}; callback own "
            f"{own_us(name) * 1e6:.0f} vs {own_us(OFF) * 1e6:.0f} us/step = "
            f"{(own_us(name) - own_us(OFF)) / plain_step:+.2%} of a plain step; {counts[name]}"
        )
    window = [
        a / b for a, b in zip(per_round("every step", wall), per_round(RING, wall), strict=True)
    ]
    print(
        f"  every step, blame on / ring only, same models, wall: {_spread(window)}; callback "
        f"own {(own_us('every step') - own_us(RING)) / plain_step:+.2%} of a plain step "
        "(the detail window alone)"
    )


def in_graph(tapped: tuple, train_steps: int, rounds: int, plain_step: float, label: str) -> float:
    """The grad_norm reduction inside the train graph, alone: one monitored model run
    without a callback, its tap switched on and off between blocks -- the same compiled
    graph, so no instance draw -- next to the floor of one read of every gradient byte
    at this machine's copy bandwidth (``bench/scale.py``). Returns its cost per step
    (seconds): run on a blame-on and a blame-off model, the difference is what keeping
    each parameter's norm adds inside the graph."""
    from scale import copy_bandwidth

    cb, m, dataset = tapped
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for on in (True, False) if r % 2 else (False, True):
            cb.tap.set_collect(on)
            t0 = time.perf_counter()
            m.train(1, dataset, dataset_sink_mode=False)
            times[on].append((time.perf_counter() - t0) / train_steps)
    ratios = [a / b for a, b in zip(times[True], times[False], strict=True)]
    cost = statistics.median(times[True]) - statistics.median(times[False])
    grad_bytes = sum(p.size * 4 for p in cb.optimizer.parameters)  # float32 gradients
    floor = grad_bytes / copy_bandwidth()
    print(
        f"  {label} inside the graph (tap on / off, one compiled graph, per round): "
        f"{_spread(ratios)} = {cost * 1e6:.0f} us/step ({cost / plain_step:.1%} of a plain "
        f"step); floor, one read of {grad_bytes / 1e6:.1f} MB of gradients: "
        f"{floor * 1e6:.0f} us ({floor / plain_step:.1%})"
    )
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--train-steps", type=int, default=250)
    parser.add_argument(
        "--train-rounds", type=int, default=None, help="Model.train rounds (default: --rounds)"
    )
    parser.add_argument("--only", choices=("functional", "model", "activations"), default=None)
    parser.add_argument(
        "--lr-schedule", action="store_true", help="Model.train with a list lr schedule"
    )
    parser.add_argument(
        "--instances", type=int, default=3, help="Model.train: models per variant (>= 1)"
    )
    parser.add_argument(
        "--not-held",
        action="store_true",
        help="Model.train: also every step with each step's scalars passed on at once "
        "(Monitor.hold_emits off), beside the batched default",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as base:
        if args.only in (None, "functional"):
            functional(args.steps, args.rounds, base)
        if args.only in (None, "activations"):
            activations_cost(args.steps, args.rounds, base)
            activations_model(
                args.train_steps, args.train_rounds or args.rounds, base, max(args.instances, 1)
            )
        if args.only in (None, "model"):
            model_train(
                args.train_steps,
                args.train_rounds or args.rounds,
                base,
                args.lr_schedule,
                max(args.instances, 1),
                args.not_held,
            )


if __name__ == "__main__":
    main()
