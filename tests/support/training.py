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


def model_train_under_ctl(
    base: Path, steps: int, lr: list[float], ctl: list[str], at: int = 5, then: list | None = None
):
    """A ``Model.train`` run (Momentum, list lr ``lr``) monitored in this process, with
    ``msmon ctl RUN *ctl`` sent from a real process of its own at step ``at`` (and
    ``msmon ctl RUN *then`` once it answered); the steps wait a little until it answered
    (the monitor reads the control file at step boundaries). (the monitor, the
    optimizer, ctl's stdout and stderr, ctl's exit code)."""
    import mindspore.dataset as mds
    from mindspore import nn
    from mindspore.train import Callback, Model

    from msmon_nb.monitor import Monitor
    from tests.support import tiny

    def start(args: list[str]) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "msmon_nb.cli", "ctl", str(mon.run_dir), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )

    class Pace(Callback):
        proc: subprocess.Popen | None = None
        first: subprocess.Popen | None = None

        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == at:
                self.proc = self.first = start(ctl)
            if self.proc is not None and self.proc.poll() is None:
                time.sleep(0.05)
            elif then and self.proc is self.first and self.proc is not None:
                self.proc = start(then)

    x, y = tiny.data(n=32 * steps)
    data = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(32)
    net = tiny.mlp()
    opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
    model = Model(net, loss_fn=tiny.loss_fn(), optimizer=opt)
    pace = Pace()
    with Monitor(save_dir=str(base), run_name="acted", log_interval=1) as mon:
        model.train(1, data, callbacks=[mon.callback(), pace], dataset_sink_mode=False)
    out, err = pace.first.communicate(timeout=60)
    if pace.proc is not pace.first:
        more, more_err = pace.proc.communicate(timeout=60)
        out, err = out + more, err + more_err
    return mon, opt, out + err, pace.first.returncode
