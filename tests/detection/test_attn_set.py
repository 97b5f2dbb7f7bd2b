"""The attention set (issue 45 item 4) as frozen in bench/data/attn_curves.json.gz, and
the issue's Must show: on a transformer run whose attention logits grow until the loss
diverges, the attention rule warns before the first gradient/loss alert (the bench's own
scoring, ``bench/attn.py``)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from bench.attn import FROZEN, KIND, alerts, diverged, thaw
from bench.attn_runs import STEPS, specs


@pytest.fixture(scope="module")
def frozen():
    return thaw(FROZEN)


def test_the_file_holds_exactly_the_generators_runs(frozen):
    assert [asdict(s) for s, _ in frozen] == [asdict(s) for s in specs()]
    for _, rec in frozen:
        assert len(rec["loss"]) == STEPS
        assert len(rec["max_logit"]) == len(rec["modules"]) == 2


def test_failing_runs_diverge_after_their_logits_grow_and_healthy_ones_do_not(frozen):
    for spec, rec in frozen:
        end = diverged(rec["loss"])
        if not spec.fails:
            assert end is None, spec.name
            continue
        assert end is not None and end > spec.at, spec.name
        # the logits grew by at least x10 between the break and the divergence
        top = max(max(m[spec.at : end + 1]) for m in rec["max_logit"])
        assert top > 10 * max(m[spec.at] for m in rec["max_logit"]), spec.name
