"""Screenshot the live panel in a real JupyterLab, in headless Chromium, *while* it trains,
and ``msmon view`` on the same run at the same moment.

    python docs/screenshot_panel.py [--out docs/panel.png] [--viewer-out docs/viewer-same-run.png]
                                    [--steps 3000] [--after 12]

Starts JupyterLab on 127.0.0.1 with a throwaway notebook that trains the demo model under
``%%msmonitor``, runs it with Playwright driving Debian's chromium, waits ``--after``
seconds past the first step and captures the panel mid-run; then opens the viewer on the
run's base dir in a second tab and captures its charts. Needs the dev extra (jupyterlab,
playwright) and ``/usr/bin/chromium``. Run from the repository root.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.jupyter_app import jupyter_page, run_all, write_notebook

CELLS = [
    "%load_ext msmon_nb",
    "import os\nos.environ['GLOG_v'] = '3'\nimport mindspore as ms\n"
    "from msmon_nb.demo import batches, build, make_data\n"
    "STEPS = {steps}\ndata = make_data()\nnet, loss_fn, opt = build(steps=STEPS)\n"
    "grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)",
    "%%msmonitor --dir {base} --run demo\n"
    "for x, y in batches(data, 64, STEPS):\n"
    "    loss, grads = grad_fn(x, y)\n"
    "    opt(grads)",
]


ORDER = "() => [...document.querySelectorAll('.msmon-chart')].map((e) => e.dataset.msmonTag)"


def screenshot(
    out: Path, steps: int = 3000, after: float = 12.0, viewer_out: Path | None = None
) -> dict[str, list[str]]:
    """Run the notebook in JupyterLab and save the panel's screenshot, mid-run, to ``out``
    (and the viewer's on the same run to ``viewer_out``); the charts' tags in page order."""
    from msmon_nb.viewer.server import make_server

    order: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cells = [c.format(base=root / "summary", steps=steps) for c in CELLS]
        write_notebook(root / "panel.ipynb", cells)
        with jupyter_page(root, "panel.ipynb", viewport=(1280, 1300)) as page:
            run_all(page)
            page.wait_for_function(
                "/step \\d+/.test(document.querySelector('.msmon-status')?.textContent || '')",
                timeout=180_000,
            )
            time.sleep(after)
            panel = page.locator(".msmon-panel").first
            panel.scroll_into_view_if_needed()
            out.parent.mkdir(parents=True, exist_ok=True)
            panel.screenshot(path=str(out))
            order["panel"] = page.evaluate(ORDER)
            if viewer_out is not None:
                server = make_server(root / "summary", "127.0.0.1", 0)
                server.start()
                try:
                    viewer = page.context.browser.new_page()
                    viewer.set_viewport_size({"width": 1500, "height": 1100})
                    viewer.goto(server.url)
                    viewer.wait_for_function(
                        "() => { const c = document.querySelectorAll('#charts .msmon-chart');"
                        " return c.length >= 5 && [...c].every((e) => +e.dataset.points > 0); }",
                        timeout=30_000,
                    )
                    time.sleep(1.5)
                    order["viewer"] = viewer.evaluate(ORDER)
                    viewer.screenshot(path=str(viewer_out))
                finally:
                    server.stop()
    return order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "panel.png")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--after", type=float, default=12.0)
    parser.add_argument(
        "--viewer-out", type=Path, default=Path(__file__).parent / "viewer-same-run.png"
    )
    args = parser.parse_args()
    order = screenshot(args.out, args.steps, args.after, args.viewer_out)
    print(f"saved {args.out} and {args.viewer_out}; charts: {order}")


if __name__ == "__main__":
    main()
