"""``attention_logit_growth``: one attention module's max logit growing past its own
history, named with the step its growth began (series as the monitor records them,
``attn/<module>/max_logit``, fed to a ``Diagnoser``)."""

import math

import numpy as np

from msmon_nb.diagnose import Diagnoser

A = "attn/encoder.layers.0.self_attn/max_logit"
B = "attn/encoder.layers.1.self_attn/max_logit"


def noisy(base, steps, seed, growth=1.0, start=None):
    """A max-logit series: ``base`` with 5 % noise, growing by ``growth`` a step from
    ``start``."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(steps):
        rise = growth ** max(0, s - start) if start is not None else 1.0
        out.append(base * rise * math.exp(rng.normal(0, 0.05)))
    return out


def run(series, loss=None):
    diag = Diagnoser()
    steps = len(next(iter(series.values())))
    alerts = []
    for s in range(steps):
        values = {tag: v[s] for tag, v in series.items()}
        if loss is not None:
            values["train/loss"] = loss[s]
        alerts += diag.update(s, values)
    return [a for a in alerts if a.kind == "attention_logit_growth"]


def test_growth_is_named_with_its_module_and_onset():
    a = noisy(3.0, 120, 1, growth=1.15, start=60)
    b = noisy(2.0, 120, 2)
    found = run({A: a, B: b})
    assert len(found) == 1
    alert = found[0]
    assert alert.tag == A and "encoder.layers.0.self_attn" in alert.message
    assert 58 <= alert.since_step <= 66  # the growth began at 60
    assert alert.step < 100  # while the logits are still far from overflowing
    assert alert.blame[0]["name"] == "encoder.layers.0.self_attn"
    assert alert.blame[0]["step"] == alert.since_step


def test_the_module_that_began_first_is_named_first():
    a = noisy(3.0, 140, 3, growth=1.15, start=70)
    b = noisy(3.0, 140, 4, growth=1.15, start=50)
    found = run({A: a, B: b})
    assert found and found[0].tag == B
    assert found[0].blame[0]["name"] == "encoder.layers.1.self_attn"


def test_healthy_sharpening_and_small_logits_stay_quiet():
    # learning to attend: logits rise x4 over 200 steps and level off
    sharpen = [v * min(4.0, 1.0 + s / 50) for s, v in enumerate(noisy(2.5, 300, 5))]
    # fast growth below min_logit: a softmax over logits < 10 is far from one-hot
    small = [min(v, 5.0) for v in noisy(0.05, 300, 6, growth=1.15, start=100)]
    assert run({A: sharpen, B: small}) == []


def test_disabled_and_nonfinite_values_are_ignored():
    a = noisy(3.0, 120, 7, growth=1.15, start=60)
    a[80] = math.nan
    diag = Diagnoser({"disabled": ["attention_logit_growth"]})
    assert not [x for s, v in enumerate(a) for x in diag.update(s, {A: v})]
    assert len(run({A: a})) == 1
