"""A data-parallel training script run by the tests under ``msrun`` (2 CPU workers).

    msrun --worker_num=2 --local_worker_num=2 ... dp_train.py SAVE_DIR MODE STEPS

MODE: ``straggle`` (rank 1 sleeps 150 ms before each batch from step 30) or ``kill``
(rank 1 kills itself with SIGKILL when step 40 begins). The loop itself is an ordinary
MindSpore data-parallel loop under ``mon.watch()``.
"""

import os
import signal
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init

from msmon_nb.monitor import Monitor

save_dir, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
init()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
rank, size = get_rank(), get_group_size()
ms.set_seed(0)
net = nn.SequentialCell([nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 3)])
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
opt = nn.SGD(net.trainable_params(), 0.05)
reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=size)
grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
rng = np.random.default_rng(rank)


def batches():
    for step in range(steps):
        if mode == "straggle" and rank == 1 and step >= 30:
            time.sleep(0.15)  # a slow input pipeline on rank 1
        if mode == "kill" and rank == 1 and step == 40:
            os.kill(os.getpid(), signal.SIGKILL)
        x = rng.normal(size=(16, 8)).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int32)
        yield ms.Tensor(x), ms.Tensor(y)


with Monitor(save_dir=save_dir, model_name="dp", flush_secs=0.2) as mon, mon.watch():
    for x, y in batches():
        loss, grads = grad_fn(x, y)
        grads = reducer(grads)
        opt(grads)
print(f"rank {rank} done: {mon.run_dir}", flush=True)
