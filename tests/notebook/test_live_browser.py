"""What a user sees while a %%msmonitor cell runs, in a real JupyterLab 4 and Notebook 7.

Headless Chromium (Debian's) drives the real front end; the page is sampled every second
while the cell trains a small MindSpore model for 30+ seconds. Everything asserted is
read from the page: the status line, each chart's data-last-step, the kernel status the
front end shows, the buttons' labels, and the saved .ipynb.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import sys
import time

import numpy as np
import pytest

from msmon_nb.events.runs import load_run, load_runs
from tests.conftest import run_msmon
from tests.support.jupyter_app import (
    KERNEL_STATUS_JS,
    cell_done_js,
    jupyter_page,
    run_all,
    save,
    write_notebook,
)
from tests.support.kernel_code import LIVE_SETUP as SETUP
from tests.support.kernel_code import LIVE_TRAIN as TRAIN

TAGS = ("train/loss", "train/grad_norm", "train/learning_rate")

SAMPLE_JS = f"""() => {{
  const status = document.querySelector('.msmon-status');
  const charts = {{}};
  for (const el of document.querySelectorAll('[data-msmon-tag]')) {{
    charts[el.dataset.msmonTag] = Number(el.dataset.lastStep);
  }}
  const buttons = [...document.querySelectorAll('.msmon-panel button')].map(b => b.textContent);
  const canvases = document.querySelectorAll('.msmon-panel canvas').length;
  return {{status: status ? status.textContent : null, charts, buttons, canvases,
          kernel: {KERNEL_STATUS_JS}}};
}}"""


def step_of(status: str | None) -> int:
    match = re.search(r"step (\d+)", status or "")
    return int(match.group(1)) if match else -1


def sample(page) -> dict:
    s = page.evaluate(SAMPLE_JS)
    s["t"] = time.monotonic()
    s["step"] = step_of(s["status"])
    return s


def click(page, label: str) -> None:
    page.locator(".msmon-panel button", has_text=label).first.click()


@pytest.mark.slow
@pytest.mark.parametrize("app", ["lab", "notebook"])
def test_panel_is_live_in_the_browser_while_the_cell_runs(tmp_path, app):
    write_notebook(tmp_path / "live.ipynb", [SETUP, TRAIN.format(base=tmp_path / "summary")])
    with jupyter_page(tmp_path, "live.ipynb", app=app) as page:
        run_all(page)
        page.wait_for_selector(".msmon-status", timeout=120_000)
        page.wait_for_function(
            "/step \\d+/.test(document.querySelector('.msmon-status')?.textContent || '')",
            timeout=120_000,
        )
        first_step_seen = time.monotonic()
        samples = []
        for _ in range(32):
            time.sleep(1.0)
            samples.append(sample(page))
        page.screenshot(path=str(tmp_path / f"midrun-{app}.png"))

        # the front end shows the kernel busy all along
        assert [s["kernel"] for s in samples] == ["busy"] * len(samples)
        # the step counter advances every second
        steps = [s["step"] for s in samples]
        assert all(b > a for a, b in itertools.pairwise(steps)), [s["status"] for s in samples]
        # each core chart appears within 3 s of the first step, then keeps advancing
        for tag in TAGS:
            shown = [s for s in samples if s["charts"].get(tag, -1) >= 0]
            assert shown, f"{tag} chart never appeared"
            assert shown[0]["t"] - first_step_seen <= 3.0, tag
            lasts = [s["charts"][tag] for s in samples]
            for i in range(2, len(lasts)):
                assert lasts[i] > lasts[i - 2], (tag, lasts)
            # it shows steps recorded up to about a second ago
            assert all(s["charts"][tag] >= s["step"] - 60 for s in samples[3:]), tag
        assert samples[-1]["canvases"] >= 3

        # Pause holds the counter, and the button reads Resume
        click(page, "Pause")
        page.wait_for_function(
            "document.querySelector('.msmon-status').textContent.includes('paused')",
            timeout=10_000,
        )
        held = sample(page)
        assert "Resume" in held["buttons"]
        time.sleep(2.0)
        still = sample(page)
        assert still["step"] == held["step"]
        assert still["kernel"] == "busy"
        # Resume moves it again
        click(page, "Resume")
        time.sleep(2.0)
        moved = sample(page)
        assert moved["step"] > still["step"]
        assert "Pause" in moved["buttons"]
        # collect every N, typed in the page, reaches the running loop
        page.fill(".msmon-freq", "5")
        page.dispatch_event(".msmon-freq", "change")
        page.wait_for_function(
            "document.querySelector('.msmon-status').textContent.includes('every 5 steps')",
            timeout=10_000,
        )
        changed_at = sample(page)["step"]
        # a refused value (0) is said to be refused, and its field goes back to the value
        # in force, though the cursor is still in it (it kept saying 0 beside "every 5")
        page.fill(".msmon-freq", "0")
        page.dispatch_event(".msmon-freq", "change")
        page.wait_for_function(
            "document.querySelector('.msmon-result').textContent.includes('got 0')",
            timeout=10_000,
        )
        assert page.evaluate("document.activeElement.classList.contains('msmon-freq')")
        assert page.input_value(".msmon-freq") == "5"
        assert "msmon-refused" in page.get_attribute(".msmon-result", "class")
        assert "every 5 steps" in page.text_content(".msmon-status")
        time.sleep(1.5)
        # Stop ends the cell within 2 s
        click(page, "Stop")
        began = time.monotonic()
        page.wait_for_function(cell_done_js(1), timeout=30_000)
        assert time.monotonic() - began <= 2.0 + 0.5  # 0.5 s: the page's polling
        page.wait_for_function(
            "document.querySelector('.msmon-status').textContent.includes('stopped')",
            timeout=10_000,
        )
        save(page)

    run = load_run(tmp_path / "summary" / "live")
    assert run.status == "stopped"
    late = [s for s in run.scalars("train/loss").steps.tolist() if s > changed_at]
    assert late and all(step % 5 == 0 for step in late), late  # every 5th step after it
    nb = json.loads((tmp_path / "live.ipynb").read_text())
    outputs = nb["cells"][1]["outputs"]
    pictures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert pictures, [list(o.get("data", {})) for o in outputs]
    assert len(pictures[0]["data"]["image/png"]) > 10_000  # a real picture, not a stub


SHOW = """%load_ext msmon_nb
import numpy as np
import msmon_nb as mm
values = np.ones(300)
values[150] = 40.0
values[200] = np.nan
with mm.Monitor(save_dir={base!r}, run_name="static") as mon:
    for v in values:
        mon.step(loss=float(v), lr=0.1)
