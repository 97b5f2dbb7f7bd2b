"""Interventions on the viewer's page, in real headless Chromium: ``lr x0.5`` and a
checkpoint sent with ``msmon ctl`` to a ``Model.train`` run (list lr schedule) are marks on
every chart with their text on hover, rows of the interventions table, and the checkpoint
is listed with its step and size."""

from __future__ import annotations

import mindspore as ms

from tests.support import tiny
from tests.support.training import model_train_under_ctl
from tests.viewer.test_browser import CHART, DRAWN, browser, open_page, wait_for  # noqa: F401

LR = "train/learning_rate"


def test_lr_and_checkpoint_from_msmon_ctl_are_marks_rows_and_a_listed_file(
    browser,  # noqa: F811
    serve,
    tmp_path,
):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    steps = 40
    lr = tiny.warmup_lr(steps, peak=0.05, warmup=10)
    mon, _opt, out, code = model_train_under_ctl(
        tmp_path, steps, lr, ["lr", "x0.5"], then=["checkpoint"]
    )
    assert code == 0, out
    lr_step, ckpt_step = (i["step"] for i in mon.interventions)
    assert [i["label"] for i in mon.interventions] == ["lr x0.5", "checkpoint"]

    server, _ = serve(tmp_path)
    page, problems = open_page(browser)
    page.goto(server.url)
    box = f"tr[data-run='{mon.run_name}'] input[type=checkbox]"
    page.wait_for_selector(box, timeout=10_000)
    page.wait_for_timeout(500)  # the page may select a lone run itself
    if not page.is_checked(box):
        page.click(box)
    wait_for(page, f"(t) => (({DRAWN})(t)?.marks || []).length === 2", LR, timeout=20_000)
    tags = page.evaluate(
        "() => [...document.querySelectorAll('#charts .msmon-chart')].map(e => e.dataset.msmonTag)"
    )
    assert LR in tags and "train/loss" in tags
    for tag in tags:  # every chart carries both marks
        marks = page.evaluate(DRAWN, tag)["marks"]
        assert [(m["step"], m["label"]) for m in marks] == [
            (lr_step, "lr x0.5"),
            (ckpt_step, "checkpoint"),
        ], tag
    # the lr halves right after its mark
    [line] = [d for d in page.evaluate(DRAWN, LR)["lines"] if d["role"] == "line"]
    at = dict(zip(line["xs"], line["ys"], strict=True))
    assert abs(at[lr_step + 1] - lr[lr_step] * 0.5) < 1e-9

    # hovering the lr mark shows who did what
    [mark] = [m for m in page.evaluate(DRAWN, LR)["marks"] if m["label"] == "lr x0.5"]
    box = page.evaluate(
        f"(t) => ({CHART})(t).msmonChart.plot.over.getBoundingClientRect().toJSON()", LR
    )
    page.mouse.move(box["x"] + mark["left"], box["y"] + box["height"] / 2)
    wait_for(page, f"(t) => ({CHART})(t).dataset.markStep === '{lr_step}'", LR)
    tip = page.evaluate(f"(t) => ({CHART})(t).querySelector('.msmon-mark-tip').textContent", LR)
    assert f"step {lr_step}, ctl: lr x0.5: " in tip and "from the next step on" in tip

    # the tables: both interventions, and the checkpoint with its step and size
    rows = page.locator("#interventions tbody tr")
    assert rows.count() == 2
    assert page.locator("#interventions tr[data-what='checkpoint'][data-ok='true']").count() == 1
    ckpt = page.locator(f"#checkpoints tr[data-step='{ckpt_step}']")
    assert ckpt.count() == 1
    size = (mon.run_dir / "checkpoints" / f"step_{ckpt_step}.ckpt").stat().st_size
    assert f"{size / 1e6:.3g}" in ckpt.inner_text() or "MB" in ckpt.inner_text()
    assert f"checkpoints/step_{ckpt_step}.ckpt" in ckpt.inner_text()
    assert not problems, problems
