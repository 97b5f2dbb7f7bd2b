"""A third-party trainer at ResNet-18 size, monitored and plain, in one process.

MindCV 0.3.0's ``create_trainer`` (its ``TrainStep``: fixed loss scale 1024, gradient
clipping at 1.0) on MindCV's ``resnet18`` (11.2 M parameters), ``Model.train`` in
GRAPH_MODE, batch 8 of 3x32x32. Three models built alike: one never monitored, one with
``mon.callback()`` collecting every step (grad_norm, grad_norm_clipped, loss_scale, lr,
loss), one collecting every 10th step, and one collecting every step with ``blame:
{enabled: false}`` (no per-parameter gradient norms: blame's cost is every step's
time over it; its own model, since a blame-off callback on the blame-on
model would recompile the graph at every switch). The ring-only arm collects every step
with ``blame: {detail_steps: 0}`` (the per-parameter norms kept, no detail window after
an alert) on the every-step arm's model: ring only / blame off, target <= 1.01; its
per-layer part (the ring row and ``layer_rise``) is also timed directly and printed as a
share of the plain step (issue 43's budget: 1 % of a collected step). Blocks
of ``--steps`` steps alternate between them, the order rotated each round; each model
compiles (and warms up) before timing.

    python bench/trainers.py [--steps 5] [--rounds 8] [--arms plain,every,ring,off]

Prints the median ratio of monitored to plain block time with its spread (min..max over
rounds), the same for process CPU time, the ratio of two untouched models (the noise
floor: identical models differ by a few %), and the wrappers' own cost inside the graph
(one model, taps switched on and off). Targets: <= 1.05 every step, <= 1.01 every 10th.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
from mindcv.loss import create_loss
from mindcv.models import create_model
from mindcv.optim import create_optimizer
from mindcv.utils import create_trainer
from overhead import ON_LINE, RING_LINE, DetailSteps, LayerPart

from msmon_nb.monitor import Monitor

BATCH = 8
# arm (--arms) -> its name in the output, collection interval (None: never monitored),
# monitor_config.blame. Ring only: blame on, no detail window after an alert (what blame
# costs every step); it runs on the "every" arm's model (the same graph and taps).
ARMS = {
    "plain": ("plain", None, {}),
    "plain2": ("plain, 2nd model", None, {}),
    "every": ("every step", 1, {}),
    "ring": ("every step, ring only", 1, {"detail_steps": 0}),
    "tenth": ("every 10th", 10, {}),
    "off": ("every step, blame off", 1, {"enabled": False}),
}


def build():
    ms.set_seed(0)
    net = create_model("resnet18", num_classes=10)
    opt = create_optimizer(net.trainable_params(), opt="momentum", lr=0.01)
    model = create_trainer(
        net, create_loss(name="CE"), opt, metrics=None, amp_level="O0", amp_cast_list=None,
        loss_scale_type="fixed", loss_scale=1024.0, drop_overflow_update=False,
        clip_grad=True, clip_value=1.0,
    )  # fmt: skip
    return net, model


def dataset(steps: int):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * BATCH, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, size=steps * BATCH).astype(np.int32)
    return mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--arms",
        default=",".join(ARMS),
        help=f"comma-separated subset of: {','.join(ARMS)} (the smoke run: plain,every,ring,off)",
    )
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",")]
    if not {"plain", "every"} <= set(arms) or not set(arms) <= set(ARMS):
        parser.error(f"--arms: 'plain' and 'every' are needed, and only {list(ARMS)}")
    ms.set_context(mode=ms.GRAPH_MODE)
    base = tempfile.mkdtemp(prefix="msmon_bench_trainers_")
    variants: dict[str, tuple] = {}
    counts: dict[str, DetailSteps] = {}  # the timed rounds' steps inside a detail window
    parts: dict[str, LayerPart] = {}  # the ring arm's per-layer part, timed directly
    for arm, (name, freq, blame) in ARMS.items():
        if arm not in arms:
            continue
        shared = arm == "ring" and "every step" in variants
        if shared:  # the blame-on model: its compiled taps serve this callback as they are
            model, data = variants["every step"][0], variants["every step"][3]
        else:
            net, model = build()
            data = dataset(args.steps)  # a dataset serves one Model only
        mon = (
            Monitor(
                save_dir=base,
                run_name=name.replace(" ", "_").replace(",", ""),
                log_interval=freq,
                blame=blame,
            )
            if freq
            else None
        )
        callbacks = [mon.callback()] if mon else []
        if mon is not None:
            counts[name] = DetailSteps(mon)
        if arm == "ring":
            parts[name] = LayerPart(mon)
        model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)  # compile, warm up
        variants[name] = (model, callbacks, mon, data)
    params = sum(p.size for p in net.trainable_params())
    for c in counts.values():
        c.reset()
    for part in parts.values():
        part.reset()
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            model, callbacks, _, data = variants[name]
            t0, c0 = time.perf_counter(), time.process_time()
            model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
            times[name].append((time.perf_counter() - t0) / args.steps)
            cpu[name].append((time.process_time() - c0) / args.steps)
    plain = times["plain"]
    print(
        f"MindCV TrainStep (clip 1.0, loss scale 1024), resnet18 {params / 1e6:.1f} M params, "
        f"batch {BATCH}, {args.steps} steps x {args.rounds} rounds"
    )
    print(f"  plain: {statistics.median(plain) * 1e3:.0f} ms/step")
    for name, target in (
        ("plain, 2nd model", None),
        ("every step", 1.05),
        ("every 10th", 1.01),
        ("every step, ring only", None),
        ("every step, blame off", None),
    ):
        if name not in variants:
            continue
        ratios = [a / b for a, b in zip(times[name], plain, strict=True)]
        cpu_ratios = [a / b for a, b in zip(cpu[name], cpu["plain"], strict=True)]
        print(
            f"  {name}: {statistics.median(ratios):.3f}x plain "
            f"[{min(ratios):.3f}..{max(ratios):.3f}], CPU time "
            f"{statistics.median(cpu_ratios):.3f}x [{min(cpu_ratios):.3f}..{max(cpu_ratios):.3f}]"
            + (
                f" (target <= {target})"
                if target
                else (
                    " (two untouched models: the noise floor)" if name.startswith("plain") else ""
                )
            )
        )
    off = "every step, blame off"
    for name, label, target in (
        ("every step, ring only", RING_LINE[0], "target <= 1.01; "),
        ("every step", ON_LINE[0], ""),
    ):
        if off not in variants or name not in variants:
            continue
        ratios = [a / b for a, b in zip(times[name], times[off], strict=True)]
        cpu_ratios = [a / b for a, b in zip(cpu[name], cpu[off], strict=True)]
        print(
            f"  every step, {label}: {statistics.median(ratios):.3f}x "
            f"[{min(ratios):.3f}..{max(ratios):.3f}], "
            f"CPU time {statistics.median(cpu_ratios):.3f}x "
            f"[{min(cpu_ratios):.3f}..{max(cpu_ratios):.3f}] ({target}two models: "
            f"compare the noise floor); {counts[name]}"
        )
    for part in parts.values():
        plain_cpu = statistics.median(cpu["plain"])
        print(f"  {part.line('ring only', statistics.median(plain), plain_cpu)}")
    in_graph(variants["every step"], args.steps, args.rounds)
    for _model, _callbacks, mon, _data in variants.values():
        if mon is not None:
            mon.close()


def in_graph(variant: tuple, steps: int, rounds: int) -> None:
    """The wrappers' work inside the graph alone: the monitored model trained without its
    callback, the taps switched on and off between blocks (one compiled graph, so no
    difference between model instances)."""
    model, callbacks, _, data = variant
    taps = callbacks[0].tap
    times: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for on in (True, False) if r % 2 else (False, True):
            taps.set_collect(on)
            t0, c0 = time.perf_counter(), time.process_time()
            model.train(1, data, dataset_sink_mode=False)
            times[on].append((time.perf_counter() - t0) / steps)
            cpu[on].append((time.process_time() - c0) / steps)
    ratios = [a / b for a, b in zip(times[True], times[False], strict=True)]
    cost = statistics.median(times[True]) - statistics.median(times[False])
    cpu_cost = statistics.median(cpu[True]) - statistics.median(cpu[False])
    print(
        f"  in the graph, taps on / off (same model): {statistics.median(ratios):.3f}x "
        f"[{min(ratios):.3f}..{max(ratios):.3f}] = {cost * 1e3:.1f} ms/step wall, "
        f"{cpu_cost * 1e3:.1f} ms/step CPU"
    )


if __name__ == "__main__":
    main()
