"""%%msmonitor in a real kernel: notebooks, errors, reruns, line forms, show, last_run."""

import os
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from msmon_nb.events.runs import load_run, load_runs
from tests.support.kernel_code import SETUP

ROOT = Path(__file__).resolve().parents[2]


STEP = "    loss, grads = grad_fn(ms.Tensor(x[:32]), ms.Tensor(y[:32]))\n    opt(grads)"


def loop(header: str, steps: int) -> str:
    """A %%msmonitor cell training ``steps`` steps."""
    return f"{header}\nfor i in range({steps}):\n{STEP}"


def run_cells(cells, cwd, allow_errors=False, timeout=300):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    return nb


def text_of(cell):
    out = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            out.append(o.text)
        elif o.output_type in ("execute_result", "display_data"):
            out.append(str(o.data.get("text/plain", "")))
        elif o.output_type == "error":
            out.append("\n".join(o.traceback))
    return "\n".join(out)


def widget_views(cell):
    return [
        o
        for o in cell.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]


def pictures(cell):
    return [o for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]


@pytest.mark.parametrize("name", ["quickstart.ipynb", "model_train.ipynb"])
def test_shipped_notebooks_execute(tmp_path, name):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    os.environ["MSMON_SAVE_DIR"] = str(tmp_path)
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    finally:
        os.environ.pop("MSMON_SAVE_DIR")
    (run,) = load_runs(tmp_path)
    assert run.status == "finished"
    monitored = next(
        c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%msmonitor")
    )
    # nbclient renders no widgets: a cell longer than 3 s falls back to pictures; either
    # way the saved notebook keeps a picture of the panel
    assert pictures(monitored), "the saved notebook should keep a picture of the panel"
    assert len(run.scalars("train/loss").steps) == 80
    assert np.all(run.scalars("train/grad_norm").values > 0)
    if name == "quickstart.ipynb":
        assert "loss equal to the loop's: True" in text_of(nb.cells[5])


def test_points_equal_what_the_loop_saw_and_var_expansion(tmp_path):
    nb = run_cells(
        [
            SETUP,
            f"BASE = {str(tmp_path)!r}\nNAME = 'expanded'\nFREQ = 1",
            "%%msmonitor --dir $BASE --run $NAME --freq $FREQ\n"
            "seen = []\n"
            "for i in range(25):\n"
            "    loss, grads = grad_fn(ms.Tensor(x[:32]), ms.Tensor(y[:32]))\n"
            "    norm = sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads)\n"
            "    seen.append((float(loss.asnumpy()), float(np.sqrt(norm))))\n"
            "    opt(grads)",
            "r = mm.last_run(); print(r.name, r.status)\n"
            "print(np.allclose(r.scalars('train/loss').values, [s[0] for s in seen]),"
            " np.allclose(r.scalars('train/grad_norm').values, [s[1] for s in seen], rtol=1e-4))",
        ],
        tmp_path,
    )
    assert "expanded finished" in text_of(nb.cells[3])
    assert "True True" in text_of(nb.cells[3])


def test_user_error_propagates_with_the_same_traceback(tmp_path):
    body = f"for i in range(5):\n{STEP}\n    if i == 3:\n        1 / 0\n"
    nb = run_cells(
        [SETUP, f"%%msmonitor --dir {tmp_path} --run err --no-panel\n" + body, "# plain\n" + body],
        tmp_path,
        allow_errors=True,
    )
    monitored, plain = nb.cells[1], nb.cells[2]
    err_m = next(o for o in monitored.outputs if o.output_type == "error")
    err_p = next(o for o in plain.outputs if o.output_type == "error")
    assert (
        (err_m.ename, err_m.evalue)
        == (err_p.ename, err_p.evalue)
        == ("ZeroDivisionError", "division by zero")
    )
    tb = "\n".join(err_m.traceback)
    assert "line 6" in tb  # the cell line a user sees (line 1 is the magic)
    assert "msmon_nb" not in tb and "exec(code" not in tb
    assert load_run(tmp_path / "err").status == "interrupted"


def test_rerun_makes_new_runs_and_leaks_no_threads(tmp_path):
    cell = loop(f"%%msmonitor --dir {tmp_path} --no-panel", 5)
    count = (
        "import threading, os; print(threading.active_count(), len(os.listdir('/proc/self/fd')))"
    )
    nb = run_cells([SETUP, cell, count, cell, cell, cell, count], tmp_path)
    first = [int(v) for v in text_of(nb.cells[2]).split()]
    last = [int(v) for v in text_of(nb.cells[6]).split()]
    assert last[0] == first[0], "writer threads must be joined"
    assert last[1] <= first[1], "file handles must be closed"
    assert len(load_runs(tmp_path)) == 4


