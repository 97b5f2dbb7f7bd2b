"""A tiny real MindSpore training with activations tracked and a NaN in its data: the
heatmap's browser tests (viewer and notebook panel).

Three modules whose forward order (``embed``, ``body``, ``aux``) is neither their
alphabetical order nor the order they are defined in. ``aux`` reads a second input whose
batch at ``NAN_STEP`` holds a NaN: only ``aux``'s output is non-finite there (``embed`` and
``body`` never see it). The loop skips that step's update the way users do (its
gradients zeroed when the loss is not finite), so the weights stay finite and every other
step is clean. Collected every ``EVERY`` steps.
"""

from __future__ import annotations

NAN_STEP = 20
EVERY = 2
ROWS = ["embed", "body", "aux"]

# the network and the loop; ``steps`` and ``pause`` (seconds between steps) are filled in
NET = """
import time
import mindspore as ms, numpy as np
from mindspore import nn, ops

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        ms.set_seed(0)
        self.aux = nn.Dense(4, 3)
        self.body = nn.Dense(16, 3)
        self.embed = nn.Dense(8, 16)
        self.relu = nn.ReLU()

    def construct(self, x, z):
        return self.body(self.relu(self.embed(x))) + self.aux(z)

net = Net()
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
opt = nn.SGD(net.trainable_params(), 0.05)

def forward(x, z, y):
    return loss_fn(net(x, z), y)

grad_fn = ms.value_and_grad(forward, None, opt.parameters)
rng = np.random.default_rng(0)

def train(steps, pause, start=0):
    for step in range(start, start + steps):
        x = rng.normal(size=(32, 8)).astype(np.float32)
        z = rng.normal(size=(32, 4)).astype(np.float32)
        if step == {nan_step}:
            z[3, 1] = np.nan  # a bad sample in the data: aux's output only
        y = (x[:, 0] > 0).astype(np.int32)
        loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(z), ms.Tensor(y))
        if not np.isfinite(loss.asnumpy()):
            grads = tuple(ops.zeros_like(g) for g in grads)  # skip the bad batch
        opt(grads)
        time.sleep(pause)
""".replace("{nan_step}", str(NAN_STEP))

CONFIG = (
    f"dict(log_interval={EVERY}, track_metrics=['loss', 'grad_norm', 'learning_rate', "
    "'activations'])"
)

# a run written by a script: argv = save_dir, steps, pause; a snapshot right after the
# NaN step (each module's activation statistics at NAN_STEP)
SCRIPT = (
    NET
    + """
import sys
import msmon_nb as mm
mon = mm.Monitor(save_dir=sys.argv[1], run_name="acts", flush_secs=0.2, **CONFIG)
with mon, mon.watch():
    print("started", flush=True)
    steps, pause = int(sys.argv[2]), float(sys.argv[3])
    train(NAN_STEP + 1, pause)
    mon.snapshot()
    train(steps - NAN_STEP - 1, pause, NAN_STEP + 1)
""".replace("CONFIG", CONFIG).replace("NAN_STEP", str(NAN_STEP))
)


# heatmap.js's MSMON_HEAT_BAD: the colour a non-finite cell is drawn in
RED = [214, 39, 40]
CRITICAL = [0xB7, 0x1C, 0x1C]  # an alert's ring (chart.js MSMON_SEVERITY.critical)


def heat_pixel_js(selector: str, ring_top: bool = False) -> str:
    """A page function ``([i, j]) => [r, g, b]``: the colour of the canvas pixel at the
    centre of cell (row i, column j) of the heatmap at ``selector``, as the user sees it
    (the panel's and the viewer's heatmap are the same ``static/heatmap.js``); with
    ``ring_top``, of the pixel just above the cell's top edge, mid-cell, where an alert's
    ring round the cell is drawn (2 px wide, centred on the edge)."""
    y_of = "g.top + i * g.cellH - 0.5" if ring_top else "g.top + (i + 0.5) * g.cellH"
    return f"""([i, j]) => {{
  const chart = document.querySelector('{selector}').msmonChart;
  const g = chart.drawn().geometry;
  const dpr = window.devicePixelRatio || 1;
  const x = Math.round((g.left + (j + 0.5) * g.cellW) * dpr);
  const y = Math.floor(({y_of}) * dpr);
  return [...chart.canvas.getContext('2d').getImageData(x, y, 1, 1).data].slice(0, 3);
}}"""
