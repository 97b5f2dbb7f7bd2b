"""The frozen curves are real training: two runs retrained now match them closely, so the
file cannot drift from what ``bench/detect_runs.train`` produces (a few seconds)."""

from __future__ import annotations

import math

import pytest

from bench.detect_data import thaw
from bench.detect_runs import train


@pytest.mark.parametrize(
    "name", ["plateau-adam", "t-plateau-mlp", "cv-memorise-mlp-adam-regress-s303"]
)
def test_retrained_run_matches_frozen(name):
    frozen = {s.name: (s, r) for pairs in thaw().values() for s, r in pairs}
    spec, rec = frozen[name]
    fresh = train(spec)
    assert fresh["lr"] == rec["lr"]
    pairs = [
        ("loss", rec["loss"], fresh["loss"]),
        ("grad_norm", rec["grad_norm"], fresh["grad_norm"]),
    ]
    pairs += [(tag, v, fresh["opt"][tag]) for tag, v in rec["opt"].items()]
    if spec.opt.startswith("adam"):
        assert rec["opt"], "moment norms are frozen for Adam runs"
    for what, old, new in pairs:
        assert len(old) == len(new) == spec.steps, what
        for step, (a, b) in enumerate(zip(old, new, strict=True)):
            assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-7), (what, step, a, b)
