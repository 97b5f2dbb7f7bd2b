"""The one chart plan: the same charts, titles and order for the panel and the viewer."""

from msmon_nb.metrics.charts import MAX_LINES, plan_charts


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
