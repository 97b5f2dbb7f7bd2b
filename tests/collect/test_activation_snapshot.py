"""A snapshot with activations tracked lists every module's activation statistics at the
step they were last collected: the Snapshot command (the panel's button, ``msmon ctl``)
and ``mm.snapshot()`` alike, in ``snapshots.jsonl`` and the monitor's list the panel shows.

A real tiny MindSpore training (``tests.support.acttrain``: a NaN in ``aux``'s input at
``NAN_STEP``); the expected values are the run's own ``act/`` series at that step (float32
in the summary file, float64 in the snapshot: compared at float32 precision).
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np

from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from msmon_nb.monitor.controls import interpret
from tests.support.acttrain import EVERY, NAN_STEP, NET, ROWS

STATS = ["norm", "max_abs", "mean", "nonfinite", "zero_frac"]


def trained(where):
    """The acttrain network and its ``train(steps, pause)`` loop, fresh: imported from a
    file (MindSpore reads the source of the functions it differentiates)."""
    path = where / "acttrain_net.py"
    path.write_text(NET)
    spec = importlib.util.spec_from_file_location(f"acttrain_net_{id(path)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


def check(entries, run, step):
    assert [e["name"] for e in entries] == [f"act/{r}" for r in ROWS]  # forward order
    for e in entries:
        assert e["kind"] == "activations" and e["step"] == step
        assert list(e["stats"]) == STATS
        for stat, value in e["stats"].items():
            s = run.scalars(f"{e['name']}/{stat}")
            want = float(s.values[s.steps.tolist().index(step)])
            if math.isnan(want):
                assert math.isnan(value), (e["name"], stat)
            else:
                assert np.float32(value) == np.float32(want), (e["name"], stat)


def test_snapshot_lists_each_modules_activation_stats_at_their_step(tmp_path):
    scope = trained(tmp_path)
    cfg = dict(
        save_dir=str(tmp_path),
        run_name="snap",
        log_interval=EVERY,
        track_metrics=["loss", "grad_norm", "activations"],
    )
    with Monitor(**cfg) as mon, mon.watch():
        scope["train"](NAN_STEP + 1, 0.0)  # the last step (NAN_STEP) is collected
        done = interpret(mon, "snapshot", source="panel")
        scope["train"](1, 0.0)  # step NAN_STEP + 1: not collected
        mine = mon.snapshot()
    assert done.ok, done.message
    message = done.message
    assert message.endswith(f"and {len(ROWS)} modules' activations at step {NAN_STEP}"), message
    run = load_run(tmp_path / "snap")
    acts = [e for e in run.snapshots if e.get("kind") == "activations"]
    assert len(acts) == 2 * len(ROWS)
    first, second = acts[: len(ROWS)], acts[len(ROWS) :]
    check(first, run, NAN_STEP)
    assert {e["reason"] for e in first} == {"ctl (panel)"}
    # mm.snapshot() one step later: the statistics are still those of the last collected
    # step (the step after it ran no hook: nothing newer exists)
    check(second, run, NAN_STEP)
    assert [e["name"] for e in mine if e.get("kind") == "activations"] == [f"act/{r}" for r in ROWS]
    # the NaN the data put into aux: in aux's entry only
    bad = {e["name"]: e["stats"]["nonfinite"] for e in first}
    assert bad == {"act/embed": 0.0, "act/body": 0.0, "act/aux": 3.0}
    # the panel's list holds them (what it sends the page)
    assert sum(1 for e in mon.snapshots if e.get("kind") == "activations") == 2 * len(ROWS)
    # tensors are still summarised beside them
    assert any(e.get("kind") is None for e in run.snapshots)


def test_without_activations_a_snapshot_lists_none(tmp_path):
    scope = trained(tmp_path)
    with Monitor(save_dir=str(tmp_path), run_name="plain") as mon, mon.watch():
        scope["train"](3, 0.0)
        done = interpret(mon, "snapshot", source="panel")
    assert done.ok and "activations" not in done.message
    assert not [e for e in load_run(tmp_path / "plain").snapshots if e.get("kind")]
