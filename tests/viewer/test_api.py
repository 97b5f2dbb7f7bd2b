"""The JSON API on a real server: contract, downsampling, zoom, errors, odd runs."""

import json
import socket
import urllib.parse

import numpy as np
import pytest

from msmon_nb.events.runs import load_run
from msmon_nb.events.writer import EventWriter
from msmon_nb.rundir import ALERTS, MARKER, SNAPSHOTS
from msmon_nb.viewer.server import make_server
from tests.support.synth import write_run
from tests.viewer.conftest import Client

N = 1_000_000
SPIKE_STEP = 2 * 654_321
NAN_STEP = 2 * 400_000
INF_STEP = 2 * 400_003


def q(**params) -> str:
    return urllib.parse.urlencode(params)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A base dir with a 1 M-point run (one spike, one NaN, one Inf) and a small one."""
    base = tmp_path_factory.mktemp("big")
    values = (1.0 + 0.1 * np.sin(np.arange(N) / 3000)).astype(np.float32)
    values[SPIKE_STEP // 2] = 500.0
    values[NAN_STEP // 2] = np.nan
    values[INF_STEP // 2] = np.inf
    write_run(base / "million", np.arange(N) * 2, {"train/loss": values})
    with EventWriter(base / "nested" / "small") as writer:
        for step in range(10):
            writer.add_scalars(step, {"train/loss": step / 10, "val/acc": 0.5})
    server = make_server(base, port=0)
    server.start()
    yield base, values, Client(*server.server_address[:2])
    server.stop()


def test_runs_contract(big):
    base, _, client = big
    status, runs = client.json("/api/runs")
    assert status == 200
    assert [r["name"] for r in runs] == ["million", "nested/small"]
    for run in runs:
        assert {"name", "path", "tags", "last_step", "status", "ranks"} <= set(run)
    million, small = runs
    assert million["last_step"] == 2 * (N - 1) and million["status"] == "finished"
    assert million["ranks"] == [0] and million["tags"] == ["train/loss"]
    assert small["tags"] == ["train/loss", "val/acc"] and small["last_step"] == 9
    assert small["path"] == str(base / "nested" / "small")


def test_million_points_downsampled_with_spike_and_nonfinite(big):
    _, values, client = big
    status, body = client.json(
        "/api/scalars?" + q(run="million", tag="train/loss", max_points=1000)
    )
    assert status == 200
    assert body["raw"] is False and body["count"] == N
    assert len(body["steps"]) == len(body["values"]) <= 2 * 1000
    assert body["steps"] == sorted(body["steps"])
    i = body["steps"].index(SPIKE_STEP)
    assert body["values"][i] == 500.0
    assert body["max"] == 500.0
    assert body["min"] == pytest.approx(float(values[np.isfinite(values)].min()))
    assert body["nonfinite"] == {"steps": [NAN_STEP, INF_STEP], "kinds": ["nan", "inf"]}
    for step in (NAN_STEP, INF_STEP):
        assert body["values"][body["steps"].index(step)] is None
    assert body["first_step"] == 0 and body["last_step"] == 2 * (N - 1)


def test_zoomed_range_returns_raw_points(big):
    _, values, client = big
    start, end = NAN_STEP - 500, NAN_STEP + 499
    status, body = client.json(
        "/api/scalars?" + q(run="million", tag="train/loss", start=start, end=end)
    )
    assert status == 200 and body["raw"] is True
    expected_steps = list(range(start, end + 1, 2))
    assert body["steps"] == expected_steps
    expected = values[start // 2 : end // 2 + 1].astype(np.float64)
    expected[~np.isfinite(expected)] = np.nan  # non-finite points are null, kinds listed
    got = np.array([np.nan if v is None else v for v in body["values"]])
    assert np.array_equal(got, expected, equal_nan=True)
    assert body["nonfinite"] == {"steps": [NAN_STEP, INF_STEP], "kinds": ["nan", "inf"]}
    # float edges, as a browser's zoom sends them, are accepted
    status, body = client.json(
        "/api/scalars?" + q(run="million", tag="train/loss", start="100.7", end="110.2")
    )
    assert status == 200 and body["steps"] == [100, 102, 104, 106, 108, 110]


def test_nested_run_name_and_max_points(big):
    _, _, client = big
    status, body = client.json("/api/scalars?" + q(run="nested/small", tag="val/acc"))
    assert status == 200 and body["raw"] and body["values"] == [0.5] * 10
    status, body = client.json(
        "/api/scalars?" + q(run="nested/small", tag="train/loss", max_points=4)
    )
    assert status == 200 and not body["raw"] and len(body["steps"]) <= 4
    assert body["steps"][0] == 0 and body["steps"][-1] == 9


@pytest.mark.parametrize(
    ("path", "status", "needle"),
    [
        ("/api/scalars?" + q(run="nope", tag="train/loss"), 404, "no run 'nope'"),
        ("/api/scalars?" + q(run="million", tag="nope"), 404, "has no scalar tag 'nope'"),
        ("/api/alerts?" + q(run="../million"), 404, "no run"),
        ("/api/snapshots?" + q(run="nope"), 404, "no run"),
        ("/api/scalars?" + q(run="million"), 400, "missing query parameter 'tag'"),
        ("/api/scalars?" + q(run="million", tag="train/loss", max_points=1), 400, "max_points"),
        ("/api/scalars?" + q(run="million", tag="train/loss", start="x"), 400, "not a number"),
        ("/api/nothing", 404, "not found"),
    ],
)
def test_errors_are_json(big, path, status, needle):
    _, _, client = big
    got, headers, body = client.request(path)
    assert got == status
    assert headers["Content-Type"] == "application/json"
    assert needle in json.loads(body)["error"]


TRAVERSALS = [
    "/../../../../etc/passwd",
    "/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/..%2f..%2f..%2fetc%2fpasswd",
    "/%252e%252e/%252e%252e/etc/passwd",
    "/static/../server.py",
    "/app.js/../server.py",
    "/vendor/../server.py",
    "/vendor/chart.js/../../__init__.py",
    "/..\\server.py",
    "/%2e%2e%5cserver.py",
    "//etc/passwd",
    "/server.py",
    "/store.py",
    "/static/app.js",
    "/./app.js",
    "/app.js%00.html",
    "http://127.0.0.1/../../etc/passwd",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_path_traversal_refused(big, path):
    _, _, client = big
    status, _, body = client.request(path)
    assert status in (400, 404)
    assert b"root:" not in body and b"import " not in body


def test_static_files_and_the_chart_component_shared_with_the_panel(big):
    _, _, client = big
    from msmon_nb.metrics.charts import CHART_ASSETS
    from msmon_nb.notebook.widget import PanelWidget

    status, headers, body = client.request("/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    # relative URLs: the page works under a proxy's prefix (test_proxy.py)
    assert b'"vendor/chart.js"' in body and b'"vendor/uPlot.iife.min.js"' in body
    assert b"https://" not in body and b"plotly" not in body
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    status, headers, body = client.request("/vendor/chart.js")
    assert status == 200 and body == (CHART_ASSETS / "chart.js").read_bytes()
    # the very code the notebook panel's module is made of
    assert body.decode() in PanelWidget._esm
    status, headers, body = client.request("/vendor/uPlot.iife.min.js")
    assert status == 200 and body.decode() in PanelWidget._esm
    status, headers, gz = client.request(
        "/vendor/uPlot.iife.min.js", headers={"Accept-Encoding": "gzip"}
    )
    assert headers["Content-Encoding"] == "gzip" and len(gz) < len(body) / 2
    status, _, js = client.request("/app.js")
    assert status == 200 and b"`api/scalars?" in js


def test_foreign_host_header_and_methods_refused(big):
    _, _, client = big
    status, _, body = client.request("/api/runs", headers={"Host": "evil.example:8080"})
    assert status == 403 and b"local-only" in body
    status, _, _ = client.request("/api/runs", headers={"Host": "localhost:1234"})
    assert status == 200
    status, headers, _ = client.request("/api/runs", method="POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD, POST"  # POST: /api/control only


def test_default_bind_is_loopback(tmp_path):
    server = make_server(tmp_path, port=0)
    try:
        assert server.server_address[0] == "127.0.0.1" and server.loopback_only
        assert server.socket.getsockname()[0] == "127.0.0.1"
        assert server.url.startswith("http://127.0.0.1:")
    finally:
        server.server_close()


def test_alerts_and_snapshots_with_nonfinite_values(tmp_path, serve):
    run_dir = tmp_path / "r"
    with EventWriter(run_dir) as writer:
        for step in range(5):
            writer.add_scalars(step, {"train/grad_norm": 10.0**step})
        writer.add_histogram("snap/fc1.weight/hist", np.array([1.0, 2.0, 2.5, np.nan]), step=4)
    alert = {
        "step": 4, "since_step": 2, "kind": "exploding", "severity": "critical",
        "message": "grad_norm exploding since step 2", "tag": "train/grad_norm",
        "value": float("inf"), "rank": 0, "wall_time": 1.0,
    }  # fmt: skip
    (run_dir / ALERTS).write_text(json.dumps(alert) + "\n" + '{"step": 5, "tor')  # torn line
    snap = {
        "step": 4, "name": "fc1.weight", "reason": "alert", "shape": [4], "dtype": "float32",
        "stats": {"min": 1.0, "max": 2.5, "mean": float("nan"), "nan_count": 1},
    }  # fmt: skip
    (run_dir / SNAPSHOTS).write_text(json.dumps(snap) + "\n")
    _, client = serve(tmp_path)
    status, alerts = client.json("/api/alerts?" + q(run="r"))
    assert status == 200
    # plus the chart it marks, stamped from its tag (the page keeps no list of kinds)
    assert alerts == [{**alert, "value": "inf", "chart": "train/grad_norm"}]
    status, snaps = client.json("/api/snapshots?" + q(run="r"))
    assert status == 200 and len(snaps) == 1
    (s,) = snaps
    assert s["stats"]["mean"] == "nan" and s["name"] == "fc1.weight"
    hist = s["histogram"]
    assert hist["nan_count"] == 1 and hist["count"] == 4 and sum(hist["counts"]) == 3
    assert len(hist["edges"]) == len(hist["counts"]) + 1
    assert hist["min"] == 1.0 and hist["max"] == 2.5


def test_truncated_mindspore_and_running_runs_load(tmp_path, serve, mindspore_run):
    import shutil

    shutil.copytree(mindspore_run, tmp_path / "ms")
    with EventWriter(tmp_path / "cut") as writer:
        for step in range(100):
            writer.add_scalars(step, {"train/loss": float(step)})
    (cut_file,) = (tmp_path / "cut").glob("*summary*")
    cut_file.chmod(0o600)
    data = cut_file.read_bytes()
    cut_file.write_bytes(data[:-7])  # the writer died mid-record
    live = EventWriter(tmp_path / "live", flush_secs=0.05)
    try:
        live.add_scalars(0, {"train/loss": 3.0})
        live.flush()
        (tmp_path / "live" / MARKER).write_text(
            json.dumps({"status": "running", "pid": __import__("os").getpid(),
                        "host": socket.gethostname()})
        )  # fmt: skip
        _, client = serve(tmp_path)
        status, runs = client.json("/api/runs")
        by_name = {r["name"]: r for r in runs}
        assert set(by_name) == {"cut", "live", "ms"}
        assert by_name["live"]["status"] == "running"
        assert by_name["ms"]["tags"] == ["acc", "loss"] and by_name["ms"]["last_step"] == 30
        status, body = client.json("/api/scalars?" + q(run="ms", tag="loss"))
        assert status == 200 and body["steps"] == list(range(1, 31))
        expected = load_run(mindspore_run).scalars("loss").values.astype(np.float64).tolist()
        assert body["values"] == expected
        status, body = client.json("/api/scalars?" + q(run="cut", tag="train/loss"))
        assert status == 200 and body["steps"] == list(range(99))  # every whole record
        status, body = client.json("/api/scalars?" + q(run="live", tag="train/loss"))
        assert status == 200 and body["values"] == [3.0]
    finally:
        live.close()


def test_listing_becomes_exact_once_a_run_is_loaded(tmp_path, serve):
    with EventWriter(tmp_path / "long") as writer:  # val/acc only in the middle of the file
        for step in range(40_000):
            values = {"train/loss": 1.0}
            if step == 20_000:
                values["val/acc"] = 0.5
            writer.add_scalars(step, values)
    _, client = serve(tmp_path)
    (listed,) = client.json("/api/runs")[1]
    assert listed["tags"] == ["train/loss"] and listed["exact"] is False
    assert client.json("/api/scalars?" + q(run="long", tag="train/loss"))[0] == 200
    (listed,) = client.json("/api/runs")[1]
    assert listed["tags"] == ["train/loss", "val/acc"] and listed["exact"] is True
    status, body = client.json("/api/scalars?" + q(run="long", tag="val/acc"))
    assert status == 200 and body["steps"] == [20_000] and body["values"] == [0.5]
