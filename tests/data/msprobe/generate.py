"""Writes the msprobe monitor output checked in beside this script (``run/``).

msprobe is not a dependency of msmon_nb, so the files its monitor wrote are checked in and
this script says how they were made, for anyone who wants to make them again:

    python -m venv /tmp/msprobe-venv  # or: pip install --target DIR, then PYTHONPATH=DIR
    pip install mindstudio-probe==26.2.0 --no-deps einops 'pandas<2.3' pytz openpyxl
    PYTHONPATH=<that dir> msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 \\
        --master_port=8129 --join=True tests/data/msprobe/generate.py tests/data/msprobe/run

(``python tests/data/msprobe/generate.py OUT`` alone makes one rank.) ``run/`` holds the
two rank dirs msprobe made under its ``MONITOR_OUTPUT_DIR``.

Made with mindstudio-probe 26.2.0 and MindSpore 2.10.0 on the CPU (PyNative), a tiny MLP
(8-16-4, ReLU) and ``mindspore.mint.optim.Adam``, 2 ranks (msrun, CPU), 12 steps,
``step_count_per_record`` 5 (so three windows per kind: 0-4, 5-9, 10-14).

Three things had to be done for msprobe to run here, each where msprobe needs it:

* its ``norm`` statistic calls ``mint.norm`` (``LinalgVectorNorm``), which has no CPU
  kernel, so training aborts: ``FUNC_MAP["norm"]`` is patched below to the square root of
  the sum of squares in float32, a function the CPU has;
* its optimizer hook reads each gradient from ``param.grad`` (a torch-style attribute a
  MindSpore Parameter does not have), so the loop sets it before the optimizer step;
* its activation hooks skip a cell whose ``training`` is False, so the net is
  ``set_train()``.

On MindSpore 2.10's CPU ``mint.optim.Adam`` updates its moments but not the weights
(``state_step`` stays 0): the ``param_*`` values repeat. ``mint.optim.AdamW`` has no CPU
kernel, and msprobe finds moments only in parameters named ``exp_avg``/``exp_avg_sq``, so
``nn.Adam`` would give none. The files are what msprobe wrote either way.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np


def main(out: str) -> None:
    import mindspore as ms
    import mindspore.common.dtype as mstype
    import msprobe.mindspore.monitor.features as features
    from mindspore import mint, nn, ops

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    rank = 0
    if os.environ.get("MS_WORKER_NUM"):  # under msrun: one process per rank
        from mindspore.communication import get_rank, init

        init()
        rank = get_rank()
    ms.set_seed(rank)

    def cpu_norm(x):
        # LinalgVectorNorm has no CPU kernel: the same L2 norm from ops the CPU has
        x = x.astype(mstype.float32)
        return ops.sqrt((x * x).sum())

    features.FUNC_MAP["norm"] = cpu_norm
    from msprobe.mindspore import TrainerMon

    class MLP(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Dense(8, 16)
            self.act = nn.ReLU()
            self.fc2 = nn.Dense(16, 4)

        def construct(self, x):
            return self.fc2(self.act(self.fc1(x)))

    net = MLP()
    net.set_train()
    opt = mint.optim.Adam(net.trainable_params(), lr=1e-2)
    Path(out).mkdir(parents=True, exist_ok=True)
    os.environ["MONITOR_OUTPUT_DIR"] = out
    config = {
        "targets": {"fc1": {}, "act": {}, "fc2": {}},
        "xy_distribution": True,
        "wg_distribution": True,
        "mv_distribution": True,
        "param_distribution": True,
        "ops": ["norm", "min", "max", "mean", "zeros", "nans"],
        "format": "csv",
        "step_count_per_record": 5,
    }
    config_path = Path(out).resolve().parent / f"config_{rank}.json"
    config_path.write_text(json.dumps(config))
    mon = TrainerMon(str(config_path), params_have_main_grad=False)
    mon.set_monitor(net, opt)
    config_path.unlink()

    loss_fn = nn.CrossEntropyLoss()

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    rng = np.random.default_rng(rank)
    for step in range(12):
        x = ms.Tensor(rng.standard_normal((32, 8)).astype(np.float32))
        y = ms.Tensor(rng.integers(0, 4, 32).astype(np.int32))
        loss, grads = grad_fn(x, y)
        for param, grad in zip(opt.parameters, grads, strict=True):
            param.grad = grad  # msprobe's optimizer hook reads param.grad
        opt(grads)
        print(f"rank {rank} step {step} loss {float(loss):.4f}")


if __name__ == "__main__":
    main(sys.argv[1])
