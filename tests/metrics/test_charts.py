"""The one chart plan: the same charts, titles and order for the panel and the viewer."""

from msmon_nb.metrics.charts import (
    HEATMAP_STATS,
    MAX_LINES,
    as_lines,
    plan_charts,
    replaced_by_optimizers,
)


def titles(tags, placeholders=True):
    return [c.title for c in plan_charts(tags, placeholders)]


def test_core_charts_first_then_groups_by_prefix_alphabetical_inside():
    tags = [
        "zeta",  # a user tag without a prefix: last
        "my/b",
        "my/a",
        "sys/cpu_percent",
        "param/fc.weight/grad_norm",
        "val/f1",
        "val/accuracy",
        "train/compute_time",
        "train/data_time",
        "train/step_time",
        "train/throughput",
        "train/learning_rate",
        "train/grad_norm_clipped",
        "train/grad_norm",
        "train/loss",
        "train/global_step",  # a counter: not charted
        "train/local_loss",
        "train/loss_scale",
        "snap/fc1.weight/mean",  # snapshot stats have their own table
    ]
    charts = plan_charts(tags, placeholders=False)
    assert [c.title for c in charts] == [
        "loss",
        "grad_norm",
        "learning_rate",
        "throughput (samples/s)",
        "step time (s)",
        "train/",
        "loss scale",
        "val/",
        "param grad_norm",
        "sys/",
        "my/",
        "zeta",
    ]
    by_title = {c.title: c for c in charts}
    assert by_title["grad_norm"].tags == ("train/grad_norm", "train/grad_norm_clipped")
    assert by_title["step time (s)"].tags == (
        "train/step_time",
        "train/data_time",
        "train/compute_time",
    )
    assert by_title["val/"].tags == ("val/accuracy", "val/f1")
    assert by_title["my/"].tags == ("my/a", "my/b")
    assert [c.group for c in charts] == ["train"] * 7 + ["val", "param", "sys", "my", ""]
    assert by_title["grad_norm"].log and by_title["loss scale"].log
    assert not by_title["loss"].log
    charted = {t for c in charts for t in c.tags}
    assert "train/global_step" not in charted and "snap/fc1.weight/mean" not in charted


def test_a_live_panel_keeps_four_core_charts_waiting_the_viewer_only_what_exists():
    assert titles(["train/loss"]) == [
        "loss",
        "grad_norm",
        "learning_rate",
        "throughput (samples/s)",
    ]
    assert titles(["train/loss"], placeholders=False) == ["loss"]
    # what SummaryCollector writes: loss only, under its own name
    (loss,) = plan_charts(["loss"], placeholders=False)
    assert loss.title == "loss" and loss.tags == ("loss",)
    assert titles(["acc", "loss"], placeholders=False) == ["loss", "acc"]


def test_ranks_and_band_keys_join_the_chart_of_their_tag():
    keys = ["train/loss@rank0", "train/loss@rank1", "train/loss@min", "train/loss@max"]
    (loss, *_rest) = plan_charts(keys)
    assert loss.title == "loss" and set(loss.tags) == set(keys)


def test_large_groups_are_capped_and_say_so():
    tags = [f"param/layer{i:02d}.weight/grad_norm" for i in range(20)]
    (chart,) = plan_charts(tags, placeholders=False)
    assert len(chart.tags) == MAX_LINES
    assert chart.title == f"param grad_norm (first {MAX_LINES} of 20)"


GAN = [
    "opt/netg/loss",
    "opt/netd/loss",
    "opt/netd/grad_norm",
    "opt/netg/grad_norm",
    "opt/netd/grad_norm_clipped",
    "opt/netd/micro_grad_norm",
    "opt/netd/learning_rate",
    "opt/netg/learning_rate",
    "opt/netd/loss_scale",
    "opt/netg/loss_scale",
    "opt/netd/overflow",
    "opt/netd/updates",
    "opt/netg/updates",
    "train/throughput",
    "train/step_time",
]


def test_two_optimizers_one_chart_per_metric_one_line_each_named_by_optimizer():
    charts = plan_charts(GAN, placeholders=False)
    by_title = {c.title.split(" · ")[0]: c for c in charts}
    assert [c.title.split(" · ")[0] for c in charts] == [
        "loss",
        "grad_norm",
        "learning_rate",
        "throughput (samples/s)",
        "step time (s)",
        "loss scale",
        "loss-scale overflow (1: update skipped)",
        "updates per step",
    ]
    loss, grad, lr = by_title["loss"], by_title["grad_norm"], by_title["learning_rate"]
    assert loss.tags == ("opt/netd/loss", "opt/netg/loss") and loss.labels == ("netd", "netg")
    assert lr.tags == ("opt/netd/learning_rate", "opt/netg/learning_rate")
    assert lr.labels == ("netd", "netg")
    # before clipping first, optimizers by name; what is not the chart's own metric says so
    assert grad.tags == (
        "opt/netd/grad_norm",
        "opt/netg/grad_norm",
        "opt/netd/grad_norm_clipped",
        "opt/netd/micro_grad_norm",
    )
    assert grad.labels == ("netd", "netg", "netd grad_norm_clipped", "netd micro_grad_norm")
    assert grad.log and not loss.log and by_title["loss scale"].log
    # the title says one line each, the note why no whole-step line stands beside them
    for chart in (loss, grad, lr):
        assert chart.title.endswith(" · 2 optimizers: one line each")
        whole = "train/" + chart.tags[0].rsplit("/", 1)[-1]
        assert whole in chart.note and "netd and netg" in chart.note
        assert "would mix their networks" in chart.note
    assert by_title["throughput (samples/s)"].title == "throughput (samples/s)"
    assert by_title["throughput (samples/s)"].note == ""
    assert by_title["loss scale"].labels == ("netd", "netg")
    assert by_title["updates per step"].tags == ("opt/netd/updates", "opt/netg/updates")
    # one optimizer only in a chart: named in the title
    assert by_title["loss-scale overflow (1: update skipped)"].title.endswith(" · netd")
    assert {c.group for c in charts} == {"train"}
    as_json = grad.as_json()
    assert as_json["labels"] == list(grad.labels) and as_json["note"] == grad.note


