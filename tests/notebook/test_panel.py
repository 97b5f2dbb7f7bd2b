"""The panel without a kernel: throttling, back-off, controls, and spikes in the picture."""

import io

import numpy as np
from PIL import Image

from msmon_nb.metrics.series import Series
from msmon_nb.monitor import Monitor
from msmon_nb.notebook.panel import Panel
from msmon_nb.notebook.render import ChartRenderer


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_redraws_throttled_and_backing_off(tmp_path):
    clock = FakeClock()
    with Monitor(save_dir=str(tmp_path)) as mon:
        panel = Panel("t", str(mon.run_dir), refresh=0.5, budget=0.01, clock=clock)
        panel.attach(mon)
        real_render = panel.renderer.render

        def slow_render(series, expect=None):
            clock.now += 0.05  # every draw "costs" 50 ms
            return real_render(series, expect)

        panel.renderer.render = slow_render
        for _ in range(100):  # 100 steps in 10 s
            clock.now += 0.1
            mon.step(loss=1.0)
        # each draw costs 50 ms, so at 1 % the next may come 5 s later: the first step and
        # about one more in the 10 s, not one per 0.5 s
        assert 1 <= panel.draws <= 3
        assert panel.draw_time <= 0.01 * clock.now + 0.05


def test_controls_drive_the_monitor(tmp_path):
    with Monitor(save_dir=str(tmp_path)) as mon:
        panel = Panel("t", str(mon.run_dir))
        panel.attach(mon)
        panel.pause_button.value = True
        assert mon.paused and panel.pause_button.description == "Resume"
        panel.pause_button.value = False
        assert not mon.paused
        panel.freq.value = 9
        assert mon.collect_freq == 9
        panel.stop_button.click()
        assert mon.stop_requested


def test_spike_and_nan_are_visible_in_the_png():
    n = 200_000
    values = np.ones(n)
    values[77_777] = 50.0
    values[150_000] = np.nan
    s = Series()
    s.extend(np.arange(n), values, np.zeros(n))
    renderer = ChartRenderer()
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
    table = widget.children[4].value
    assert "data-snapshot='fc1.weight'" in table and "data-snapshot='bad'" in table
    assert table.count("<rect") > 10  # the histogram bars
    assert "1/0" in table  # NaN count of 'bad'
