"""A big finished single-process run drawn from its writer's overview before it is decoded.

A million-step run is ~180 MB of events: decoding it kept the viewer's first chart waiting
3.4 s (bench/long.py, goal 1 s). The charts of a finished run whose writer closed are
answered from the overview (``raw`` false, every spike and NaN kept, first and last step
exact); a zoom, or a run still being written, or one whose files changed since, is decoded
as before and answered exactly.
"""

import os
import socket
import urllib.parse

import numpy as np
import pytest

from msmon_nb.events import runs
from msmon_nb.events.writer import EventWriter
from msmon_nb.rundir import write_marker
from msmon_nb.viewer.rankmerge import OVERVIEW_MIN_SCALARS

STEPS, SPIKE, NAN_STEP = 40_000, 12_345, 20_001


def write_single(run_dir, status="finished"):
    """A single-process run as ``Monitor`` writes it: flat, one writer, its marker."""
    rng = np.random.default_rng(0)
    grad = 1.0 + 0.1 * rng.standard_normal(STEPS)
    grad[SPIKE] = 500.0
    loss = np.linspace(2.0, 0.5, STEPS)
    loss[NAN_STEP] = np.nan
    with EventWriter(run_dir, rank=0, block_secs=None) as writer:
        for step in range(STEPS):
            writer.add_scalars(step, {"train/loss": float(loss[step]),
                                      "train/grad_norm": float(grad[step])})  # fmt: skip
    marker = {"run_name": run_dir.name, "status": status, "start": 1.7e9, "rank": 0,
              "ranks": 1, "host": socket.gethostname(), "pid": os.getpid()}  # fmt: skip
    if status != "running":
        marker.update(end=1.7e9 + 60, last_step=STEPS - 1)
    write_marker(run_dir, marker)
    return run_dir


@pytest.fixture
def decoded(monkeypatch):
    """The runs whose events were decoded (``Run.refresh`` called)."""
    seen = []
    real = runs.Run.refresh

    def refresh(self, *a, **k):
        seen.append(self.path.name)
        return real(self, *a, **k)

    monkeypatch.setattr(runs.Run, "refresh", refresh)
    return seen


def q(**kw) -> str:
    return "?" + urllib.parse.urlencode(kw)


def test_unzoomed_charts_come_from_the_overview_without_decoding(tmp_path, serve, decoded):
    write_single(tmp_path / "long")
    assert 2 * STEPS >= OVERVIEW_MIN_SCALARS
    _, client = serve(tmp_path)
    status, body = client.json("/api/scalars" + q(run="long", tag="train/grad_norm"))
    assert status == 200, body
    assert decoded == []  # answered without decoding the events
    assert body["raw"] is False and body["rank"] == 0
    assert body["steps"][0] == 0 and body["last_step"] == STEPS - 1
    assert body["steps"][-1] == STEPS - 1
    assert body["max"] == 500.0 and SPIKE in body["steps"]  # the spike is kept
    status, body = client.json("/api/scalars" + q(run="long", tag="train/loss", rank=0))
    assert status == 200 and decoded == []
    assert body["nonfinite"]["steps"] == [NAN_STEP]  # the NaN is kept, at its step
    status, body = client.json("/api/scalars" + q(run="long", tag="train/nope"))
    assert status == 404 and "train/grad_norm" in body["error"]
    # what else the page asks for on opening a run: none of it decodes a run without
    # snapshots (the snapshots request decoded it, holding the run's lock: 16 s under load)
    for what in ("alerts", "snapshots", "interventions", "checkpoints"):
        status, body = client.json(f"/api/{what}" + q(run="long"))
        assert status == 200 and body == [], what
    assert decoded == []


def test_a_zoom_decodes_and_then_every_chart_is_exact(tmp_path, serve, decoded):
    write_single(tmp_path / "long")
    _, client = serve(tmp_path)
    client.json("/api/scalars" + q(run="long", tag="train/grad_norm"))
    status, body = client.json(
        "/api/scalars" + q(run="long", tag="train/grad_norm", start=SPIKE - 5, end=SPIKE + 5)
    )
    assert status == 200 and body["raw"] is True and decoded == ["long"]
    assert body["steps"] == list(range(SPIKE - 5, SPIKE + 6)) and body["values"][5] == 500.0
    status, body = client.json("/api/scalars" + q(run="long", tag="train/loss", max_points=200000))
    assert body["raw"] is True and len(body["steps"]) == STEPS  # loaded: exact from now on


def test_a_running_run_is_decoded(tmp_path, serve, decoded):
    write_single(tmp_path / "live", status="running")
    _, client = serve(tmp_path)
    status, body = client.json("/api/scalars" + q(run="live", tag="train/loss"))
    assert status == 200 and decoded == ["live"]
    assert body["last_step"] == STEPS - 1


def test_a_run_changed_after_its_writer_closed_is_decoded(tmp_path, serve, decoded):
    run_dir = write_single(tmp_path / "long")
    _, client = serve(tmp_path)
    status, body = client.json("/api/scalars" + q(run="long", tag="train/loss"))
    assert body["raw"] is False and decoded == []
    (events,) = run_dir.glob("*summary*")
    events.chmod(0o600)
    with open(events, "ab") as f:
        f.write(b"\0" * 16)  # appended after close: the overview no longer covers the file
    client.json("/api/runs")  # a rescan sees the change, as the watcher's poll does
    status, body = client.json("/api/scalars" + q(run="long", tag="train/loss"))
    assert status == 200 and decoded == ["long"]


def test_heatmap_rows_in_forward_order_without_decoding(tmp_path, serve, decoded):
    """A heatmap's rows follow the order its modules were first recorded (forward order,
    here neither alphabetical nor reversed): the overview keeps its tags in write order."""
    run_dir = tmp_path / "acts"
    modules = ["embed", "body", "aux"]
    with EventWriter(run_dir, rank=0, block_secs=None) as writer:
        for step in range(25_000):
            writer.add_scalars(step, {"train/loss": 1.0, **{f"act/{m}/norm": float(step)
                                                             for m in modules}})  # fmt: skip
    marker = {"run_name": "acts", "status": "finished", "start": 1.7e9, "end": 1.7e9 + 60,
              "rank": 0, "ranks": 1, "host": socket.gethostname(), "pid": os.getpid(),
              "last_step": 24_999}  # fmt: skip
    write_marker(run_dir, marker)
    _, client = serve(tmp_path)
    status, charts = client.json("/api/charts" + q(run="acts"))
    assert status == 200, charts
    (heatmap,) = [c for c in charts if c.get("kind") == "heatmap"]
    assert heatmap["rows"] == modules, heatmap
    assert decoded == []
