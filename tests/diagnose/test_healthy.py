"""Defaults on realistic synthetic curves: nothing on healthy runs; every scripted
failure injected into those same runs flagged within 2 collected steps, dated exactly."""

import numpy as np
import pytest

from msmon_nb.diagnose import Diagnoser, diagnose
from tests.support.curves import HEALTHY, healthy

N = 1500
STRIDES = (1, 10)  # log_interval 1 and 10


def settings_for(name: str, stride: int) -> dict:
    """What a user of each schedule would declare (the rules judge declared intent)."""
    if name == "cosine":
        return {
            "lr_warmup": {"warmup_steps": 200 * stride},
            "lr_decay": {"expect_by": 900 * stride},
        }
    if name in ("step_decay", "small_batch"):
        return {"lr_decay": {"expect_by": 1200 * stride}}
    if name == "noisy_grads":
        return {"lr_warmup": {"warmup_steps": 50 * stride}}
    return {}


@pytest.mark.parametrize("stride", STRIDES)
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_runs_raise_nothing(name, seed, stride):
    curves = healthy(name, seed, n=N, stride=stride)
    assert diagnose(curves, settings_for(name, stride), tracked=["loss", "grad_norm"]) == []


def _inject(curves, failure, k):
    """Script ``failure`` from collected step index ``k``; returns (curves, kind, tag)."""
    steps = curves["train/loss"][0]
    out = {tag: (s, v.copy()) for tag, (s, v) in curves.items()}
    loss = out["train/loss"][1]
    grads = out["train/grad_norm"][1]
    lr = out["train/learning_rate"][1]
    start = abs(loss[0])
    rng = np.random.default_rng(k)
    if failure == "explosion":
        grads[k:] *= 1e3
        return out, "grad_explosion", "train/grad_norm"
    if failure == "vanishing":
        grads[k:] = 1e-5 * np.exp(rng.normal(0.0, 0.35, steps.size - k))
        return out, "grad_vanishing", "train/grad_norm"
    if failure == "nan_loss":
        loss[k:] = np.nan
        return out, "nonfinite", "train/loss"
    if failure == "inf_grads":
        grads[k] = np.inf
        return out, "nonfinite", "train/grad_norm"
    if failure == "outlier_batch":
        loss[k] = 3.0 * start  # a corrupted batch on a real MLP: 1.3-13x the start
        return out, "loss_spike", "train/loss"
    if failure == "divergence":
        loss[k:] = 3.0 * start * np.exp(rng.normal(0.0, 0.1, steps.size - k))
        return out, "loss_divergence", "train/loss"
    if failure == "lr_zero":
        lr[k:] = 0.0
        return out, "lr_zero", "train/learning_rate"
    raise ValueError(failure)


FAILURES = (
    "explosion",
    "vanishing",
    "nan_loss",
    "inf_grads",
    "outlier_batch",
    "divergence",
    "lr_zero",
)


@pytest.mark.parametrize("k", [150, 1100])  # early and late in the run
@pytest.mark.parametrize("stride", STRIDES)
@pytest.mark.parametrize("name", HEALTHY)
@pytest.mark.parametrize("failure", FAILURES)
def test_scripted_failures_flagged_within_two_steps_with_their_onset(failure, name, stride, k):
    seed = (FAILURES.index(failure) + HEALTHY.index(name) + k + stride) % 5  # vary the noise
    curves, kind, tag = _inject(healthy(name, seed, n=N, stride=stride), failure, k)
    onset = int(curves["train/loss"][0][k])
    alerts = diagnose(curves, settings_for(name, stride))
    assert all(a.step >= onset for a in alerts), "the healthy part stayed quiet"
    mine = [a for a in alerts if (a.kind, a.tag) == (kind, tag)]
    assert mine, f"{failure} not flagged on {name} seed {seed}: {alerts}"
    assert mine[0].since_step == onset
    assert mine[0].step <= onset + 2 * stride  # within 2 collected steps


@pytest.mark.parametrize("stride", STRIDES)
@pytest.mark.parametrize("name", HEALTHY)
def test_steps_going_backwards_in_a_healthy_run(name, stride):
    curves = healthy(name, 0, n=N, stride=stride)
    diag = Diagnoser(settings_for(name, stride))
    steps = curves["train/loss"][0].tolist()
    alerts = []
    for i, step in enumerate(steps[:1000]):
        alerts += diag.update(step, {tag: float(v[i]) for tag, (_, v) in curves.items()})
    assert alerts == []
    restart = steps[800]  # a second run starts writing into the same place
    alerts += diag.update(restart, {"train/loss": 2.3, "train/grad_norm": 1.0})
    order = [a for a in alerts if a.kind == "step_order"]
    assert [(a.tag, a.step, a.since_step) for a in order] == [
        ("train/loss", restart, restart),
        ("train/grad_norm", restart, restart),
    ]


@pytest.mark.parametrize("stride", STRIDES)
def test_warmup_that_never_starts(stride):
    curves = healthy("cosine", 0, n=N, stride=stride)
    steps, lr = curves["train/learning_rate"]
    stuck = np.full(lr.size, 1e-3 / (200 * stride))  # lr(0) of the warmup, never advancing
    curves["train/learning_rate"] = (steps, stuck)
    alerts = [a for a in diagnose(curves, settings_for("cosine", stride)) if a.kind == "lr_warmup"]
    assert [(a.since_step, a.step) for a in alerts] == [(0, 2 * stride)]
