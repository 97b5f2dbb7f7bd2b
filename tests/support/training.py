"""A monitored training script in a process of its own (``python -c``), as a user's
``python train.py`` runs: for the controls that act from outside the page."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, time
import mindspore as ms
from mindspore import nn
import msmon_nb as mm
from tests.support import tiny

x, y = tiny.data()
net = tiny.mlp()
opt = nn.SGD(net.trainable_params(), 0.05)
loss_fn = tiny.loss_fn()
grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
with mm.Monitor(save_dir=sys.argv[1], run_name="ctl", log_interval=1) as mon, mon.watch():
    print(mon.run_dir, flush=True)
    for a, b in tiny.batches(x, y, steps=100000):
        loss, grads = grad_fn(a, b)
        opt(grads)
        time.sleep(0.01)
print("status", mon.status, flush=True)
"""


@contextmanager
def training_script(base: Path) -> Iterator[tuple[subprocess.Popen, Path]]:
    """(the process, its run dir) once the run's marker is written; killed at the end
    if still running."""
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(base)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        run_dir = Path(proc.stdout.readline().strip())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (run_dir / "msmon_run.json").exists():
            time.sleep(0.1)
        yield proc, run_dir
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
