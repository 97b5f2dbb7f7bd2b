"""The panel without a kernel: what it sends the page, when, controls, fallback, pictures."""

import io
import json

import numpy as np
from PIL import Image

from msmon_nb.metrics.series import Series
from msmon_nb.monitor import Monitor
from msmon_nb.notebook.panel import STATE_SECS, Panel, vscode_kernel
from msmon_nb.notebook.render import ChartRenderer, RenderOptions
from msmon_nb.notebook.updates import (
    MAX_MESSAGE_BYTES,
    MAX_STATE_BYTES,
    RESET_POINTS,
    PointStream,
    unpack,
)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Recorder:
    """Keeps every message the widget would send to the page."""

    def __init__(self, panel):
        self.messages = []
        panel.widget.send = lambda msg, buffers=None: self.messages.append((msg, buffers or []))

    def points(self, key):
        """All (steps, values) the page received for ``key``, in order."""
        steps, values = [], []
        for msg, buffers in self.messages:
            if msg["type"] == "reset":
                steps, values = [], []
            if key in msg["keys"]:
                new_steps, new_values = unpack(msg["keys"], msg["counts"], buffers[0])[key]
                steps.extend(new_steps)
                values.extend(new_values)
        return np.array(steps), np.array(values)


def test_updates_throttled_to_refresh_and_only_new_points(tmp_path):
    clock = FakeClock()
    with Monitor(save_dir=str(tmp_path)) as mon:
        panel = Panel("t", str(mon.run_dir), refresh=0.5, clock=clock)
        rec = Recorder(panel)
        panel.attach(mon)
        for i in range(100):  # 100 steps in 10 s
            clock.now += 0.1
            mon.step(loss=1.0 + i)
    # one message per 0.5 s, not one per step
    assert 18 <= len(rec.messages) <= 22
    steps, values = rec.points("train/loss")
    assert steps.tolist() == list(range(100))[: len(steps)] and len(steps) >= 95
    np.testing.assert_array_equal(values, 1.0 + steps)
    statuses = [msg["status"]["step"] for msg, _ in rec.messages]
    assert statuses == sorted(statuses) and statuses[-1] >= 95


def test_a_finished_panel_shows_the_runs_mean_rate_beside_its_last_second(tmp_path):
    """60 steps/s for 5 s, then 6 steps/s for 3 s: the finished status says ~40 steps/s
    over the run (what the run did), with the last window's rate named beside it."""
    clock = FakeClock()
    with Monitor(save_dir=str(tmp_path)) as mon:
        panel = Panel("t", str(mon.run_dir), refresh=0.5, clock=clock)
        rec = Recorder(panel)
        panel.attach(mon)
        for i in range(300):
            clock.now += 1 / 60
            mon.step(loss=1.0 / (i + 1))
        running = rec.messages[-1][0]["status"]
        assert "mean_rate" not in running and running["rate"] > 55
        for i in range(300, 318):  # the last 3 s: 6 steps a second
            clock.now += 1 / 6
            mon.step(loss=1.0 / (i + 1))
        panel.finish("finished")
    final = rec.messages[-1][0]["status"]
    assert final["state"] == "finished"
    assert abs(final["mean_rate"] - 318 / 8.0) < 0.5
    assert 5 < final["rate"] < 8


def test_page_messages_drive_the_monitor(tmp_path):
    with Monitor(save_dir=str(tmp_path)) as mon:
        panel = Panel("t", str(mon.run_dir))
        rec = Recorder(panel)
        panel.attach(mon)
        panel._on_page({"type": "pause"})
        assert mon.paused and panel.state == "paused"
        panel._on_page({"type": "resume"})
        assert not mon.paused
        panel._on_page({"type": "freq", "value": 9})
        assert mon.collect_freq == 9
        panel._on_page({"type": "freq", "value": 0})  # refused: not a valid frequency
        assert mon.collect_freq == 9
        panel._on_page({"type": "stop"})
        assert mon.stop_requested
        mon.resume()
        assert mon.boundary(raise_stop=False)  # the stop takes effect; none is pending
        panel._on_page({"type": "hello"})
        assert panel.acked and rec.messages[-1][0]["type"] == "reset"
        assert rec.messages[-1][0]["charts"][0]["tags"] == ["train/loss"]