mm.show(mon.run_dir)"""

CHART = '[data-msmon-tag="train/loss"]'


@pytest.mark.slow
def test_display_controls_act_in_the_page_while_the_kernel_is_busy(tmp_path):
    """Smoothing, log scale, hover, box zoom and reset need no kernel: they work while a
    later cell keeps the kernel busy. NaN/Inf and alerts are listed at their steps."""
    cells = [SHOW.format(base=str(tmp_path / "summary")), "import time\ntime.sleep(40)"]
    write_notebook(tmp_path / "show.ipynb", cells)
    with jupyter_page(tmp_path, "show.ipynb") as page:
        run_all(page)
        page.wait_for_function(
            f"document.querySelector('{CHART}')?.dataset.lastStep === '299'", timeout=60_000
        )
        page.wait_for_function(
            "window.jupyterapp.shell.currentWidget.content.widgets[1].model.executionCount"
            " === null && document.querySelector('.jp-Notebook')",
            timeout=30_000,
        )
        alerts = page.locator(".msmon-alerts").inner_text()
        assert "NaN/Inf in train/loss since step 200" in alerts
        chart = page.locator(CHART)
        assert chart.get_attribute("data-scale") == "linear"
        page.select_option(".msmon-scale", "log")
        assert chart.get_attribute("data-scale") == "log"
        page.eval_on_selector(
            ".msmon-smooth",
            "e => { e.value = '0.9'; e.dispatchEvent(new Event('input')); }",
        )
        assert "(smoothed)" in chart.locator(".u-legend").inner_text()
        over = chart.locator(".u-over")
        box = over.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        legend = chart.locator(".u-legend").inner_text()
        assert re.search(r"step\s*:?\s*\d+", legend) and "train/loss1" in legend, legend
        page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + 10)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] - 10, steps=5)
        page.mouse.up()
        assert chart.get_attribute("data-zoomed") == "1"
        over.dblclick()
        assert chart.get_attribute("data-zoomed") == "0"
        # all of it while the kernel was still sleeping in the second cell
        assert not page.evaluate(cell_done_js(1))


@pytest.mark.slow
def test_saved_widget_state_redraws_the_finished_panel_without_a_kernel(tmp_path):
    """With JupyterLab's "save widget state" on, a reopened notebook draws the finished
    panel from the saved state alone (its data is in the widget state, not the kernel)."""
    settings = tmp_path / ".settings" / "@jupyter-widgets" / "jupyterlab-manager"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text('{"saveState": true}')
    # a snapshot at step 30: its table and histogram are drawn by the page (chart.js)
    train = (
        TRAIN.replace("range(4000)", "range(60)")
        .replace(
            "    time.sleep(0.02)\n",
            "    time.sleep(0.02)\n    if step == 30:\n"
            "        import msmon_nb; msmon_nb.snapshot({{'fc.grad': grads[0]}})\n",
        )
        .format(base=tmp_path / "summary")
    )
    write_notebook(tmp_path / "first.ipynb", [SETUP, train])
    with jupyter_page(tmp_path, "first.ipynb") as page:
        run_all(page)
        page.wait_for_function(cell_done_js(1), timeout=120_000)
        save(page)
    saved = json.loads((tmp_path / "first.ipynb").read_text())
    assert "widgets" in saved["metadata"]
    (tmp_path / "reopened.ipynb").write_text(json.dumps(saved))
    with jupyter_page(tmp_path, "reopened.ipynb") as page:
        # no cell runs: the new kernel knows nothing of the panel
        page.wait_for_function(
            "[...document.querySelectorAll('[data-msmon-tag=\"train/loss\"]')]"
            ".some(e => e.dataset.lastStep === '59')",
            timeout=60_000,
        )
        status = page.locator(".msmon-status").first.inner_text()
        assert "finished" in status
        # the run's own rate, the last second's named beside it (issue 36)
        assert re.search(r"[\d.]+ steps/s over the run · [\d.]+ in its last second", status)
        row = page.locator(".msmon-snapshots tr[data-snapshot='fc.grad']")
        assert row.count() == 1 and row.locator("svg.msmon-hist rect").count() > 5


VISIBLE_JS = """(selector) => [...document.querySelectorAll(selector)]
  .some(e => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden')"""
MODEL_NOT_FOUND_JS = """() => [...document.querySelectorAll('.jp-OutputArea-output')]
  .some(e => e.textContent.includes('model not found') && e.getClientRects().length > 0)"""


@pytest.mark.slow
@pytest.mark.parametrize("app", ["lab", "notebook"])
def test_reopened_without_widget_state_shows_the_final_picture_not_model_not_found(tmp_path, app):
    """JupyterLab's default keeps no widget state in the saved notebook: reopened, the
    panel's place shows its final picture and a line saying why (issue 36), not the
    widget renderer's "model not found". While the cell ran and once it ended, only the
    live panel showed."""
    train = TRAIN.replace("range(4000)", "range(60)").format(base=tmp_path / "summary")
    write_notebook(tmp_path / "first.ipynb", [SETUP, train])
    with jupyter_page(tmp_path, "first.ipynb", app=app) as page:
        run_all(page)
        page.wait_for_function(
            "() => document.querySelector('.msmon-status') !== null", timeout=120_000
        )
        assert not page.evaluate(VISIBLE_JS, ".msmon-reopen")  # nothing below the live panel
        page.wait_for_function(cell_done_js(1), timeout=120_000)
        page.wait_for_function("() => document.querySelector('.msmon-reopen img') !== null")
        assert page.evaluate(VISIBLE_JS, ".msmon-panel")
        assert not page.evaluate(VISIBLE_JS, ".msmon-reopen")  # the finished live panel only
        save(page)
    saved = json.loads((tmp_path / "first.ipynb").read_text())
    assert not saved["metadata"].get("widgets")  # the default: no widget state saved
    (tmp_path / "reopened.ipynb").write_text(json.dumps(saved))
    with jupyter_page(tmp_path, "reopened.ipynb", app=app) as page:
        # (the first notebook may be open in a background tab: the visible one counts)
        page.wait_for_function(
            "() => [...document.querySelectorAll('.msmon-reopen img')].some(i => i.complete"
            " && i.naturalWidth > 300 && i.getClientRects().length > 0)",
            timeout=60_000,
        )
        line = page.evaluate(
            "() => [...document.querySelectorAll('.msmon-reopen p')]"
            ".filter(p => p.getClientRects().length > 0).map(p => p.textContent).join()"
        )
        assert "widget state was not saved" in line and "msmon view" in line
        # the renderer did give up on the model (the case), and its error is not shown
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jupyter-widgets')]"
            ".some(e => e.textContent.includes('model not found'))",
            timeout=30_000,
        )
        assert not page.evaluate(MODEL_NOT_FOUND_JS)


