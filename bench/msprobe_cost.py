"""The cost table beside msprobe's: the same loop plain, under ours, under msprobe's monitor.

Model: the MLP 784-512-512-10 of ``bench/overhead.py``, batch 64, PyNative on the CPU,
``value_and_grad`` + ``mindspore.mint.optim.Adam`` (the optimizer whose moments msprobe
finds: it looks for parameters named ``exp_avg``/``exp_avg_sq``). Arms, each a block of
``--steps`` steps, blocks alternating, order rotated each round:

* plain: no monitor;
* ours, every 10th step: loss, grad_norm, lr, throughput, step time, activations (the
  three Dense layers' outputs) and ``param_stats`` + ``optimizer_state`` with every
  ``param_stat_kinds`` (norm, max |x|, non-finite count, zero fraction);
* ours, everything every step: the same plus ``act_grad``, ``log_interval`` 1;
* msprobe, gradients, every 10th: ``TrainerMon`` with ``wg_distribution`` and the ops
  norm, min, max, mean, zeros, nans, ``step_interval`` 10;
* msprobe, everything, every 10th: also ``xy_distribution`` (each Dense layer's input and
  output and their gradients), ``mv_distribution`` (Adam's moments) and
  ``param_distribution`` (weights before and after the update), ``step_interval`` 10;
* msprobe, everything, every step: the same, ``step_interval`` 1.

msprobe needs three things to run here, done in its arms only and said where done: its
``norm`` calls ``mint.norm`` (``LinalgVectorNorm``), which has no CPU kernel (training
aborts), so ``features.FUNC_MAP["norm"]`` is replaced by the square root of the sum of
squares in float32; its optimizer hook reads ``param.grad``, which a MindSpore Parameter
does not have, so every arm's loop (ours and plain too, for the same loop code) sets it
after ``value_and_grad``; and it patches its optimizer's *class*, so each msprobe arm gets
an optimizer subclass of its own (no body: the same update) and a net of its own, built
like the others (identical nets differ by a few % in speed: the plain anchor is one).

msprobe is not a dependency of msmon_nb: without it the msprobe arms are skipped with a
line that says how to install it (``MSMON_MSPROBE_PATH`` names a ``pip install --target``
dir, appended to ``sys.path``).

    python bench/msprobe_cost.py [--steps 10] [--rounds 6]

Prints each arm's median ms/step and its ratio to the plain block of the same round:
median [IQR, min] over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms
import numpy as np
from mindspore import mint, nn

from msmon_nb.monitor import Monitor

INSTALL = (
    "pip install --target DIR mindstudio-probe==26.2.0 --no-deps einops 'pandas<2.3' "
    "pytz openpyxl, then MSMON_MSPROBE_PATH=DIR python bench/msprobe_cost.py"
)
CORE = ["loss", "grad_norm", "learning_rate", "throughput", "step_time", "global_step"]
KINDS = ["norm", "max_abs", "nonfinite", "zero_frac"]
OURS = {
    "ours: act + param/moment stats, every 10th": dict(
        log_interval=10,
        track_metrics=[*CORE, "activations", "param_stats", "optimizer_state"],
        param_stat_kinds=KINDS,
    ),
    "ours: everything, every step": dict(
        log_interval=1,
        track_metrics=[*CORE, "activations", "act_grad", "param_stats", "optimizer_state"],
        param_stat_kinds=KINDS,
    ),
}
OPS = ["norm", "min", "max", "mean", "zeros", "nans"]
EVERYTHING = {
    "wg_distribution": True,
    "xy_distribution": True,
    "mv_distribution": True,
    "param_distribution": True,
}
THEIRS = {
    "msprobe: gradients, every 10th": dict(wg_distribution=True, step_interval=10),
    "msprobe: everything, every 10th": dict(EVERYTHING, step_interval=10),
    "msprobe: everything, every step": dict(EVERYTHING, step_interval=1),
}


def mlp() -> nn.Cell:
    ms.set_seed(0)
    net = nn.SequentialCell(
        [nn.Dense(784, 512), nn.ReLU(), nn.Dense(512, 512), nn.ReLU(), nn.Dense(512, 10)]
    )
    net.set_train()  # msprobe's activation hooks skip a cell that is not training
    return net


def loop(steps: int, opt_class: type) -> tuple[Any, Any]:
    """A warmed-up ``value_and_grad`` + Adam loop on its own MLP: (a function that times
    ``steps`` of it, (net, optimizer))."""
    net = mlp()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = opt_class(net.trainable_params(), lr=1e-4)
    params = list(opt.parameters)
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 784)).astype(np.float32)
    y = rng.integers(0, 10, 512).astype(np.int32)
    batches = [(ms.Tensor(x[i : i + 64]), ms.Tensor(y[i : i + 64])) for i in range(0, 512, 64)]

    def block() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(steps):
            loss, grads = grad_fn(*batches[i % len(batches)])
            for param, grad in zip(params, grads, strict=True):
                param.grad = grad  # msprobe's optimizer hook reads it (every arm sets it)
            opt(grads)
        float(loss.asnumpy())  # wait for the queued work, as a user printing the loss would
        return time.perf_counter() - t0, time.process_time() - c0

    return block, (net, opt)


def import_msprobe() -> Any:
    """msprobe's ``TrainerMon`` with its norm made CPU-capable, or None (say why)."""
    os.environ.setdefault("MSPROBE_LOG_LEVEL", "2")  # its INFO lines print on stdout
    extra = os.environ.get("MSMON_MSPROBE_PATH")
    if extra and extra not in sys.path:
        sys.path.append(extra)  # appended: msprobe's dir never shadows our packages
    try:
        import mindspore.common.dtype as mstype
        import msprobe.mindspore.monitor.features as features
        from mindspore import ops
        from msprobe.mindspore import TrainerMon
    except Exception as exc:  # noqa: BLE001 (any import failure: the arm is skipped)
        print(f"msprobe arms skipped: mindstudio-probe is not importable ({exc!r}); {INSTALL}")
        return None

    def cpu_norm(x):
        # msprobe's norm is mint.norm (LinalgVectorNorm), which has no CPU kernel
        x = x.astype(mstype.float32)
        return ops.sqrt((x * x).sum())

    features.FUNC_MAP["norm"] = cpu_norm
    return TrainerMon


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):.2f} [IQR {q1:.2f}-{q3:.2f}, min {min(values):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")

    base = tempfile.mkdtemp(prefix="msmon_bench_msprobe_")
    plain, _ = loop(args.steps, mint.optim.Adam)
    blocks: dict[str, Any] = {"plain": plain}
    ours, _ = loop(args.steps, mint.optim.Adam)
    mons = {
        name: Monitor(save_dir=base, run_name=f"ours_{i}", blame={"enabled": False}, **cfg)
        for i, (name, cfg) in enumerate(OURS.items())
    }
    for name, mon in mons.items():

        def watched(_mon=mon) -> tuple[float, float]:
            with _mon.watch():
                return ours()

        blocks[name] = watched
    trainer_mon = import_msprobe()
    files = {}
    if trainer_mon is not None:
        for i, (name, options) in enumerate(THEIRS.items()):
            # msprobe patches its optimizer's class: a class of its own per arm
            probed = type(f"ProbedAdam{i}", (mint.optim.Adam,), {})
            block, (net, opt) = loop(args.steps, probed)
            out = Path(base) / f"msprobe_{i}"
            config = {"targets": {}, "all_xy": True, "ops": OPS, "format": "csv", **options}
            config_path = Path(base) / f"msprobe_{i}.json"
            config_path.write_text(json.dumps(config))
            os.environ["MONITOR_OUTPUT_DIR"] = str(out)
            trainer_mon(str(config_path), params_have_main_grad=False).set_monitor(net, opt)
            blocks[name] = block
            files[name] = out
    for block in blocks.values():
        block()  # warm up each arm (our watch attaches, msprobe writes its first files)

    times: dict[str, list[tuple[float, float]]] = {name: [] for name in blocks}
    order = list(blocks)
    for r in range(args.rounds):
        shift = r % len(order)
        for name in order[shift:] + order[:shift]:
            times[name].append(blocks[name]())
    for mon in mons.values():
        mon.close()

    steps = args.steps
    plain_ms = statistics.median(w for w, _ in times["plain"]) / steps * 1e3
    print(
        f"cost beside msprobe (MLP 784-512-512-10, batch 64, PyNative, mint Adam, CPU), "
        f"{steps}-step blocks x {args.rounds} rounds, order rotated; ratio to the plain "
        "block of the same round, wall time and the process's CPU time (which other jobs "
        "on the machine move less): median [IQR, min]"
    )
    print(f"  {'plain':44s} {plain_ms:7.1f} ms/step")
    for name in order[1:]:
        per = statistics.median(w for w, _ in times[name]) / steps * 1e3
        pairs = list(zip(times[name], times["plain"], strict=True))
        wall = [t[0] / p[0] for t, p in pairs]
        cpu = [t[1] / p[1] for t, p in pairs]
        line = f"  {name:44s} {per:7.1f} ms/step  wall x {spread(wall)}  CPU x {spread(cpu)}"
        if name in files:
            count = sum(1 for _ in files[name].rglob("*.csv"))
            line += f"  ({count} CSV files)"
        print(line)
    if trainer_mon is not None:
        print(
            "  msprobe: its norm patched to sqrt(sum(x*x)) in float32 (mint.norm has no CPU "
            "kernel); all_xy: every cell's input/output"
        )


if __name__ == "__main__":
    main()