def test_no_hello_within_the_timeout_falls_back_to_pngs(tmp_path, capsys):
    clock = FakeClock()
    with Monitor(save_dir=str(tmp_path)) as mon:
        panel = Panel(
            "t", str(mon.run_dir), refresh=0.5, ack_timeout=3.0, hello_held=False, clock=clock
        )
        Recorder(panel)
        shown = []

        class Handle:
            def update(self, bundle, raw=False):
                shown.append(bundle)

        panel.handle = Handle()
        panel._displayed_at = clock.now
        panel.attach(mon)
        for _ in range(20):  # 2 s: still waiting for the page
            clock.now += 0.1
            mon.step(loss=1.0)
        assert not panel.fallback and not shown
        for _ in range(20):
            clock.now += 0.1
            mon.step(loss=2.0)
        assert panel.fallback
        assert shown and "image/png" in shown[-1]
        assert "application/vnd.jupyter.widget-view+json" not in shown[-1]
        assert capsys.readouterr().out.count("did not load the panel's widget code") == 1
        panel._on_page({"type": "hello"})  # a late page: back to the live view
        assert not panel.fallback
        assert "application/vnd.jupyter.widget-view+json" in shown[-1]


def page_view(events, created_at):
    """What panel.js shows when its view is created after ``events[:created_at]``: the
    latest synced state, then the updates it does not hold, each new state a reset."""
    steps, values, state_seq = [], [], None
    for kind, msg, buffer in events[:created_at]:
        if kind == "state":
            latest = (msg, buffer)
    if created_at and any(kind == "state" for kind, *_ in events[:created_at]):
        msg, buffer = latest
        steps, values = map(list, unpack(msg["keys"], msg["counts"], buffer)["train/loss"])
        state_seq = msg["seq"]
    else:
        state_seq = 0
    for kind, msg, buffer in events[created_at:]:
        if kind == "state":
            if state_seq is None:
                continue
            steps, values = map(list, unpack(msg["keys"], msg["counts"], buffer)["train/loss"])
            state_seq = msg["seq"]
            continue
        if msg["type"] == "reset":
            steps, values, state_seq = [], [], None
        elif state_seq is not None and msg["seq"] <= state_seq:
            continue
        if "train/loss" in msg["keys"]:
            new_steps, new_values = unpack(msg["keys"], msg["counts"], buffer)["train/loss"]
            steps += list(new_steps)
            values += list(new_values)
    return steps, values


def test_where_the_hello_is_held_the_state_follows_the_run_and_nothing_falls_back(tmp_path, capsys):
    """A page's hello that waits (VS Code: for a step boundary): the panel keeps its synced state
    current instead of falling back to pictures, and a view created at any moment has
    every step exactly once by the next state (at most STATE_SECS later)."""
    clock = FakeClock()
    events = []
    with Monitor(save_dir=str(tmp_path)) as mon:
        assert Panel("t").hello_held is False  # not a kernel VS Code launched
        panel = Panel(
            "t", str(mon.run_dir), refresh=0.5, ack_timeout=3.0, hello_held=True, clock=clock
        )
        panel.widget.send = lambda msg, buffers=None: events.append(
            ("msg", msg, buffers[0] if buffers else b"")
        )
        panel.widget.observe(  # set after ``initial``; the page gets both in one message
            lambda change: events.append(("state", panel.widget.initial, change["new"])),
            names="initial_data",
        )
        shown = []
        panel.handle = type("Handle", (), {"update": lambda self, b, raw=False: shown.append(b)})()
        panel._displayed_at = clock.now
        panel.attach(mon)
        for i in range(100):  # 10 s, no hello
            clock.now += 0.1
            mon.step(loss=1.0 + i)
        panel.send()
        panel.keep_state()  # the next state (STATE_SECS later, or the run's end)
    assert not panel.fallback and not shown
    assert "did not load" not in capsys.readouterr().out
    states = [msg for kind, msg, _ in events if kind == "state"]
    assert 10 / STATE_SECS - 1 <= len(states) <= 10 / STATE_SECS + 2, len(states)
    assert [s["seq"] for s in states] == sorted(s["seq"] for s in states)
    # with a sending thread (Outbox) a state can overtake the update sent just before it
    overtaken = list(events)
    for i in range(1, len(overtaken)):
        if overtaken[i][0] == "state" and overtaken[i - 1][0] == "msg":
            overtaken[i - 1], overtaken[i] = overtaken[i], overtaken[i - 1]
    for order in (events, overtaken):
        for created_at in range(len(order) + 1):
            steps, values = page_view(order, created_at)
            assert steps == list(range(100)), (created_at, steps[:5], len(steps))
            assert values == [1.0 + s for s in steps]
    # the page's hello ends it: no more state until the run ends
    panel._on_page({"type": "hello"})
    before = len(events)
    with Monitor(save_dir=str(tmp_path)) as mon2:
        panel.attach(mon2)
        for _ in range(30):
            clock.now += 0.1
            mon2.step(loss=1.0)
    assert all(kind == "msg" for kind, *_ in events[before:])