CONTROL_FRAMES = re.compile(rb'"comm_msg".*"type":\s*"(pause|resume|stop|freq)"', re.S)


def drop_page_controls(page, dropped: list) -> None:
    """Relay the kernel websocket, but drop the panel's control clicks on their way to the
    kernel, as VS Code does while a cell is busy (kernel -> page still flows)."""

    def handler(ws):
        server = ws.connect_to_server()

        def to_server(message):
            raw = message if isinstance(message, bytes) else message.encode()
            if CONTROL_FRAMES.search(raw):
                dropped.append(raw)
                return
            server.send(message)

        ws.on_message(to_server)
        server.on_message(lambda message: ws.send(message))

    page.route_web_socket(re.compile(r".*/api/kernels/.*/channels.*"), handler)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["msmon ctl", "viewer"])
def test_an_unanswered_click_shows_the_msmon_ctl_line_that_stops_the_cell(tmp_path, how):
    """Page -> kernel comm messages dropped (VS Code's busy kernel): Stop shows the
    terminal command within 3 s; that command, or the viewer's Stop button, ends the cell
    at a step boundary with status stopped."""
    write_notebook(tmp_path / "ctl.ipynb", [SETUP, TRAIN.format(base="summary")])
    dropped: list = []
    prepare = lambda page: drop_page_controls(page, dropped)  # noqa: E731
    with jupyter_page(tmp_path, "ctl.ipynb", prepare=prepare) as page:
        run_all(page)
        page.wait_for_function(
            f"Number(document.querySelector('{CHART}')?.dataset.lastStep) > 20",
            timeout=120_000,
        )
        page.click(".msmon-stop")
        clicked = time.monotonic()
        page.wait_for_selector(".msmon-hint:not([hidden]) .msmon-ctl", timeout=5_000)
        assert time.monotonic() - clicked < 3.5
        assert dropped, "the Stop click reached the kernel: nothing was dropped"
        command = page.locator(".msmon-ctl").inner_text()
        assert command.startswith("msmon ctl ") and command.endswith(" stop")
        assert not page.evaluate(cell_done_js(1))  # the click alone stopped nothing
        if how == "msmon ctl":
            done = subprocess.run(
                [sys.executable, "-m", "msmon_nb.cli", *shlex.split(command)[1:]],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
        else:
            from msmon_nb.viewer.server import make_server

            server = make_server(tmp_path / "summary", port=0)
            server.start()
            try:
                viewer = page.context.browser.new_page()
                viewer.goto(server.url)
                row = '.control-row[data-run="live"]'
                viewer.wait_for_selector(row, timeout=30_000)
                viewer.click(f'{row} button[data-cmd="stop"]')
                viewer.wait_for_function(
                    f"() => document.querySelector('{row} .control-msg').textContent"
                    ".includes('stopping')",
                    timeout=15_000,
                )
            finally:
                server.stop()
        page.wait_for_function(cell_done_js(1), timeout=30_000)
    runs = load_runs(tmp_path / "summary")
    assert [r.status for r in runs] == ["stopped"]


@pytest.mark.slow
def test_a_pause_from_msmon_ctl_shows_in_the_panel_and_snapshot_is_a_button(tmp_path):
    """The panel shows the monitor's state, whoever changed it: ``msmon ctl pause`` reads
    paused with a Resume button; the panel's Snapshot button (from the kernel's command
    table) summarises the tensors at a step boundary, acknowledged in the panel, listed in
    its snapshot table and recorded in the run."""
    write_notebook(tmp_path / "snap.ipynb", [SETUP, TRAIN.format(base="summary")])
    run_dir = tmp_path / "summary" / "live"
    with jupyter_page(tmp_path, "snap.ipynb") as page:
        run_all(page)
        page.wait_for_function(
            f"Number(document.querySelector('{CHART}')?.dataset.lastStep) > 20",
            timeout=120_000,
        )
        done = run_msmon("ctl", str(run_dir), "pause")
        assert done.returncode == 0, done.stderr
        page.wait_for_function(
            "document.querySelector('.msmon-state').textContent === 'paused'", timeout=10_000
        )
        visible = page.evaluate(
            "[...document.querySelectorAll('.msmon-panel button')]"
            ".filter(b => !b.hidden).map(b => b.textContent)"
        )
        assert "Resume" in visible and "Pause" not in visible, visible
        held = sample(page)["step"]
        time.sleep(1.5)
        assert sample(page)["step"] == held  # really paused, not only labelled so

        click(page, "Snapshot")  # while paused: the boundary loop still reads the page
        page.wait_for_function(
            "document.querySelector('.msmon-result').textContent.startsWith('snapshot of')",
            timeout=10_000,
        )
        answer = page.locator(".msmon-result").inner_text()
        assert answer.endswith(f"at step {held}"), answer
        page.wait_for_selector(".msmon-snapshots tr[data-snapshot]", timeout=10_000)
        click(page, "Resume")
        page.wait_for_function(
            "document.querySelector('.msmon-state').textContent === 'running'", timeout=10_000
        )
        page.wait_for_function(
            f"/step (\\d+)/.exec(document.querySelector('.msmon-status').textContent)[1] > {held}",
            timeout=10_000,
        )
        click(page, "Snapshot")  # while running: at the next step boundary
        page.wait_for_function(
            f"!document.querySelector('.msmon-result').textContent.endsWith('at step {held}')",
            timeout=10_000,
        )
        click(page, "Stop")
        page.wait_for_function(cell_done_js(1), timeout=30_000)
    run = load_run(run_dir)
    assert run.status == "stopped"
    steps = sorted({e["step"] for e in run.snapshots})
    assert len(steps) == 2 and steps[0] == held and steps[1] > held, steps
    assert {e["reason"] for e in run.snapshots} == {"ctl (panel)"}


CKPT_TRAIN = """%%msmonitor --dir summary --run live
losses = []
for step in range(300):
    loss, grads = grad_fn(x, y)
    opt(grads)
    losses.append(float(loss.asnumpy()))
    time.sleep(0.02)
"""

# fresh objects take the checkpoint and go on: the same losses and weights as the run
# (the saved lr Parameter is the list as lr x0.5 left it)
RESTORE = """import json
from msmon_nb.events.runs import load_run
[entry] = [i for i in load_run("summary/live").interventions if i["what"] == "checkpoint"]
k = entry["step"]
net2 = nn.SequentialCell([nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 2)])
opt2 = nn.Momentum(net2.trainable_params(), lr, 0.9)
saved = ms.load_checkpoint(entry["path"])
missing = ms.load_param_into_net(net2, saved)[0] + ms.load_param_into_net(opt2, saved)[0]
grad2 = ms.value_and_grad(lambda a, b: loss_fn(net2(a), b), None, opt2.parameters)
more = []
for step in range(k + 1, 300):
    l2, g2 = grad2(x, y)
    opt2(g2)
    more.append(float(l2.asnumpy()))
weights = [(a.asnumpy(), b.asnumpy()) for a, b in zip(net.get_parameters(), net2.get_parameters())]
with open("restored.json", "w") as f:
    json.dump({"k": k, "who": entry["who"], "missing": missing, "n": len(more),
               "same_losses": more == losses[k + 1:], "lr": lr[:300],
               "same_weights": all(np.array_equal(a, b) for a, b in weights)}, f)
"""

# an lr computed by a LearningRateSchedule cell: lr x0.5 is refused, nothing changed
SCHEDULE_TRAIN = """%%msmonitor --dir summary --run schedule
net3 = nn.SequentialCell([nn.Dense(32, 64), nn.ReLU(), nn.Dense(64, 2)])
opt3 = nn.Momentum(net3.trainable_params(), nn.ExponentialDecayLR(0.05, 0.9, 10), 0.9)
grad3 = ms.value_and_grad(lambda a, b: loss_fn(net3(a), b), None, opt3.parameters)
for step in range(2000):
    loss, grads = grad3(x, y)
    opt3(grads)
    time.sleep(0.02)
"""


def panel_js(i: int, expr: str) -> str:
    """JS for ``expr`` over ``panel``, the page's ``i``-th msmon panel (one per cell)."""
    return f"(panel => {expr})(document.querySelectorAll('.msmon-panel')[{i}])"


def marks_js(i: int) -> str:
    """JS: the intervention marks each chart of panel ``i`` draws, ``[step, label]``."""
    return panel_js(
        i,
        "[...panel.querySelectorAll('.msmon-chart')]"
        ".map(e => e.msmonChart.drawn().marks.map(m => [m.step, m.label]))",
    )


def result_js(i: int, start: str) -> str:
    """JS: panel ``i`` shows an answer to a command that starts with ``start``."""
    return panel_js(
        i, f"!!panel && panel.querySelector('.msmon-result').textContent.startsWith('{start}')"
    )


def lr_times_half(page, i: int) -> None:
    """Type 0.5 into panel ``i``'s lr field and click the button beside it."""
    panel = page.locator(".msmon-panel").nth(i)
    panel.locator("input.msmon-lr").fill("0.5")
    panel.locator("button.msmon-lr-send").click()


@pytest.mark.slow
def test_lr_and_checkpoint_from_the_panel_while_the_cell_runs_restore_bit_identically(tmp_path):
    """The panel's lr and Checkpoint controls (from the kernel's command table) act at a
    step boundary while the cell trains, each acknowledged in the panel and drawn as a
    mark on every chart: lr x0.5 halves the list schedule's lr from the next step on
    (read back from the run), and the checkpoint, loaded into a fresh net and optimizer,
    goes on with exactly the losses and weights of the run. In a cell whose lr is a
    LearningRateSchedule, the panel shows lr x0.5 refused, saying why, and the lr
    follows its schedule unchanged."""
    cells = [SETUP, CKPT_TRAIN, RESTORE, SCHEDULE_TRAIN]
    write_notebook(tmp_path / "ckpt.ipynb", cells)
    with jupyter_page(tmp_path, "ckpt.ipynb") as page:
        run_all(page)
        page.wait_for_function(
            f"Number(document.querySelector('{CHART}')?.dataset.lastStep) > 20",
            timeout=120_000,
        )
        lr_times_half(page, 0)
        page.wait_for_function(result_js(0, "lr x0.5: "), timeout=10_000)
        lr_answer = page.locator(".msmon-result").first.inner_text()
        page.wait_for_function(f"{marks_js(0)}.every(m => m.length === 1)", timeout=10_000)
        lr_marks = page.evaluate(marks_js(0))
        click(page, "Checkpoint")
        page.wait_for_function(result_js(0, "checkpoint of"), timeout=10_000)
        answer = page.locator(".msmon-result").first.inner_text()
        page.wait_for_function(f"{marks_js(0)}.every(m => m.length === 2)", timeout=10_000)
        per_chart = page.evaluate(marks_js(0))
        page.wait_for_function(cell_done_js(2), timeout=120_000)

        chart = panel_js(1, f"Number(panel?.querySelector('{CHART}')?.dataset.lastStep)")
        page.wait_for_function(f"{chart} > 5", timeout=120_000)
        lr_times_half(page, 1)
        page.wait_for_function(result_js(1, "lr refused: "), timeout=10_000)
        second = page.locator(".msmon-panel").nth(1)
        refusal = second.locator(".msmon-result").inner_text()
        refused_shown = "msmon-refused" in second.locator(".msmon-result").get_attribute("class")
        at = page.evaluate(chart)
        page.wait_for_function(f"{chart} > {at + 3}", timeout=30_000)  # trains on, unchanged
        second.locator("button.msmon-stop").click()
        page.wait_for_function(cell_done_js(3), timeout=30_000)
        # the stop is drawn as a mark on every chart; the refusal, which changed nothing, not
        page.wait_for_function(f"{marks_js(1)}.every(m => m.length > 0)", timeout=10_000)
        stop_marks = page.evaluate(marks_js(1))

    restored = json.loads((tmp_path / "restored.json").read_text())
    k = restored["k"]
    run = load_run(tmp_path / "summary" / "live")
    assert run.status == "finished"
    lr_done, ckpt_done = run.interventions
    assert (lr_done["what"], lr_done["arg"], lr_done["who"], lr_done["ok"]) == (
        "lr", 0.5, "panel", True,
    ), lr_done  # fmt: skip
    k_lr = lr_done["step"]
    assert 20 < k_lr < k < 299 and ckpt_done["step"] == k
    assert lr_answer == lr_done["message"] and lr_answer.startswith("lr x0.5: "), lr_answer
    assert lr_answer.endswith(" from the next step on"), lr_answer
    assert len(lr_marks) >= 3 and all(m == [[k_lr, "lr x0.5"]] for m in lr_marks), lr_marks
    series = run.scalars("train/learning_rate")
    table = np.asarray(restored["lr"], np.float32)
    assert series.steps.tolist() == list(range(300))
    for step, value in zip(series.steps.tolist(), series.values.tolist(), strict=True):
        want = table[step] * np.float32(0.5) if step > k_lr else table[step]
        assert value == float(want), (step, k_lr, value, float(want))

    assert answer.startswith(f"checkpoint of step {k} saved: "), answer
    assert all(m == [[k_lr, "lr x0.5"], [k, "checkpoint"]] for m in per_chart), per_chart
    assert restored["who"] == "panel" and restored["missing"] == []
    assert restored["n"] == 299 - k
    assert restored["same_losses"] and restored["same_weights"], restored
    assert [(c["step"], c["rank"]) for c in run.checkpoints] == [(k, None)]

    schedule = load_run(tmp_path / "summary" / "schedule")
    refused, stopped = schedule.interventions  # then the panel's Stop
    assert (refused["what"], refused["who"], refused["ok"]) == ("lr", "panel", False), refused
    assert (stopped["what"], stopped["ok"], schedule.status) == ("stop", True, "stopped")
    assert refusal == refused["message"] and refused_shown, refusal
    assert refusal.startswith("lr refused: Momentum's lr is a ExponentialDecayLR"), refusal
    assert "LearningRateSchedule" in refusal and "Nothing was changed" in refusal, refusal
    assert len(stop_marks) >= 3, stop_marks
    assert all(m == [[stopped["step"], "stop"]] for m in stop_marks), stop_marks
    decayed = schedule.scalars("train/learning_rate")
    assert decayed.steps[-1] > refused["step"] + 3  # steps after the refusal were recorded
    steps = decayed.steps.astype(np.float64)  # the schedule's, before and after the refusal
    np.testing.assert_allclose(decayed.values, 0.05 * 0.9 ** (steps / 10), rtol=1e-5)
