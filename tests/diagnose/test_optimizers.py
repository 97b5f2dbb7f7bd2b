"""Two optimizers in one step (a GAN's D and G): each optimizer's own series is judged on
its own, by the rules configured on the whole-step tags, and the alert names it.

The reference for "on its own" is exact: the alerts one optimizer's ``opt/<name>/*``
raise beside another optimizer's series are the alerts the same values raise as a run's
``train/*`` with nothing beside them (same kind, step, onset and value).
"""

import numpy as np
import pytest

from msmon_nb.config.checks import optimizer_series
from msmon_nb.diagnose import Diagnoser, diagnose
from msmon_nb.diagnose.alert import with_chart
from msmon_nb.metrics.charts import optimizer_of, plan_charts
from tests.support.curves import healthy

N = 400
BURST = 128  # D's gradients blow up from here on
WHOLE = ("train/loss", "train/grad_norm", "train/learning_rate")


def curves(name, seed, grad_scale=1.0):
    c = healthy(name, seed=seed, n=N)
    steps, grad = c["train/grad_norm"]
    return {
        "train/loss": c["train/loss"],
        "train/grad_norm": (steps, grad * grad_scale),
        "train/learning_rate": c["train/learning_rate"],
    }


def exploding(c):
    steps, grad = c["train/grad_norm"]
    grad = grad.copy()
    grad[BURST:] *= 1e3
    return {**c, "train/grad_norm": (steps, grad)}


def as_optimizer(name, c):
    """A run's whole-step series as one optimizer's own (``opt/<name>/<metric>``)."""
    return {f"opt/{name}/{tag.split('/', 1)[1]}": s for tag, s in c.items()}


def key(alerts):
    return [(a.kind, a.step, a.since_step, a.value) for a in alerts]


@pytest.fixture
def gan():
    """D's grad_norm ~12x G's (as in the issue's tutorial run) and exploding at BURST."""
    d = exploding(curves("constant", seed=1, grad_scale=12.0))
    g = curves("cosine", seed=2)
    return d, g


def test_only_d_explodes_and_the_alert_names_d(gan):
    d, g = gan
    alerts = diagnose({**as_optimizer("netd", d), **as_optimizer("netg", g)})
    explosions = [a for a in alerts if a.kind == "grad_explosion"]
    assert [(a.tag, a.since_step) for a in explosions] == [("opt/netd/grad_norm", BURST)]
    (boom,) = explosions
    assert boom.message.startswith(f"netd grad_norm exploding since step {BURST}: ")
    # nothing about G: its series are judged against G's own history only
    assert not [a for a in alerts if a.tag.startswith("opt/netg/")]
    # and the alert is drawn in the grad_norm chart, where D's line is
    chart = with_chart(boom.to_dict())["chart"]
    tags = [*as_optimizer("netd", d), *as_optimizer("netg", g)]
    (home,) = [c for c in plan_charts(tags, placeholders=False) if chart in c.tags]
    assert home.title.startswith("grad_norm") and "opt/netg/grad_norm" in home.tags


def test_each_optimizer_is_judged_as_a_run_alone_would_be(gan):
    d, g = gan
    both = diagnose({**as_optimizer("netd", d), **as_optimizer("netg", g)})
    alone_d = diagnose(d)
    alone_g = diagnose(g)
    assert alone_d and any(a.kind == "grad_explosion" for a in alone_d)
    assert key([a for a in both if a.tag.startswith("opt/netd/")]) == key(alone_d)
    assert key([a for a in both if a.tag.startswith("opt/netg/")]) == key(alone_g)
    for a, b in zip([a for a in both if a.tag.startswith("opt/netd/")], alone_d, strict=True):
        assert a.tag == "opt/netd/" + b.tag.split("/", 1)[1]
        # the same words, each quantity named with its optimizer
        assert "netd grad_norm" in a.message or "netd loss" in a.message
        assert a.message.replace("netd ", "") == b.message


def test_two_healthy_optimizers_twelve_times_apart_raise_nothing():
    """D's and G's grad_norm 12x apart (as in the issue's tutorial run), each calm on its
    own: no rule compares one with the other."""
    d = curves("constant", seed=1, grad_scale=12.0)
    g = curves("cosine", seed=2)
    assert diagnose({**as_optimizer("netd", d), **as_optimizer("netg", g)}) == []


