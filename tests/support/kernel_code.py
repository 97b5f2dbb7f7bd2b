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
