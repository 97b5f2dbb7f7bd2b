"""What polling the control file costs a step (``msmon ctl``, the viewer's buttons).

The monitor checks at every step boundary whether ``POLL_SECS`` have passed (one clock
read), and only then stats the control file (and reads it if it grew). Printed: the
boundary of a real ``Monitor`` with and without its control reader (same process,
alternating blocks, median and spread), the check alone, and a stat of the file.
Target: <= 2 us a step.

    python bench/control.py [--steps 200000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("GLOG_v", "3")

from msmon_nb.monitor import Monitor
from msmon_nb.rundir.control import ControlReader


def per_call(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="msmon_bench_control_")
    mon = Monitor(save_dir=base, run_name="control")
    state = mon.boundary_state  # the same boundary, with and without the control file
    reader = state.control
    boundary = mon.boundary
    on, off = [], []
    for r in range(args.rounds):
        for with_reader in (True, False) if r % 2 else (False, True):
            state.control = reader if with_reader else None
            cost = per_call(lambda: boundary(False), args.steps)
            (on if with_reader else off).append(cost)
    state.control = reader
    extra = [a - b for a, b in zip(on, off, strict=True)]
    print(f"Monitor step boundary, {args.steps} calls x {args.rounds} rounds:")
    print(
        f"  without the control reader {statistics.median(off) * 1e9:.0f} ns, with it "
        f"{statistics.median(on) * 1e9:.0f} ns: +{statistics.median(extra) * 1e9:.0f} ns "
        f"[{min(extra) * 1e9:.0f}..{max(extra) * 1e9:.0f}] a step (target <= 2000 ns)"
    )
    fresh = ControlReader(mon.run_dir)
    due = per_call(lambda: fresh.due(time.monotonic()), args.steps)
    stat = per_call(fresh.read, 20_000)
    print(
        f"  the time check alone: {due * 1e9:.0f} ns; looking at an unchanged file "
        f"(every {0.2:g} s): {stat * 1e6:.1f} us"
    )
    mon.close()


if __name__ == "__main__":
    main()
