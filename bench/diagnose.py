"""Cost of the alert rules per collected step, against a real training step.

1. ``Diagnoser.update`` with the default rules on the scalars a monitor emits every
   step (train/loss, grad_norm, learning_rate, throughput, step_time, global_step),
   on a healthy run: per-call time, median over many steps (target <= 20 us). Also
   with every rule switched on (lr_warmup/lr_decay configured, a tracked val/ tag).
2. The step time of the reference MLP 784-512-512-10, batch 64, PyNative,
   ``value_and_grad`` + Momentum, in the same process, interleaved with (1) so both
   see the same machine load.

    python bench/diagnose.py [--steps 20000] [--rounds 5] [--mlp-steps 20]

Prints medians and the ratio rule cost / step time.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time

os.environ.setdefault("GLOG_v", "3")

from msmon_nb.diagnose import Diagnoser

ALL_RULES = {"lr_warmup": {"warmup_steps": 500}, "lr_decay": {"expect_by": 10**9}}


def healthy_stream(n: int, seed: int = 0) -> list[dict[str, float]]:
    """What a monitor emits per collected step on a healthy run: decaying noisy loss,
    log-normal grad_norm, warmup + cosine lr, steady throughput, val/f1 every 100."""
    rng = random.Random(seed)
    out = []
    for t in range(n):
        lr = 1e-3 * min(1.0, (t + 1) / 500) * 0.5 * (1 + math.cos(math.pi * t / n))
        out.append(
            {
                "train/loss": (0.3 + 2.0 / (1 + t / 150) ** 0.8) * math.exp(rng.gauss(0, 0.15)),
                "train/grad_norm": 0.5 * math.exp(rng.gauss(0, 0.35)),
                "train/learning_rate": lr,
                "train/throughput": 1000.0 * math.exp(rng.gauss(0, 0.05)),
                "train/step_time": 0.03,
                "train/global_step": float(t),
            }
        )
        if t % 100 == 99:
            out[-1]["val/f1"] = 0.8  # a validation metric, as mon.log would add it
    return out


def time_rules(
    diag: Diagnoser, stream: list[dict[str, float]], start: int, raised: list | None = None
) -> list[int]:
    """Nanoseconds per update call, for steps start..start+len(stream)."""
    clock = time.perf_counter_ns
    update = diag.update
    out = []
    for i, values in enumerate(stream, start):
        t0 = clock()
        new = update(i, values)
        out.append(clock() - t0)
        if new and raised is not None:
            raised += new
    return out


def mlp_step_times(steps: int):
    """A closure timing ``steps`` reference MLP steps; returns seconds per step."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    net = nn.SequentialCell(
        [nn.Dense(784, 512), nn.ReLU(), nn.Dense(512, 512), nn.ReLU(), nn.Dense(512, 10)]
    )
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    rng = np.random.default_rng(0)
    batches = [
        (
            ms.Tensor(rng.normal(size=(64, 784)).astype(np.float32)),
            ms.Tensor(rng.integers(0, 10, 64).astype(np.int32)),
        )
        for _ in range(8)
    ]

    def run() -> float:
        t0 = time.perf_counter()
        for i in range(steps):
            loss, grads = grad_fn(*batches[i % len(batches)])
            opt(grads)
        float(loss.asnumpy())  # wait for queued work, as a user printing the loss would
        return (time.perf_counter() - t0) / steps

    run()  # warm up (first calls compile kernels)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000, help="rule updates per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mlp-steps", type=int, default=20, help="MLP steps per round")
    args = parser.parse_args()

    stream = healthy_stream(args.steps * args.rounds + 2000)
    variants = {
        "default rules": Diagnoser(tracked=["loss", "grad_norm"]),
        "every rule on": Diagnoser(ALL_RULES, tracked=["loss", "val/f1"]),
    }
    for diag in variants.values():  # fill every window first: steady-state cost
        time_rules(diag, stream[:2000], 0)
    clock = time.perf_counter_ns
    empty = []
    for _ in range(10000):
        t0 = clock()
        empty.append(clock() - t0)
    timer = statistics.median(empty) / 1e3
    mlp = mlp_step_times(args.mlp_steps)
    ns: dict[str, list[int]] = {name: [] for name in variants}
    alerts: dict[str, list] = {name: [] for name in variants}
    mlp_times = []
    for r in range(args.rounds):
        part = stream[2000 + r * args.steps : 2000 + (r + 1) * args.steps]
        for name, diag in variants.items():
            ns[name] += time_rules(diag, part, 2000 + r * args.steps, alerts[name])
        mlp_times.append(mlp())
    step = statistics.median(mlp_times)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"rule cost per collected step ({args.steps * args.rounds} steps, 6 scalars a step,")
    print(f"  timer overhead {timer:.2f} us included; load average {load:.1f}):")
    for name, times in ns.items():
        times.sort()
        n = len(times)
        med, p90, p99 = (times[int(q * (n - 1))] / 1e3 for q in (0.5, 0.9, 0.99))
        mean = sum(times) / n / 1e3
        flag = "ok" if med <= 20 else "OVER"
        print(
            f"  {name:14s}: median {med:5.1f} us (target <= 20: {flag}), p90 {p90:.1f}, "
            f"p99 {p99:.1f}, mean {mean:.1f}; alerts on this healthy run: "
            f"{[a.kind for a in alerts[name]] or 'none'}"
        )
    print(
        f"reference MLP 784-512-512-10, batch 64, PyNative, value_and_grad + Momentum: "
        f"{step * 1e3:.2f} ms/step (median of {args.rounds} x {args.mlp_steps} steps)"
    )
    default_med = sorted(ns["default rules"])[len(ns["default rules"]) // 2] / 1e9
    print(
        f"ratio rules / step (default rules, median): {default_med / step:.2e} "
        f"= {default_med / step:.4%} of a step"
    )


if __name__ == "__main__":
    main()
