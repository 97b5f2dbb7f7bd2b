"""Cost of one collected step against parameter count, next to the memory-bandwidth floor.

For MLPs of about 1 M, 10 M and 40 M parameters (CPU, PyNative, batch 16) it measures:

* the plain step (``value_and_grad`` + optimizer, no monitoring);
* the monitored cost of one collected step, ``mon.step(loss=..., grads=..., lr=...)``,
  on both grad_norm paths, alternating step by step in one process:
  - host: every gradient read on the host (``asnumpy`` shares memory on CPU), a BLAS dot
    each, the records written;
  - device (``MSMON_GRAD_NORM_PATH=device``, what Ascend/GPU use): one ``jit`` launch
    reducing every gradient, and the previous step's scalar read (``collect.devnorm``);
* the floor: bytes of gradients / this machine's measured copy bandwidth (one read of
  every gradient byte is the least any norm can do).

It prints both costs, the floor, cost/floor (target <= 1.5) and the cost as a share of
the plain step. On CPU the host path is the default because it is the faster one here.

    GLOG_v=3 .venv/bin/python bench/scale.py [--repeats 10]
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

from msmon_nb.monitor import Monitor

SIZES = {"1M": (512, 1024, 1), "10M": (1024, 2048, 3), "40M": (2048, 4096, 3)}


def mlp(features: int, hidden: int, blocks: int) -> nn.Cell:
    layers: list[nn.Cell] = [nn.Dense(features, hidden), nn.ReLU()]
    for _ in range(blocks - 1):
        layers += [nn.Dense(hidden, hidden), nn.ReLU()]
    layers.append(nn.Dense(hidden, 10))
    return nn.SequentialCell(layers)


def copy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes per second numpy copies a large float32 buffer on this machine."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return nbytes / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(name: str, repeats: int, bandwidth: float) -> dict[str, float]:
    features, hidden, blocks = SIZES[name]
    ms.set_seed(0)
    net = mlp(features, hidden, blocks)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    a = ms.Tensor(np.random.default_rng(0).normal(size=(16, features)).astype(np.float32))
    b = ms.Tensor(np.zeros(16, np.int32))
    params = sum(int(np.prod(p.shape)) for p in opt.parameters)
    plain: list[float] = []
    cost: dict[str, list[float]] = {"host": [], "device": []}
    base = tempfile.mkdtemp()
    mons = {path: Monitor(save_dir=base, run_name=path, log_interval=1) for path in cost}
    try:
        for i in range(2 * repeats + 4):
            path = "host" if i % 2 == 0 else "device"
            os.environ["MSMON_GRAD_NORM_PATH"] = path
            t = time.perf_counter()
            loss, grads = grad_fn(a, b)
            opt(grads)
            loss.asnumpy()
            step = time.perf_counter() - t
            t = time.perf_counter()
            mons[path].step(loss=loss, grads=grads, lr=0.01, batch_size=16)
            if i >= 4:  # compile and first-touch costs are not the steady state
                plain.append(step)
                cost[path].append(time.perf_counter() - t)
    finally:
        os.environ.pop("MSMON_GRAD_NORM_PATH", None)
        for mon in mons.values():
            mon.close()
    floor = params * 4 / bandwidth
    return {
        "params": params,
        "plain_ms": statistics.median(plain) * 1e3,
        "host_ms": statistics.median(cost["host"]) * 1e3,
        "device_ms": statistics.median(cost["device"]) * 1e3,
        "floor_ms": floor * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sizes", nargs="*", default=list(SIZES))
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth: {bandwidth / 1e9:.1f} GB/s (numpy copyto, 256 MB)")
    print(
        f"{'size':>5} {'params':>11} {'plain ms':>9} {'floor ms':>9} | {'host ms':>8} "
        f"{'/floor':>7} {'share':>7} | {'device ms':>9} {'/floor':>7} {'share':>7}"
    )
    for name in args.sizes:
        r = measure(name, args.repeats, bandwidth)
        host, dev, floor, plain = r["host_ms"], r["device_ms"], r["floor_ms"], r["plain_ms"]
        print(
            f"{name:>5} {r['params']:>11,} {plain:>9.1f} {floor:>9.2f} | {host:>8.2f} "
            f"{host / floor:>7.2f} {host / plain:>7.1%} | {dev:>9.2f} {dev / floor:>7.2f} "
            f"{dev / plain:>7.1%}"
        )


if __name__ == "__main__":
    main()
