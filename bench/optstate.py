"""Cost of ``optimizer_state`` per collected step, on an Adam-trained MLP (CPU, PyNative).

For the 10 M-parameter MLP of ``bench/scale.py`` (or ``--size``) trained with ``nn.Adam``
(two moments per parameter: 21 M floats of state) it measures, as medians:

* the plain training step (``value_and_grad`` + ``opt(grads)``), for scale;
* ``OptimizerState.read`` alone on both paths: host (the CPU default: ``asnumpy`` shares
  the moments' memory, BLAS dots in float64 chunks) and device (one compiled graph,
  one array copied; the Ascend/GPU default), plus the device graph's one-off compile;
* a collected ``mon.step(loss=..., grads=..., optimizer=opt)`` with ``optimizer_state``
  tracked minus the same call without it (what the user pays, records included).

    GLOG_v=3 .venv/bin/python bench/optstate.py [--size 10M] [--repeats 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms
import numpy as np
from mindspore import nn

# run as a script: bench/ is on sys.path, so the MLP sizes are the scale bench's own
from scale import SIZES, mlp

from msmon_nb.collect.optstate import PATH_ENV, OptimizerState
from msmon_nb.config import CORE_METRICS
from msmon_nb.monitor import Monitor


def median_secs(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="10M")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    features, hidden, blocks = SIZES[args.size]
    ms.set_seed(0)
    net = mlp(features, hidden, blocks)
    n_params = sum(p.size for p in net.trainable_params())
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    x = ms.ops.randn(16, features)
    y = ms.Tensor([i % 10 for i in range(16)], ms.int32)

    def train_step():
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss, grads

    for _ in range(3):
        train_step()
    step = median_secs(train_step, args.repeats)

    warned: list[str] = []
    reader = OptimizerState([".*"], lambda key, msg: warned.append(msg))
    results = {}
    for path in ("host", "device"):
        os.environ[PATH_ENV] = path
        t0 = time.perf_counter()
        values = reader.read(opt)
        first = time.perf_counter() - t0
        results[path] = (median_secs(lambda: reader.read(opt), args.repeats), first)
    os.environ.pop(PATH_ENV)

    loss, grads = train_step()
    with tempfile.TemporaryDirectory() as tmp:
        costs = {}
        for label, metrics in (
            ("without", list(CORE_METRICS)),
            ("with", [*CORE_METRICS, "optimizer_state"]),
        ):
            # the same gradients every call: the vanishing/plateau rules would fire
            quiet = {"disabled": ["grad_vanishing", "loss_plateau"]}
            with Monitor(save_dir=tmp, track_metrics=metrics, alerts=quiet) as mon:
                mon.step(loss=loss, grads=grads, optimizer=opt)  # first use: plans, files
                costs[label] = median_secs(
                    lambda mon=mon: mon.step(loss=loss, grads=grads, optimizer=opt), args.repeats
                )

    # the floor of any host-side norm: one read of every moment byte
    big = np.ones(64 << 20, np.float32)
    read_rate = big.nbytes / median_secs(lambda: np.dot(big, big), 5)
    floor = 2 * n_params * 4 / read_rate
    ms_ = 1e3
    print(
        f"MindSpore {ms.__version__}, {args.size} MLP: {n_params / 1e6:.1f} M parameters, "
        f"Adam state {2 * n_params / 1e6:.1f} M floats in {len(values)} moment tensors"
    )
    print(f"plain training step:                      {step * ms_:8.2f} ms")
    print(
        f"floor: {2 * n_params * 4 / 1e6:.0f} MB of moments at {read_rate / 1e9:.1f} GB/s "
        f"read:  {floor * ms_:8.2f} ms"
    )
    for path, (secs, first) in results.items():
        print(
            f"OptimizerState.read, {path:6s} path:        {secs * ms_:8.2f} ms "
            f"(first call {first * ms_:.0f} ms)"
        )
    extra = costs["with"] - costs["without"]
    print(
        f"collected mon.step: {costs['without'] * ms_:.2f} ms without, "
        f"{costs['with'] * ms_:.2f} ms with optimizer_state: +{extra * ms_:.2f} ms "
        f"({extra / step:.1%} of the plain step)"
    )
    if warned:
        print("warnings:", warned)


if __name__ == "__main__":
    main()
