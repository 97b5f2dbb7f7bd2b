"""What the viewer and the pages say is what they do (issue 46.3): HEAD answers like GET
without a body, ``max_points=0`` is refused rather than read as the default,
``/api/scalars`` names the rank it served, static files are revalidated (no-cache) and
cheap to revalidate, the panel and ``/api/charts`` plan charts in one shape, and the
pages colour exactly the severities a rule can raise."""

from __future__ import annotations

import json
import re
import typing
import urllib.parse

import numpy as np
import pytest

from msmon_nb.config.cards import CARDS, Card
from msmon_nb.events.writer import EventWriter
from msmon_nb.metrics.charts import CHART_ASSETS
from tests.support.synth import write_ranked_run


def q(path: str, **params) -> str:
    return f"{path}?{urllib.parse.urlencode(params)}"


@pytest.fixture
def base(tmp_path):
    """A single-process run, and a job whose ranks 2 and 3 wrote (no rank 0)."""
    with EventWriter(tmp_path / "single") as writer:
        for step in range(5):
            writer.add_scalars(step, {"train/loss": 1.0 / (step + 1)})
    steps = np.arange(4)
    write_ranked_run(
        tmp_path / "job",
        {2: {"train/loss": steps * 2.0}, 3: {"train/loss": steps * 3.0}},
    )
    return tmp_path


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/app.js",
        "/vendor/chart.js",
        "/api/runs",
        "/api/info",
        "/api/scalars?run=single&tag=train/loss",
        "/api/scalars?run=nope&tag=train/loss",
        "/missing",
    ],
)
def test_head_answers_as_get_without_a_body(base, serve, path):
    _, client = serve(base)
    get_status, get_headers, get_body = client.request(path)
    status, headers, body = client.request(path, method="HEAD")
    assert status == get_status and body == b""
    assert headers["Content-Type"] == get_headers["Content-Type"]
    assert int(headers["Content-Length"]) == len(get_body)  # what a GET would carry


def test_other_methods_name_head_as_allowed(base, serve):
    _, client = serve(base)
    status, headers, body = client.request("/api/runs", method="PUT")
    assert status == 405 and headers["Allow"] == "GET, HEAD, POST"
    assert "HEAD" in json.loads(body)["error"]


@pytest.mark.parametrize("value", ["0", "1", "-5", "0.4"])
def test_max_points_below_two_is_refused_naming_the_range(base, serve, value):
    _, client = serve(base)
    status, body = client.json(q("/api/scalars", run="single", tag="train/loss", max_points=value))
    assert status == 400 and "use 2..200000" in body["error"], body


def test_max_points_absent_or_empty_is_the_default(base, serve):
    _, client = serve(base)
    for params in ({}, {"max_points": ""}):
        status, body = client.json(q("/api/scalars", run="single", tag="train/loss", **params))
        assert status == 200 and body["steps"] == [0, 1, 2, 3, 4]


def test_scalars_names_the_rank_it_served(base, serve):
    _, client = serve(base)
    status, body = client.json(q("/api/scalars", run="job", tag="train/loss"))
    assert status == 200 and body["rank"] == 2  # the lowest rank, named
    assert body["values"] == [0.0, 2.0, 4.0, 6.0]  # rank 2's own values
    status, body = client.json(q("/api/scalars", run="job", tag="train/loss", rank=3))
    assert status == 200 and body["rank"] == 3 and body["values"] == [0.0, 3.0, 6.0, 9.0]
    status, body = client.json(q("/api/scalars", run="single", tag="train/loss"))
    assert status == 200 and body["rank"] == 0  # as /api/runs lists it: ranks [0]
    status, runs = client.json("/api/runs")
    assert {r["name"]: r["ranks"] for r in runs}["single"] == [0]


def test_static_files_are_revalidated_and_an_unchanged_one_is_a_304(base, serve):
    _, client = serve(base)
    for path in ("/", "/app.js", "/vendor/chart.js", "/vendor/uPlot.iife.min.js"):
        status, headers, body = client.request(path)
        assert status == 200 and headers["Cache-Control"] == "no-cache" and body
        etag = headers["ETag"]
        status, again, body = client.request(path, headers={"If-None-Match": etag})
        assert status == 304 and body == b"" and again["ETag"] == etag, path
        status, _, body = client.request(path, headers={"If-None-Match": 'W/"other"'})
        assert status == 200 and body, path


def test_the_panel_and_api_charts_plan_a_run_in_one_shape(tmp_path, serve):
    """One chart spec for both pages: the panel's ``charts`` (``show(run)``) and
    ``/api/charts`` of the same run are the same list, keys and values (the run has the
    core charts' tags: a live panel also plans placeholders for those, the viewer not)."""
    from msmon_nb.notebook import show

    with EventWriter(tmp_path / "gan") as writer:
        for step in range(6):
            writer.add_scalars(
                step,
                {
                    "train/loss": 1.0 / (step + 1),
                    "train/learning_rate": 1e-3,
                    "train/throughput": 100.0,
                    "opt/netd/grad_norm": 2.0 + step,
                    "opt/netg/grad_norm": 1.0 + step,
                    "val/acc": step / 6,
                },
            )
    panel_charts = show(tmp_path / "gan").panel.widget.initial["charts"]
    _, client = serve(tmp_path)
    status, api_charts = client.json(q("/api/charts", run="gan"))
    assert status == 200
    assert {tuple(sorted(c)) for c in panel_charts + api_charts} == {
        ("group", "kind", "labels", "log", "note", "tags", "title")
    }
    assert panel_charts == api_charts
    assert ["netd", "netg"] in [c["labels"] for c in api_charts]  # the optimizers' chart


def test_both_pages_order_a_heatmaps_rows_as_the_run_recorded_its_modules(tmp_path, serve):
    """A finished run shown by ``mm.show`` and by ``/api/charts``: the activations
    heatmap's rows are the order the modules were first recorded (forward order: head
    before body here), not the sorted listing's, and the two plans are equal."""
    from msmon_nb.notebook import show

    with EventWriter(tmp_path / "acts") as writer:
        for step in range(3):
            # the core charts' tags: a live panel plans placeholders for them, not the viewer
            values = {"train/loss": 1.0 / (step + 1), "train/grad_norm": 1.0}
            values |= {"train/learning_rate": 1e-3, "train/throughput": 100.0}
            for module in ("head", "body", "aux"):
                values |= {f"act/{module}/norm": 1.0 + step, f"act/{module}/mean": 0.1}
            writer.add_scalars(step, values)
    panel_charts = show(tmp_path / "acts").panel.widget.initial["charts"]
    _, client = serve(tmp_path)
    status, api_charts = client.json(q("/api/charts", run="acts"))
    assert status == 200 and panel_charts == api_charts
    [heat] = [c for c in api_charts if c["kind"] == "heatmap"]
    assert (heat["rows"], heat["stats"]) == (["head", "body", "aux"], ["norm", "mean"])
    assert heat["tags"][:2] == ["act/head/norm", "act/head/mean"]


def test_the_pages_know_the_severities_a_rule_raises_and_no_other():
    """``chart.js`` (both pages' chart component) colours alert marks by severity; it
    knew an ``info`` no rule raises. Its table now holds exactly the cards' severities."""
    raised = set(typing.get_args(typing.get_type_hints(Card)["severity"]))
    assert {card.severity for card in CARDS.values()} <= raised
    source = (CHART_ASSETS / "chart.js").read_text()
    table = re.search(r"const MSMON_SEVERITY = \{([^}]*)\}", source)
    assert table is not None
    assert set(re.findall(r"(\w+):", table.group(1))) == raised == {"warning", "critical"}
