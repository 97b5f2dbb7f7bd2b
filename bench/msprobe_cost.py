"""The cost table beside msprobe's: the same loop plain, under ours, under msprobe's monitor.

Model: the MLP 784-512-512-10 of ``bench/overhead.py``, batch 64, PyNative on the CPU,
``value_and_grad`` + ``mindspore.mint.optim.Adam`` (the optimizer whose moments msprobe
finds: it looks for parameters named ``exp_avg``/``exp_avg_sq``). Arms:

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
* msprobe, everything, every step: the same, ``step_interval`` 1;

and a small transformer block (``nn.TransformerEncoderLayer``, d_model 128, 4 heads, FFN
512, sequence 32, batch 16, between an input and an output Dense), plain, under ours with
activations and attention signals (``attn/<module>/max_logit``, ``entropy``) every 10th
step (target <= 1.03x its plain step), and under ours with those two off (core metrics
every 10th step: what turning them off leaves, target 1.00x).

One process per block: each arm's block runs in a fresh ``python bench/msprobe_cost.py
--arm NAME`` (build, one warm-up block, one timed block), blocks alternating, the order
rotated each round, so nothing one arm leaves in a process (msprobe's hooks and their
pandas garbage; measured: our every-10th arm 1.91x CPU with msprobe's arms in the same
process, 1.01x without) is paid in another arm's block.

msprobe needs three things to run here, done in its arms only and said where done: its
``norm`` calls ``mint.norm`` (``LinalgVectorNorm``), which has no CPU kernel (training
aborts), so ``features.FUNC_MAP["norm"]`` is replaced by the square root of the sum of
squares in float32; its optimizer hook reads ``param.grad``, which a MindSpore Parameter
does not have, so every arm's loop (ours and plain too, for the same loop code) sets it
after ``value_and_grad``; and it patches its optimizer's *class*, so each msprobe arm gets
an optimizer subclass of its own (no body: the same update).

msprobe is not a dependency of msmon_nb: without it the msprobe arms are skipped with a
line that says how to install it (``MSMON_MSPROBE_PATH`` names a ``pip install --target``
dir, appended to ``sys.path``).

    python bench/msprobe_cost.py [--steps 10] [--rounds 6] [--arms plain,tf_plain,...]

Prints each arm's median ms/step and its ratio to the plain block (the transformer's to
its own plain block) of the same round: median [IQR, min] over rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
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


TF = {
    "tf plain": None,
    "tf ours: activations + attention off, every 10th": dict(
        log_interval=10, track_metrics=list(CORE)
    ),
    "tf ours: activations + attention, every 10th": dict(
        log_interval=10, track_metrics=[*CORE, "activations", "attention"]
    ),
}
MLP_ARMS = ["plain", *OURS, *THEIRS]
ARMS = [*MLP_ARMS, *TF]
KEYS = {name: f"a{i}" for i, name in enumerate(ARMS)}  # --arm's short names
TARGETS = {
    "tf ours: activations + attention, every 10th": 1.03,
    "tf ours: activations + attention off, every 10th": 1.00,
}


class Block(nn.Cell):
    """A transformer encoder block between an input and an output projection."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Dense(32, 128)
        self.block = nn.TransformerEncoderLayer(
            128, 4, dim_feedforward=512, dropout=0.0, batch_first=True
        )
        self.head = nn.Dense(128, 10)

    def construct(self, x):
        return self.head(self.block(self.embed(x)).mean(1))


def tf_loop(steps: int) -> Any:
    """The transformer block's ``value_and_grad`` + Adam loop (a function timing ``steps``)."""
    ms.set_seed(0)
    net = Block()
    net.set_train()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-4)
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, 128).astype(np.int32)
    batches = [(ms.Tensor(x[i : i + 16]), ms.Tensor(y[i : i + 16])) for i in range(0, 128, 16)]

    def block() -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(steps):
            loss, grads = grad_fn(*batches[i % len(batches)])
            opt(grads)
        float(loss.asnumpy())
        return time.perf_counter() - t0, time.process_time() - c0

    return block