def test_an_optimizer_appearing_late_gets_its_rules_then():
    diag = Diagnoser()
    for step in range(40):
        assert diag.update(step, {"opt/actor/loss": 1.0 + 0.01 * (step % 3)}) == []
    assert diag.rule("loss_spike", "opt/critic/loss") is None
    for step in range(40, 80):
        diag.update(step, {"opt/actor/loss": 1.0, "opt/critic/loss": 2.0 + 0.01 * (step % 3)})
    [spike] = diag.update(80, {"opt/actor/loss": 1.0, "opt/critic/loss": 40.0})
    assert (spike.kind, spike.tag) == ("loss_spike", "opt/critic/loss")
    assert spike.message.startswith("critic loss spike at step 80")
    # each optimizer's rule has its own limit (what a skip gate would hold each one to)
    actor = diag.rule("loss_spike", "opt/actor/loss")
    critic = diag.rule("loss_spike", "opt/critic/loss")
    assert actor is not critic and actor.limit() < critic.limit()
    assert diag.rule("loss_spike") is not None  # the run's own, configured on train/loss


def test_lr_and_nonfinite_name_the_optimizer():
    diag = Diagnoser()
    found = []
    for step in range(5):
        found += diag.update(
            step,
            {
                "opt/netd/learning_rate": 2e-3,
                "opt/netg/learning_rate": 0.0,
                "opt/netd/loss": float("nan") if step == 3 else 1.0,
            },
        )
    assert [(a.kind, a.tag, a.since_step) for a in found] == [
        ("lr_zero", "opt/netg/learning_rate", 0),
        ("nonfinite", "opt/netd/loss", 3),
    ]
    assert found[0].message.startswith("netg learning_rate is 0 since step 0")
    assert found[1].message.startswith("netd loss is NaN since step 3")
    assert "log(0)" in found[1].message  # the loss's own hint, not the generic one


def test_rules_set_off_or_moved_elsewhere_are_not_copied_per_optimizer():
    diag = Diagnoser({"disabled": ["lr_zero"], "loss_spike": {"tag": "val/loss"}})
    for step in range(5):
        assert diag.update(step, {"opt/netg/learning_rate": 0.0}) == []
    assert diag.rule("loss_spike", "opt/netg/loss") is None
    assert diag.rule("loss_divergence", "opt/netg/loss") is not None


def test_metric_missing_counts_optimizers_series_for_the_whole_step_tags():
    tracked = ["train/loss", "train/grad_norm", "train/learning_rate", "val/acc"]
    settings = {"metric_missing": {"patience": 5}}
    diag = Diagnoser(settings, tracked)
    found = []
    for step in range(10):
        values = {}
        for name in ("netd", "netg"):
            values |= {f"opt/{name}/loss": 1.0, f"opt/{name}/grad_norm": 0.5}
            values[f"opt/{name}/learning_rate"] = 1e-3
        found += diag.update(step, values)
    assert [(a.kind, a.tag) for a in found] == [("metric_missing", "val/acc")]
    # without any optimizer's series the whole-step tags are still missed
    diag = Diagnoser(settings, tracked)
    found = []
    for step in range(10):
        found += diag.update(step, {"train/throughput": 100.0, "opt/netd/updates": 1.0})
    assert sorted(a.tag for a in found) == sorted(tracked)


@pytest.mark.parametrize(
    "tag",
    [
        "opt/netd/grad_norm",
        "opt/netd/param/fc.weight/moment1_norm",
        "opt/netd",
        "opt//loss",
        "opt/netd/",
        "train/grad_norm",
        "optx/netd/loss",
        "opt",
    ],
)
def test_the_two_readings_of_an_optimizer_tag_agree(tag):
    assert optimizer_series(tag) == optimizer_of(tag)


def test_one_optimizer_changes_nothing():
    c = exploding(curves("constant", seed=1))
    assert key(diagnose(c)) == key(
        diagnose({**c, "train/throughput": (c["train/loss"][0], np.full(N, 9.0))})
    )
    assert {a.tag for a in diagnose(c)} <= set(WHOLE)
