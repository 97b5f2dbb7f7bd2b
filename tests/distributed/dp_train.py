"""A data-parallel training script run by the tests under ``msrun`` (2 CPU workers).

    msrun --worker_num=2 --local_worker_num=2 ... dp_train.py SAVE_DIR MODE STEPS [LOOP]

MODE: ``straggle`` (rank 1 sleeps 150 ms each step from step 30, in plain Python outside
any framework call: in the batch generator, at the top of the loop body, or in a
callback's ``on_train_step_begin``), ``kill`` (rank 1 kills itself with SIGKILL when
step 40 begins), ``outlier`` (rank 1's batch at step 40 is scaled x50 and its labels
flipped: an unnormalised, mislabelled record), ``checkpoint`` (from step 20 both ranks
slow to 0.2 s a step until each rank's checkpoint is on disk: the test sends ``msmon ctl
RUN checkpoint`` mid-run, and however late it comes, it lands before the loop ends),
``healthy``. Modes join with ``+``: ``healthy+checkpoint``.

LOOP: ``watch`` (default: an ordinary loop under ``mon.watch()``), ``step`` (the same
loop recorded with explicit ``mon.step``, which is given the optimizer, as a user's
loop gives it for ``checkpoint`` to have something to save), ``model`` (``Model.train`` with the
monitor's callback; steps counted from 1 as MindSpore counts them), ``graph`` (the
same ``Model.train`` in GRAPH mode, where the all-reduce is compiled).
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
from msmon_nb.rundir import CHECKPOINTS

save_dir, mode, steps = sys.argv[1], sys.argv[2].split("+"), int(sys.argv[3])
loop = sys.argv[4] if len(sys.argv) > 4 else "watch"
if loop == "graph":
    ms.set_context(mode=ms.GRAPH_MODE)
init()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
rank, size = get_rank(), get_group_size()
ms.set_seed(0)
net = nn.SequentialCell([nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 3)])
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
opt = nn.SGD(net.trainable_params(), 0.05)
rng = np.random.default_rng(rank)
BATCH, SLOW_FROM, OUTLIER_AT, HOLD_FROM = 16, 30, 40, 20


def saved_everywhere() -> bool:
    """Every rank's checkpoint is on disk (each rank saves into its own ``rank_<k>/``)."""
    return len(list(mon.run_dir.glob(f"rank_*/{CHECKPOINTS}/step_*.ckpt"))) >= size


def slow_down(step: int) -> None:
    """The straggler, the killed rank and the wait for a checkpoint: plain Python, no
    framework call. Both ranks wait alike (for every rank's file), so no rank is slower."""
    if "straggle" in mode and rank == 1 and step >= SLOW_FROM:
        time.sleep(0.15)
    if "checkpoint" in mode and step >= HOLD_FROM and not saved_everywhere():
        time.sleep(0.2)
    if "kill" in mode and rank == 1 and step == 40:
        os.kill(os.getpid(), signal.SIGKILL)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(BATCH, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    if "outlier" in mode and rank == 1 and step == OUTLIER_AT:
        x, y = x * 50.0, 1 - y  # unnormalised and mislabelled: a confident wrong answer
    return x, y


def batches():
    for step in range(steps):
        slow_down(step)
        x, y = batch(step)
        yield ms.Tensor(x), ms.Tensor(y)


with Monitor(save_dir=save_dir, model_name="dp", flush_secs=0.2) as mon:
    if loop in ("watch", "step"):
        reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=size)
        grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    if loop == "watch":
        with mon.watch():
            for x, y in batches():
                loss, grads = grad_fn(x, y)
                grads = reducer(grads)
                opt(grads)
    elif loop == "step":
        for step in range(steps):
            slow_down(step)
            x, y = batch(step)
            loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
            reduced = reducer(grads)
            opt(reduced)
            mon.step(loss=loss, grads=reduced, batch_size=BATCH, optimizer=opt)
    else:
        import mindspore.dataset as ds
        from mindspore.train import Callback, Model

        class SlowRank(Callback):
            def on_train_step_begin(self, run_context):
                slow_down(run_context.original_args().cur_step_num)

        data = [batch(step) for step in range(1, steps + 1)]  # Model.train counts from 1
        xs = np.concatenate([x for x, _ in data])
        ys = np.concatenate([y for _, y in data])
        dataset = ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False).batch(BATCH)
        model = Model(net, loss_fn, opt)
        model.train(1, dataset, callbacks=[SlowRank(), mon.callback()], dataset_sink_mode=False)
# the monitor put nn.DistributedGradReducer back as it found it (collect.comm)
restored = "__call__" not in vars(nn.DistributedGradReducer)
print(f"rank {rank} done: {mon.run_dir} reducer restored: {restored}", flush=True)