def one_block(name: str, steps: int) -> dict[str, Any]:
    """Build arm ``name`` in this process, run one warm-up block, time one block."""
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    base = tempfile.mkdtemp(prefix="msmon_bench_msprobe_")
    out: dict[str, Any] = {}
    mon = None
    if name in TF:
        block = tf_loop(steps)
        if TF[name] is not None:
            mon = Monitor(save_dir=base, run_name="tf", blame={"enabled": False}, **TF[name])
    elif name in THEIRS:
        trainer_mon = import_msprobe()
        if trainer_mon is None:
            return {"skipped": True}
        # msprobe patches its optimizer's class: a class of its own per arm
        probed = type("ProbedAdam", (mint.optim.Adam,), {})
        block, (net, opt) = loop(steps, probed)
        files = Path(base) / "msprobe"
        config = {"targets": {}, "all_xy": True, "ops": OPS, "format": "csv", **THEIRS[name]}
        config_path = Path(base) / "msprobe.json"
        config_path.write_text(json.dumps(config))
        os.environ["MONITOR_OUTPUT_DIR"] = str(files)
        trainer_mon(str(config_path), params_have_main_grad=False).set_monitor(net, opt)
        out["files"] = files
    else:
        block, _ = loop(steps, mint.optim.Adam)
        if name in OURS:
            mon = Monitor(save_dir=base, run_name="ours", blame={"enabled": False}, **OURS[name])
    # one watch around both blocks, as around a user's loop: attaching is not a step's cost
    with mon.watch() if mon is not None else contextlib.nullcontext():
        block()  # warm-up: compiles, caches, msprobe's first files
        wall, cpu = block()
    if mon is not None:
        mon.close()
    result = {"wall": wall, "cpu": cpu}
    if "files" in out:
        result["csv"] = sum(1 for _ in out["files"].rglob("*.csv"))
    return result


def msprobe_found() -> bool:
    extra = os.environ.get("MSMON_MSPROBE_PATH")
    if extra and extra not in sys.path:
        sys.path.append(extra)
    return importlib.util.find_spec("msprobe") is not None


def run_arm(name: str, steps: int) -> dict[str, Any]:
    """One block of arm ``name`` in a process of its own."""
    cmd = [sys.executable, __file__, "--arm", KEYS[name], "--steps", str(steps)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("BLOCK ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"arm {name!r} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1][len("BLOCK ") :])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--arms", default="", help="comma-separated short names (a0, a1, ...)")
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # a child: one block of one arm
    args = parser.parse_args()
    if args.arm:
        name = {k: n for n, k in KEYS.items()}[args.arm]
        print("BLOCK " + json.dumps(one_block(name, args.steps)), flush=True)
        return 0
    arms = [n for n in ARMS if not args.arms or KEYS[n] in args.arms.split(",")]
    if not msprobe_found():
        print(f"msprobe arms skipped: mindstudio-probe is not importable; {INSTALL}")
        arms = [n for n in arms if n not in THEIRS]
    times: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    for r in range(args.rounds):
        shift = r % len(arms)
        for name in arms[shift:] + arms[:shift]:
            times[name].append(run_arm(name, args.steps))

    steps = args.steps
    print(
        f"cost beside msprobe (MLP 784-512-512-10, batch 64, PyNative, mint Adam, CPU; and a "
        f"transformer block), one process per {steps}-step block (after a warm-up block), "
        f"{args.rounds} rounds, order rotated; ratio to the plain block of the same round, "
        "wall time and the process's CPU time (which other jobs on the machine move less): "
        "median [IQR, min]"
    )
    for name in arms:
        anchor = "tf plain" if name in TF else "plain"
        per = statistics.median(t["wall"] for t in times[name]) / steps * 1e3
        if name == anchor or anchor not in times:
            print(f"  {name:52s} {per:7.1f} ms/step")
            continue
        pairs = list(zip(times[name], times[anchor], strict=True))
        wall = [t["wall"] / p["wall"] for t, p in pairs]
        cpu = [t["cpu"] / p["cpu"] for t, p in pairs]
        line = f"  {name:52s} {per:7.1f} ms/step  wall x {spread(wall)}  CPU x {spread(cpu)}"
        if name in TARGETS:
            met = statistics.median(cpu) <= TARGETS[name] + 0.005
            line += f"  (target <= {TARGETS[name]:.2f}x: {'met' if met else 'MISSED'} on CPU)"
        if "csv" in times[name][0]:
            line += f"  ({times[name][0]['csv']} CSV files)"
        print(line)
    if any(n in THEIRS for n in arms):
        print(
            "  msprobe: its norm patched to sqrt(sum(x*x)) in float32 (mint.norm has no CPU "
            "kernel); all_xy: every cell's input/output"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