def test_a_live_panel_plans_no_placeholder_for_what_optimizers_stand_for():
    assert replaced_by_optimizers(GAN) == {
        "train/loss",
        "train/grad_norm",
        "train/grad_norm_clipped",
        "train/micro_grad_norm",
        "train/learning_rate",
    }
    assert replaced_by_optimizers(["train/loss", "opt/netd/updates"]) == set()
    # two optimizers, nothing recorded but their losses yet: the placeholders left stand
    # for grad_norm and lr, not for the loss
    charts = plan_charts(["opt/netd/loss", "opt/netg/loss"])
    assert [c.tags for c in charts] == [
        ("opt/netd/loss", "opt/netg/loss"),
        ("train/grad_norm",),
        ("train/learning_rate",),
        ("train/throughput",),
    ]


def test_runs_compared_one_optimizer_beside_two_share_the_charts_and_say_no_why():
    """The viewer plans the union of the runs' tags: a one-optimizer run's train/loss
    and a GAN's two lines in one chart; no note claims train/loss is absent."""
    (loss,) = [c for c in plan_charts(["train/loss", *GAN[:2]], False) if "loss" in c.tags[0]]
    assert loss.tags == ("train/loss", "opt/netd/loss", "opt/netg/loss")
    assert loss.labels == ("train/loss", "netd", "netg")
    assert loss.note == ""


def test_ranks_of_an_optimizers_series_keep_its_name_and_their_rank():
    keys = ["opt/netd/loss@rank0", "opt/netd/loss@rank1", "opt/netg/loss@rank0"]
    (loss, *_rest) = plan_charts(keys)
    assert loss.labels == ("netd@rank0", "netd@rank1", "netg@rank0")
    assert loss.label("opt/netd/loss@rank1") == "netd@rank1"


def test_an_optimizers_other_series_are_grouped_by_what_they_measure():
    tags = [
        "opt/netd/param/fc.weight/moment1_norm",
        "param/fc.weight/moment1_norm",
        "opt/netd/foo",
        "opt/netg/foo",
        "val/acc",
    ]
    charts = plan_charts(tags, placeholders=False)
    assert [(c.title, c.group) for c in charts] == [
        ("opt/ · 2 optimizers: one line each", "opt"),
        ("val/", "val"),
        ("param moment1_norm · netd", "param"),
    ]
    assert charts[0].labels == ("netd foo", "netg foo")


def test_activations_are_one_heatmap_per_prefix_rows_in_recorded_order():
    """act/ and act_grad/ are a heatmap each (no line per module and statistic): rows in
    the order the modules' tags came first (the forward order: fc2 was recorded before
    fc1 here), statistics in the extent module's order, every series among its tags."""
    from msmon_nb.metrics.extent import ACT_STATS

    tags = ["train/loss", "sys/rss", "param/fc1.weight/grad_norm"]
    for module in ("fc2", "fc1", "layers.10"):
        for stat in ("zero_frac", "norm"):
            tags += [f"act/{module}/{stat}", f"act_grad/{module}/{stat}"]
    charts = plan_charts(tags, placeholders=False)
    rest = [(c.title, c.group, c.kind) for c in charts if c.group != "train"]
    assert rest == [
        ("param grad_norm", "param", "line"),
        ("activations (module x step)", "act", "heatmap"),
        ("activation gradients (module x step)", "act_grad", "heatmap"),
        ("sys/", "sys", "line"),
    ]
    act = charts[-3]
    assert act.rows == ("fc2", "fc1", "layers.10")
    assert act.stats == ("norm", "zero_frac")
    assert act.tags == tuple(f"act/{m}/{s}" for m in act.rows for s in act.stats)
    spec = act.as_json()
    assert (spec["kind"], spec["rows"], spec["stats"], spec["log"]) == (
        "heatmap",
        ["fc2", "fc1", "layers.10"],
        ["norm", "zero_frac"],
        True,
    )
    assert "rows" not in charts[0].as_json() and charts[0].as_json()["kind"] == "line"
    assert HEATMAP_STATS == ACT_STATS
    # the kernel's pictures draw lines: the first statistic, MAX_LINES modules at most
    lines = as_lines(act)
    assert (lines.kind, lines.title, lines.tags) == (
        "line",
        "act norm",
        ("act/fc2/norm", "act/fc1/norm", "act/layers.10/norm"),
    )
