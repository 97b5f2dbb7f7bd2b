"""Cross-rank checks during a distributed job, without a collective and without the GIL.

The cross-rank rules (``diagnose/rankrules.py``) compare every rank's records. An
all-gather in the training step would put monitoring on the job's critical path, and a
thread inside rank 0 is no better: when a rank dies, the others hang inside the
all-reduce holding the GIL, so an in-process checker never runs again (checked with a
real ``msrun`` job). Rank 0 therefore starts a small watcher *process*
(``python -m msmon_nb.monitor.rankwatch RUN_DIR ALERTS_FILE PID``, no MindSpore import) that
every ``INTERVAL`` seconds reads what the ranks appended and records each new
cross-rank alert once in ``rank_0/alerts.jsonl`` with ``"cross_rank": true``, where
``load_run(...).alerts``, ``msmon runs`` and the viewer find it. The watcher lives in its
own session (a launcher killing the job's process group leaves it to finish), and exits
after a last check once rank 0's process is gone. When rank 0 closes normally it stops
the watcher and runs the last check itself, adding the alerts to ``mon.alerts``.
A failure is warned about once; training goes on.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msmon_nb.diagnose.alert import Alert
from msmon_nb.diagnose.rankrules import alert_key, rank_alerts
from msmon_nb.events.runs import Run
from msmon_nb.monitor.records import RunRecords
from msmon_nb.rundir import ALERTS, pid_alive, read_jsonl

if TYPE_CHECKING:
    from msmon_nb.monitor import Monitor

log = logging.getLogger("msmon_nb")

INTERVAL = 2.0


class CrossRankRecorder:
    """Runs the cross-rank rules over a run dir; appends each new problem once (one per
    kind and rank; per onset too for kinds that recur, ``diagnose.ranks.alert_key``)."""

    def __init__(self, run_dir: Path, alerts_file: Path) -> None:
        self.run = Run(run_dir)
        self.alerts_file = alerts_file

    def _recorded(self) -> set[tuple[Any, ...]]:
        """What is already in the file: another recorder (process) may have written it."""
        return {alert_key(item) for item in read_jsonl(self.alerts_file) if item.get("cross_rank")}

    def check(self) -> list[Any]:
        """Read what the ranks appended, run the rules; the alerts recorded just now."""
        self.run.refresh()
        seen = self._recorded()
        new = []
        for alert in rank_alerts(self.run):
            if alert_key(alert) in seen:
                continue
            seen.add(alert_key(alert))
            RunRecords(self.alerts_file.parent).alert(alert, cross_rank=True)
            new.append(alert)
        return new


class RankWatcher:
    """Rank 0's side: starts the watcher process, stops it, and checks one last time."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.proc: subprocess.Popen | None = None

    def start(self) -> RankWatcher:
        """Start the watcher process (warn once and go on if it cannot start)."""
        mon = self.monitor
        assert mon.run_dir is not None and mon.write_dir is not None
        cmd = [
            sys.executable,
            "-m",
            "msmon_nb.monitor.rankwatch",
            str(mon.run_dir),
            str(mon.write_dir / ALERTS),
            str(os.getpid()),
        ]
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                env=_child_env(),
            )
        except OSError as exc:
            mon.warn_once("rankwatch", f"cannot start the cross-rank watcher: {exc}")
        return self

    def close(self) -> None:
        """Stop the watcher; then the last check here, its alerts added to ``mon.alerts``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        mon = self.monitor
        if mon.run_dir is None or mon.write_dir is None:
            return
        recorder = CrossRankRecorder(mon.run_dir, mon.write_dir / ALERTS)
        found = mon.guard("cross-rank checks", recorder.check) or []
        for alert in found:
            log.warning("msmon: %s", alert.message)
        mon.alerts.extend(self._watcher_found(recorder, found))

    def _watcher_found(self, recorder: CrossRankRecorder, found: list[Any]) -> list[Any]:
        """Every cross-rank alert of the run as ``Alert``s (the watcher's and ``found``)."""
        have = {alert_key(a) for a in self.monitor.alerts}
        out = []
        for item in recorder.run.alerts:
            if item.get("cross_rank") and alert_key(item) not in have:
                have.add(alert_key(item))
                out.append(Alert.from_dict(item))
        return out


def _child_env() -> dict[str, str]:
    """The watcher needs msmon_nb importable however rank 0 found it (e.g. a checkout)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the dir holding msmon_nb/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a killed rank stays a zombie until msrun reaps it)."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def watch(run_dir: Path, alerts_file: Path, parent: int, interval: float = INTERVAL) -> None:
    """The watcher process's loop: check, sleep (backing off on long runs), until the
    parent is gone (then one last check) or SIGTERM (rank 0 checks for itself)."""
    stopping = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    try:  # below the ranks: on a busy host the watcher must not make rank 0 a straggler
        os.nice(10)
    except OSError:
        pass
    recorder = CrossRankRecorder(run_dir, alerts_file)
    wait = interval
    while not stopping:
        began = time.perf_counter()
        try:
            recorder.check()
        except Exception:  # a damaged or vanished run dir: nothing left to watch
            log.debug("msmon: cross-rank check failed", exc_info=True)
            return
        if recorder.run.rank_status().get(0, "running") != "running":
            return  # rank 0 closed its run (its own last check covers the end)
        # the rules re-read whole series: on a long job keep them to ~2 % of a core
        wait = max(interval, 50 * (time.perf_counter() - began))
        deadline = time.monotonic() + wait
        while not stopping and time.monotonic() < deadline:
            if not _alive(parent):
                time.sleep(0.5)  # let the other ranks' last flushes land
                try:
                    recorder.check()
                except Exception:
                    log.debug("msmon: last cross-rank check failed", exc_info=True)
                return
            time.sleep(min(0.2, wait))


if __name__ == "__main__":
    watch(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
