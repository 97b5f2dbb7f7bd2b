"""``metrics.routing.router_stats``: exact on logits whose softmax and top-k are known."""

import math

import numpy as np

from msmon_nb.metrics.routing import router_stats


def test_indifferent_router():
    stats, shares = router_stats(np.zeros((6, 4)), 1)
    assert math.isclose(stats["router_entropy"], math.log(4), rel_tol=1e-12)
    # ties go to the lowest index: every token on expert 0
    assert stats["tokens_per_expert_max_frac"] == 1.0
    assert shares.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_top2_counts_and_entropy():
    logits = np.log(np.array([[0.5, 0.3, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]]))
    stats, shares = router_stats(logits[None], 2)  # any leading shape: rows are tokens
    # choices: (0, 1), (3, 2), (0, then 1: the lowest of the tied three)
    assert shares.tolist() == [2 / 6, 2 / 6, 1 / 6, 1 / 6]
    assert stats["tokens_per_expert_max_frac"] == 2 / 6
    p = np.exp(logits)
    want = float(np.mean(-(p * np.log(p)).sum(1)))
    assert math.isclose(stats["router_entropy"], want, rel_tol=1e-12)


def test_collapsed_and_nonfinite():
    stats, _ = router_stats(np.array([[50.0, 0.0, 0.0], [60.0, 0.0, 0.0]]), 1)
    assert stats["router_entropy"] < 1e-15 and stats["tokens_per_expert_max_frac"] == 1.0
    stats, shares = router_stats(np.array([[np.nan, 0.0]]), 1)
    assert math.isnan(stats["router_entropy"]) and np.isnan(shares).all()


def test_chart_plan_lines_per_statistic_and_a_load_heatmap():
    from msmon_nb.metrics.charts import plan_charts

    tags = ["train/loss", "moe/r1/router_entropy", "moe/r2/router_entropy"]
    tags += ["moe/r1/tokens_per_expert_max_frac"]
    tags += [f"moe_load/r1.expert_{e}/share" for e in range(3)]
    charts = {c.title: c for c in plan_charts(tags, placeholders=False)}
    assert charts["moe router_entropy"].tags == ("moe/r1/router_entropy", "moe/r2/router_entropy")
    assert charts["moe tokens_per_expert_max_frac"].tags == ("moe/r1/tokens_per_expert_max_frac",)
    heat = charts["tokens per expert (router.expert x step)"]
    assert heat.kind == "heatmap" and heat.rows == ("r1.expert_0", "r1.expert_1", "r1.expert_2")
    assert heat.stats == ("share",)
    titles = list(charts)
    assert titles.index("moe router_entropy") < titles.index(heat.title)
