"""The attention set (issue 45 item 4) as frozen in bench/data/attn_curves.json.gz, and
the issue's Must show: on a transformer run whose attention logits grow until the loss
diverges, the attention rule warns before the first gradient/loss alert (the bench's own
scoring, ``bench/attn.py``)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from bench.attn import FROZEN, GRAD_LOSS, KIND, alerts, diverged, thaw
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
    """Three of the four failing runs diverge within their 170 steps (qk_lr-s3781's loss
    climbs back only to 3x its best, not to half its first value); every one's logits
    grow x5 after the break, before it diverges where it does."""
    ends = []
    for spec, rec in frozen:
        end = diverged(rec["loss"])
        if not spec.fails:
            continue  # warm-s8822's loss has one 3x spike at 115 (lr ~1e-2): not judged
        ends.append(end)
        assert end is None or end > spec.at, spec.name
        stop = len(rec["loss"]) if end is None else end + 1
        top = max(max(m[spec.at : stop]) for m in rec["max_logit"])
        assert top > 5 * max(m[spec.at] for m in rec["max_logit"]), spec.name
    assert sum(end is not None for end in ends) == 3


def test_the_attention_rule_warns_before_the_gradient_and_loss_rules(frozen):
    """The Must show: per failing run, the attention rule's warning comes before the loss
    diverges and before the first gradient/loss alert of today's rules (or there is
    none); healthy runs raise no attention alert."""
    for spec, rec in frozen:
        found = alerts(rec)
        ours = [a for a in found if a.kind == KIND]
        if not spec.fails:
            assert ours == [], spec.name
            continue
        theirs = [a for a in found if a.kind != KIND and a.tag in GRAD_LOSS]
        assert ours, spec.name
        end = diverged(rec["loss"])
        assert end is None or ours[0].step < end, spec.name
        assert not theirs or ours[0].step < theirs[0].step, spec.name
        assert ours[0].since_step >= spec.at, spec.name  # its onset is not before the break