def test_vscode_kernel_is_told_by_the_variable_vs_codes_launcher_sets():
    assert vscode_kernel({"PYDEVD_IPYTHON_COMPATIBLE_DEBUGGING": "1"})
    assert not vscode_kernel({"VSCODE_PID": "12"})
    assert not vscode_kernel({})


def flat_series(n: int, spike_at: int, nan_at: int) -> Series:
    """``n`` ones with a 50 at ``spike_at`` and a NaN at ``nan_at``."""
    values = np.ones(n)
    values[spike_at] = 50.0
    values[nan_at] = np.nan
    s = Series()
    s.extend(np.arange(n), values, np.zeros(n))
    return s


def test_stream_keeps_spikes_nonfinite_and_the_newest_point_in_bounded_bytes():
    n = 1_000_000
    s = flat_series(n, 777_777, 900_000)
    stream = PointStream(max_new=512)
    chunk = stream.take({"train/loss": s})
    steps, sent = unpack(chunk.keys, chunk.counts, chunk.buffer)["train/loss"]
    assert len(steps) <= RESET_POINTS + 1
    assert 50.0 in sent and steps[sent == 50.0][0] == 777_777
    assert steps[-1] == n - 1
    assert chunk.nonfinite == {"train/loss": [[900_000, "nan"]]}
    # afterwards only what is new, however much arrived: bounded bytes per message
    s.extend(np.arange(n, 2 * n), np.ones(n), np.zeros(n))
    chunk = stream.take({"train/loss": s})
    assert chunk.nbytes <= 2 * 8 * (512 + 1)
    assert unpack(chunk.keys, chunk.counts, chunk.buffer)["train/loss"][0][0] >= n
    assert stream.take({"train/loss": s}).keys == []


