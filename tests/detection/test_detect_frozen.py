"""The detection benchmark replayed from its frozen curves (real MindSpore runs recorded
by ``bench/detect.py --regen``): the README's tables are what the bench prints, and the
held-out test set keeps at least the recall and at most the false alarms stated there."""

from __future__ import annotations

import pytest

from bench.detect_data import SETS, thaw
from bench.detect_score import detectors, evaluate, summary, table
from tests.detection.readme import readme_block, stated


@pytest.fixture(scope="module")
def results():
    frozen = thaw()
    dets = detectors(frozen["tuning"])
    out = {}
    for which in SETS:
        out[which] = {name: evaluate(frozen[which], d, acc) for name, (d, acc) in dets.items()}
    return frozen, out


def test_sets_are_as_large_as_promised(results):
    frozen, _ = results
    tuning, test = frozen["tuning"], frozen["test"]
    assert len(test) >= len(tuning) >= 67
    assert sum(len(r["loss"]) for s, r in test if s.failure is None) >= 10_000
    assert not {s.name for s, _ in tuning} & {s.name for s, _ in test}
    assert not {s.seed for s, _ in test} & {s.seed for s, _ in tuning}
    assert {s.model for s, _ in test} >= {"conv", "transformer"}


def test_readme_tables_are_the_bench_output(results):
    frozen, res = results
    printed = []
    for which in SETS:
        runs = frozen[which]
        steps = sum(len(r["loss"]) for _, r in runs)
        healthy = sum(len(r["loss"]) for s, r in runs if s.failure is None)
        title = (
            f"{which} set: {len(runs)} runs ({sum(1 for s, _ in runs if s.failure)} with a "
            f"failure), {steps} steps, {healthy} of them healthy"
        )
        printed.append(table(res[which], title))
    assert readme_block() == "\n\n".join(printed), (
        "regenerate the README block from bench/detect.py"
    )


def test_test_set_recall_and_false_alarms_hold_the_readme_figures(results):
    _, res = results
    ours = res["test"]["msmon_nb"]
    rows = stated("test")
    got = summary(ours)
    for kind, k in got.items():
        hits_stated = int(rows[kind]["msmon_nb"].split("/")[0])
        assert k["hits"] >= hits_stated, f"{kind}: {k['hits']} detected, README says {hits_stated}"
    fa_stated = float(rows["false alarms/10k"]["msmon_nb"].split()[0])
    assert round(ours["fa_per_10k"], 1) <= fa_stated


def test_ours_against_the_baselines_as_the_readme_says(results):
    """The README's comparison on the test set: more recall than every baseline; fewer
    false alarms than the global-norm threshold and the published ZClip and Turbulence;
    a longer median lead on every slow failure kind than the global-norm threshold and
    the baselines calibrated to our tuning-set false-alarm rate (``@FA``)."""
    _, res = results
    test = res["test"]
    ours = test["msmon_nb"]
    mine = summary(ours)
    for name, r in test.items():
        if name == "msmon_nb":
            continue
        theirs = summary(r)
        hits = sum(k["hits"] for k in theirs.values())
        assert sum(k["hits"] for k in mine.values()) > hits, name
        if "@FA" not in name:
            assert ours["fa_per_10k"] < r["fa_per_10k"], name
        if "@FA" in name or name.startswith("global"):
            for kind in ("lr_ramp", "slow_divergence", "adam_spike"):
                other = theirs[kind]["lead"]
                assert mine[kind]["lead"] > (other if other is not None else -1e9), (name, kind)
