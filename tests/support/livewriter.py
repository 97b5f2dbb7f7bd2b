"""A process that writes a run step by step, as a training run would: the viewer's live tests.

20 steps of scalars every ``pause`` s, the last step printed after each flush (so a test
knows what is on disk). Two curves: ``plain`` (``train/loss`` = 1/(step+1) and a
``train/lr`` tag that is not one of the core charts) and ``gentle`` (a slow loss decay
and ``train/learning_rate``: what a screenshot should show).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

WRITER = r"""
import sys, time
from msmon_nb.events.writer import EventWriter
writer = EventWriter(sys.argv[1], flush_secs=0.1)
gentle = len(sys.argv) > 3 and sys.argv[3] == "gentle"
step = 0
try:
    while True:
        for _ in range(20):
            if gentle:
                values = {"train/loss": 2.0 / (1 + step / 200), "train/learning_rate": 1e-3}
            else:
                values = {"train/loss": 1.0 / (step + 1), "train/lr": 0.1}
            writer.add_scalars(step, values)
            step += 1
        writer.flush()
        print(step - 1, flush=True)
        time.sleep(float(sys.argv[2]))
finally:
    writer.close()
"""


def start_writer(run_dir: Path, pause: float, curve: str = "plain") -> subprocess.Popen:
    """The writer process for ``run_dir`` (the caller kills it)."""
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(run_dir), str(pause), curve],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