def test_spike_and_nan_are_visible_in_the_png():
    s = flat_series(200_000, 77_777, 150_000)
    renderer = ChartRenderer(RenderOptions(headroom=1.0))  # a finished run: tight axes
    png = renderer.render({"train/loss": s})
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    assert renderer.first_nonfinite() == {"train/loss": 150_000}
    blue = (abs(image[:, :, 0] - 0x1F) < 40) & (abs(image[:, :, 2] - 0xB4) < 40)
    red = (image[:, :, 0] > 180) & (image[:, :, 1] < 80) & (image[:, :, 2] < 80)
    rows = np.nonzero(blue[:, : image.shape[1] // 2].any(axis=1))[0]
    # the line reaches from the flat level up to the spike: a tall blue extent
    assert rows.max() - rows.min() > 100
    assert red.any(), "the NaN step should be marked in red"


def test_show_lists_snapshots_with_histograms(tmp_path):
    from msmon_nb.events.runs import load_run
    from msmon_nb.notebook.session import show

    rng = np.random.default_rng(0)
    with Monitor(save_dir=str(tmp_path)) as mon:
        mon.step(loss=1.0)
        mon.snapshot({"fc1.weight": rng.normal(size=(20, 30)), "bad": np.array([1.0, np.nan])})
    widget = show(load_run(mon.run_dir))
    rec = Recorder(widget.panel)
    widget.panel._on_page({"type": "hello"})
    rows = {e["name"]: e for e in rec.messages[-1][0]["snapshots"]}
    assert "image/png" in widget._repr_mimebundle_()
    json.dumps(rows, allow_nan=False)  # JSON-safe: NaN spelled out, numpy made plain
    weight, bad = rows["fc1.weight"], rows["bad"]
    assert sum(weight["histogram"]["counts"]) == 600 and len(weight["histogram"]["counts"]) > 10
    assert len(weight["histogram"]["edges"]) == len(weight["histogram"]["counts"]) + 1
    assert bad["stats"]["nan_count"] == 1 and weight["shape"] == [20, 30]


def test_relayout_of_some_axes_equals_a_full_draw():
    """A warmup lifting only the learning-rate chart redraws that axes alone; the picture
    must be exactly what a full matplotlib draw with the same limits gives."""
    tags = ("train/loss", "train/grad_norm", "train/learning_rate", "train/throughput")
    rng = np.random.default_rng(0)
    n = 1500
    values = {tag: np.abs(rng.normal(size=n)) + 0.1 for tag in tags}
    values["train/learning_rate"][500:] *= 100
    values["train/learning_rate"][1000:] *= 100

    def first(k):
        out = {}
        for tag in tags:
            s = Series()
            s.extend(np.arange(k), values[tag][:k], np.zeros(k))
            out[tag] = s
        return out

    renderer = ChartRenderer()
    renderer.render(first(500), expect_step=n)
    before = list(renderer._limits)
    renderer.render(first(1000), expect_step=n)
    partial = renderer.render(first(n), expect_step=n)
    after = list(renderer._limits)
    moved = [i for i in range(len(tags)) if before[i] != after[i]]
    assert moved == [2]  # only the learning-rate axes re-laid out
    renderer._backgrounds = []  # force a full draw with the very same limits
    full = renderer.render(first(n), expect_step=n)
    assert renderer._limits == after
    a, b = (np.asarray(Image.open(io.BytesIO(png)).convert("RGB")) for png in (partial, full))
    assert np.array_equal(a, b)


def test_unaffordable_relayout_defers_only_that_chart():
    """Out of budget, the chart whose axes must change keeps its last picture (new data
    clipped to old axes would mislead) while the other charts go on updating."""
    tags = ("train/loss", "train/learning_rate")
    n = 1000
    lr = np.linspace(1e-4, 1e-2, n)  # a warmup: lifts its chart's axes again and again
    loss = 2.0 + 0.1 * np.sin(np.arange(n) / 7.0)

    def first(k):
        out = {}
        for tag, values in zip(tags, (loss, lr), strict=True):
            s = Series()
            s.extend(np.arange(k), values[:k], np.zeros(k))
            out[tag] = s
        return out

    renderer = ChartRenderer()
    png0 = renderer.render(first(100), expect_step=n)
    lr_limits = renderer._limits[2]
    png1 = renderer.render(first(900), expect_step=n, layout_budget=0.0)
    assert renderer.deferred and renderer._limits[2] == lr_limits
    img0, img1 = (np.asarray(Image.open(io.BytesIO(p)).convert("RGB")) for p in (png0, png1))
    x0, y0, x1, y1 = (int(v) for v in renderer._cells[2])
    assert np.array_equal(img0[y0:y1, x0:x1], img1[y0:y1, x0:x1])  # lr chart untouched
    x0, y0, x1, y1 = (int(v) for v in renderer._cells[0])
    assert not np.array_equal(img0[y0:y1, x0:x1], img1[y0:y1, x0:x1])  # loss chart moved on
    renderer.render(first(900), expect_step=n)  # budget again: the lr axes catch up
    assert not renderer.deferred and renderer._limits[2] != lr_limits


def test_a_series_that_shrank_is_sent_again_as_a_reset():
    panel = Panel("t", live=False)
    rec = Recorder(panel)
    s = flat_series(100, 10, 20)
    panel.set_data({"train/loss": s})
    panel.send()
    shorter = Series()
    shorter.extend(np.arange(30), np.full(30, 2.0), np.zeros(30))
    panel.set_data({"train/loss": shorter})  # the run was re-read: its steps restarted
    panel.send()
    assert [m["type"] for m, _ in rec.messages] == ["append", "reset"]
    steps, values = rec.points("train/loss")
    assert steps.tolist() == list(range(30)) and set(values) == {2.0}


def test_a_large_reset_travels_in_messages_vs_code_can_relay():
    """12 series of 1 M steps: the reset is split so no message carries more than
    MAX_MESSAGE_BYTES of points (VS Code's JSON-array relay fails past ~120 KB); the page
    ends with the same points as from one message, the first carrying charts and status."""
    panel = Panel("t", live=False)
    rec = Recorder(panel)
    n = 1_000_000
    data = {}
    for i in range(12):
        s = Series()
        s.extend(np.arange(n), np.sin(np.arange(n) / (100 + i)) + i, np.zeros(n))
        data[f"{'val' if i < 6 else 'sys'}/metric_{i:02d}"] = s  # 6 lines a chart
    panel.set_data(data)
    panel.send(reset=True)
    types = [m["type"] for m, _ in rec.messages]
    assert types[0] == "reset" and set(types[1:]) == {"append"} and len(types) >= 3
    assert "charts" in rec.messages[0][0] and "charts" not in rec.messages[1][0]
    for _msg, buffers in rec.messages:
        assert sum(len(b) for b in buffers) <= MAX_MESSAGE_BYTES
    single = PointStream().take(data)
    whole = unpack(single.keys, single.counts, single.buffer)
    assert set(single.keys) == set(data)
    for key in data:
        steps, values = rec.points(key)
        np.testing.assert_array_equal(steps, whole[key][0])
        np.testing.assert_array_equal(values, whole[key][1])
    panel.keep_state()  # the saved state is one message too
    assert len(panel.widget.initial_data) <= MAX_STATE_BYTES
    assert panel.widget.initial["type"] == "reset" and panel.widget.initial["keys"]


def test_the_panel_answers_each_control_as_the_interpreter_did(tmp_path):
    """A refused freq is answered as refused (it was acknowledged as done), a pause from
    outside the page (msmon ctl, the viewer) reads paused, and the page gets the table
    its controls are built from."""
    with Monitor(save_dir=str(tmp_path)) as mon:
        mon.step(loss=1.0)
        panel = Panel("t", str(mon.run_dir))
        rec = Recorder(panel)
        panel.attach(mon)
        assert [c["label"] for c in panel.widget.commands][:3] == ["Pause", "Resume", "Stop"]
        panel._on_page({"type": "freq", "value": 0, "id": 1})
        ack = rec.messages[-1][0]
        assert ack["type"] == "ack" and ack["id"] == 1 and ack["ok"] is False
        assert "whole number >= 1 (e.g. freq 10), got 0" in ack["message"]
        assert mon.collect_freq == 1
        mon.command("pause", source="msmon ctl")  # what Monitor._obey does for msmon ctl
        assert panel._status()["state"] == "paused"
        panel._on_page({"type": "resume", "id": 2})
        ack = rec.messages[-1][0]
        assert ack["ok"] and ack["message"] == "resumed" and ack["status"]["state"] == "running"
        panel._on_page({"type": "stop", "id": 3})
        assert rec.messages[-1][0]["status"]["state"] == "stopping"
        mon.resume()
    assert Panel("s", live=False).widget.commands == []


def test_two_optimizers_reach_the_page_as_one_line_each_and_ds_alert_on_its_chart(tmp_path):
    """A GAN recorded with each optimizer's own series (mon.step's extra scalars, as the
    collectors write them): the page's plan holds no whole-step loss/grad_norm/lr line
    waiting for data, each chart names its lines by optimizer, D's explosion is an alert
    on the grad_norm chart, and the matplotlib picture's legend names them too."""
    rng = np.random.default_rng(0)
    with Monitor(save_dir=str(tmp_path)) as mon:
        panel = Panel("gan", str(mon.run_dir))
        rec = Recorder(panel)
        panel.attach(mon)
        for i in range(60):
            d_grad = 1.9 * np.exp(rng.normal(0, 0.1)) * (1e4 if i >= 40 else 1.0)
            values = {
                "opt/netd/loss": 1.4 + 0.01 * rng.normal(),
                "opt/netg/loss": 0.76 + 0.01 * rng.normal(),
                "opt/netd/grad_norm": d_grad,
                "opt/netg/grad_norm": 0.15 * np.exp(rng.normal(0, 0.1)),
                "opt/netd/learning_rate": 2e-3,
                "opt/netg/learning_rate": 1e-3,
            }
            mon.step(batch_size=8, **values)
        panel._on_page({"type": "hello"})
        msg = rec.messages[-1][0]
    charts = {c["title"].split(" · ")[0]: c for c in msg["charts"]}
    keys = {k for c in msg["charts"] for k in c["tags"]}
    assert not keys & {"train/loss", "train/grad_norm", "train/learning_rate"}
    grad = charts["grad_norm"]
    assert grad["tags"] == ["opt/netd/grad_norm", "opt/netg/grad_norm"]
    assert grad["labels"] == ["netd", "netg"] and grad["log"]
    assert grad["title"] == "grad_norm · 2 optimizers: one line each"
    assert "a whole-step train/grad_norm would mix their networks" in grad["note"]
    assert charts["loss"]["labels"] == ["netd", "netg"]
    [boom] = [a for a in msg["alerts"] if a["kind"] == "grad_explosion"]
    assert boom["chart"] == "opt/netd/grad_norm" and boom["since_step"] == 40
    assert boom["message"].startswith("netd grad_norm exploding since step 40")
    assert not [a for a in msg["alerts"] if "netg" in (a["tag"] or "")]
    renderer = ChartRenderer(RenderOptions(headroom=1.0))
    assert renderer.render(dict(mon.series)) is not None
    titles = [c.title for c in renderer.charts]
    legend = renderer._axes[titles.index(grad["title"])].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["netd", "netg"]
