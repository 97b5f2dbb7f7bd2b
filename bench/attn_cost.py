"""What ``attention`` costs inside compiled steps (``collect.attntaps``): ``Model.train`` in
GRAPH_MODE of a small transformer encoder, in one process, blocks alternating.

Model: 2 ``nn.TransformerEncoderLayer`` (width 64, 4 heads, feed-forward 128, causal
mask), sequences of 32, batch 16, Adam, CPU. Arms, each on models of its own
(``--instances``), one epoch of ``--train-steps`` steps a block, order rotated each round
(round 0 compiles and is not timed): plain (a model msmon never touched); the core
metrics every 10th step; the same plus ``attention`` (two modules' max logit and entropy
computed in the graph on collected steps: float64 on the CPU); and attention every step.
Ratios per round against plain and against the core monitor beside it: median (min-max).

    python bench/attn_cost.py [--train-steps 30] [--rounds 12] [--instances 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import mindspore.dataset as mds  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.train import Model  # noqa: E402

from bench.overhead import print_vs_core, rotated_model_blocks  # noqa: E402
from msmon_nb.monitor import Monitor  # noqa: E402

SEQ, WIDTH, HEADS, BATCH = 32, 64, 4, 16
CORE = ["loss", "grad_norm", "learning_rate", "throughput", "step_time", "global_step"]


class Encoder(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        ms.set_seed(0)
        self.embed = nn.Dense(8, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Dense(WIDTH, 3)
        self.mask = ms.Tensor(np.triu(np.ones((SEQ, SEQ), np.float32) * -np.inf, 1))

    def construct(self, x):
        return self.head(self.encoder(self.embed(x), src_mask=self.mask).mean(1))


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}"
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--instances", type=int, default=1)
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(BATCH * args.train_steps, SEQ, 8)).astype(np.float32)
    y = (x[:, :, 0].sum(1) > 0).astype(np.int32)
    arms = {
        "plain": None,
        "core, every 10th": dict(log_interval=10, track_metrics=CORE),
        "+ attention, every 10th": dict(log_interval=10, track_metrics=[*CORE, "attention"]),
        "+ attention, every step": dict(log_interval=1, track_metrics=[*CORE, "attention"]),
    }
    base = tempfile.mkdtemp(prefix="msmon_attn_cost_")
    blocks: dict[str, list] = {name: [] for name in arms}
    mons = []
    for name, cfg in arms.items():
        mon = None
        if cfg is not None:
            mon = Monitor(save_dir=base, run_name=f"attn_{len(mons)}", **cfg)
            mons.append(mon)
        for _ in range(args.instances):
            net = Encoder()
            opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)
            loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
            data = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
            model = Model(net, loss_fn=loss_fn, optimizer=opt)
            blocks[name].append((model, data, mon.callback() if mon else None))
    times = rotated_model_blocks(blocks, args.rounds)
    for mon in mons:
        mon.close()
    print(
        f"attention in Model.train (GRAPH_MODE, Adam, 2 encoder layers), {args.train_steps}-step "
        f"epochs x {args.rounds} rounds x {args.instances} models a variant:"
    )
    print_vs_core(times, args.train_steps, spread, 26)


if __name__ == "__main__":
    main()
