"""Code the notebook tests run inside a real kernel: a tiny model and the extension."""

SETUP = """import os, time
os.environ["GLOG_v"] = "3"
import mindspore as ms, numpy as np
from mindspore import nn
import msmon_nb as mm
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype(np.float32); y = (x[:, 0] > 0).astype(np.int32)
net = nn.SequentialCell([nn.Dense(8, 8), nn.ReLU(), nn.Dense(8, 2)])
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
opt = nn.SGD(net.trainable_params(), 0.05)
grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
%load_ext msmon_nb"""

# one batch and a 32-64-2 MLP; OPTIMIZER builds ``opt`` (default: Momentum, lr warmup)
MLP_SETUP = """import os, time
os.environ["GLOG_v"] = "3"
import mindspore as ms, numpy as np
from mindspore import nn
rng = np.random.default_rng(0)
x = ms.Tensor(rng.normal(size=(64, 32)).astype(np.float32))
y = ms.Tensor((rng.normal(size=64) > 0).astype(np.int32))
net = nn.SequentialCell([nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 2)])
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
OPTIMIZER
grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
%load_ext msmon_nb"""

# a 4,000-step cell that runs ~90 s (the browser tests stop it earlier)
LIVE_SETUP = MLP_SETUP.replace(
    "OPTIMIZER",
    "lr = nn.warmup_lr(0.1, 4000, 1, 200)\nopt = nn.Momentum(net.trainable_params(), lr, 0.9)",
)

LIVE_TRAIN = """%%msmonitor --dir {base} --run live
for step in range(4000):
    loss, grads = grad_fn(x, y)
    opt(grads)
    time.sleep(0.02)
"""