def test_help_and_line_forms(tmp_path):
    nb = run_cells(
        [
            SETUP,
            "print(get_ipython().find_cell_magic('msmonitor').__doc__)\n%msmonitor?",
            "%msmonitor status",
            loop(f"%%msmonitor --dir {tmp_path} --run lines --no-panel", 3),
            "%msmonitor status",
            "%msmonitor freq 5",
            "%msmonitor bogus",
            loop(f"%%msmonitor --dir {tmp_path / 'named'} --no-panel", 2),
        ],
        tmp_path,
        allow_errors=True,
    )
    help_text = text_of(nb.cells[1])
    for option in ("--dir", "--run", "--freq", "--config", "--break-on", "--no-panel"):
        assert option in help_text, option
    # the default run name is what the help says it is
    assert "default run_<date>_<time>" in " ".join(help_text.split())
    (named,) = [p.name for p in (tmp_path / "named").iterdir()]
    assert re.fullmatch(r"run_\d{8}_\d{6}", named), named
    assert "no monitored cell" in text_of(nb.cells[2])
    assert "run lines (finished)" in text_of(nb.cells[4])
    assert "no monitored training is running" in text_of(nb.cells[5])
    assert "unknown command" in text_of(nb.cells[6])


def test_show_draws_a_mindspore_written_run(tmp_path):
    code = (
        "from mindspore.train.summary import SummaryRecord\n"
        f"with SummaryRecord({str(tmp_path / 'ms_run')!r}) as sr:\n"
        "    for s in range(1, 30):\n"
        "        sr.add_value('scalar', 'loss', ms.Tensor(np.float32(1.0 / s)))\n"
        "        sr.record(s)\n"
        f"w = mm.show({str(tmp_path / 'ms_run')!r})\n"
        "print(len(w.static_png) > 1000, w.panel.state)\n"
        "w"
    )
    nb = run_cells([SETUP, code], tmp_path)
    assert "True finished" in text_of(nb.cells[1])
    assert widget_views(nb.cells[1]) and pictures(nb.cells[1])


def test_without_a_widget_front_end_the_panel_falls_back_to_pictures(tmp_path):
    """nbclient renders no widgets: no hello comes back, so after 3 s the kernel draws."""
    nb = run_cells(
        [
            SETUP,
            loop(f"%%msmonitor --dir {tmp_path} --run nofront", 120) + "\n    time.sleep(0.04)",
        ],
        tmp_path,
    )
    cell = nb.cells[1]
    assert text_of(cell).count("did not load the panel's widget code within 3 s") == 1
    shown = pictures(cell)
    assert shown and not widget_views(cell)
    assert len(shown[0]["data"]["image/png"]) > 10_000


def test_config_file_option(tmp_path):
    cfg = tmp_path / "m.yaml"
    cfg.write_text(f"monitor_config:\n  save_dir: {tmp_path}\n  log_interval: 2\n")
    nb = run_cells(
        [
            SETUP,
            loop(f"%%msmonitor --config {cfg} --run fromyaml --no-panel", 6),
        ],
        tmp_path,
    )
    assert "Error" not in text_of(nb.cells[1])
    assert load_run(tmp_path / "fromyaml").scalars("train/loss").steps.tolist() == [0, 2, 4]


def test_kernel_install_registers_this_interpreter(tmp_path):
    import json
    import subprocess
    import sys

    env = dict(os.environ, JUPYTER_DATA_DIR=str(tmp_path / "jdata"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "msmon_nb.cli",
            "kernel",
            "install",
            "--name",
            "msmon-test",
            "--display-name",
            "MS test",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    spec = json.loads((tmp_path / "jdata" / "kernels" / "msmon-test" / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable
    assert spec["display_name"] == "MS test"
    assert "msmon-test" in proc.stdout


def reopen_outputs(cell):
    return [
        o
        for o in cell.get("outputs", [])
        if "msmon-reopen" in o.get("data", {}).get("text/html", "")
    ]


@pytest.mark.parametrize("vscode", [False, True])
def test_the_reopen_picture_sits_below_the_panel_outside_vs_code(tmp_path, monkeypatch, vscode):
    """Right below the panel, an output holds the final picture for a notebook reopened
    without widget state (shown by the page only then: tests/notebook/test_live_browser);
    VS Code, which keeps no widget state and lays outputs out its own way, gets none."""
    if vscode:  # what VS Code's Jupyter extension sets in the kernels it starts
        monkeypatch.setenv("PYDEVD_IPYTHON_COMPATIBLE_DEBUGGING", "1")
    nb = run_cells([SETUP, loop(f"%%msmonitor --dir {tmp_path} --run reopen", 30)], tmp_path)
    outputs = nb.cells[1]["outputs"]
    extra = reopen_outputs(nb.cells[1])
    if vscode:
        assert not extra
        return
    assert len(extra) == 1
    assert outputs.index(extra[0]) == outputs.index(widget_views(nb.cells[1])[0]) + 1
    html = extra[0]["data"]["text/html"]
    assert 'src="data:image/png;base64,' in html and " hidden>" in html
    assert f"msmon view {tmp_path}" in html
