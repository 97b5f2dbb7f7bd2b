"""msmon_nb installed from its wheel into a fresh venv, used from outside the source tree."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import textwrap
import urllib.request
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from msmon_nb.vscode_init import TEMPLATES, parse_jsonc
from tests.conftest import ROOT
from tests.install.conftest import Venv

pytestmark = pytest.mark.slow
PACKAGE = ROOT / "msmon_nb"


def package_files() -> set[str]:
    """Every file of the package in this tree, as wheel paths (caches left out)."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def zf_text(wheel, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name).decode()


def test_the_wheel_holds_every_package_file_and_says_what_it_needs(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (meta_name,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(meta_name).decode())
    missing = package_files() - names
    assert not missing, f"not in the wheel (pyproject package-data?): {sorted(missing)}"
    assert {f"msmon_nb/vscode_templates/{name}" for name in TEMPLATES} <= names
    assert not [n for n in names if n.startswith(("tests/", "vscode/", "bench/"))]
    assert set(meta["Requires-Python"].split(",")) == {">=3.10", "<3.13"}
    assert meta["License-Expression"] == "Apache-2.0"
    assert any(r.startswith("mindspore") for r in meta.get_all("Requires-Dist"))
    # the viewer in JupyterLab's launcher: the entry point jupyter-server-proxy reads, and
    # the extra that installs it
    assert "jupyter" in meta.get_all("Provides-Extra")
    (entry_name,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
    entry_points = zf_text(wheel, entry_name)
    assert "[jupyter_serverproxy_servers]" in entry_points
    assert "msmon = msmon_nb.viewer.jupyter:setup_msmon_view" in entry_points


def test_msmon_nb_is_imported_from_the_fresh_venv(venv: Venv):
    code = textwrap.dedent("""
        import json, sys, importlib.metadata as md, msmon_nb
        dist = md.distribution("msmon_nb")
        print(json.dumps({"file": msmon_nb.__file__, "path": sys.path,
                          "direct_url": dist.read_text("direct_url.json"),
                          "prefix": sys.prefix, "base": sys.base_prefix}))
    """)
    facts = json.loads(venv.run("import msmon_nb", "python", "-c", code).stdout)
    assert Path(facts["file"]).is_relative_to(venv.prefix), facts["file"]
    assert not Path(facts["file"]).resolve().is_relative_to(ROOT)
    assert not [p for p in facts["path"] if p and Path(p).resolve().is_relative_to(ROOT)]
    assert facts["prefix"] == str(venv.prefix) and facts["base"] != facts["prefix"]
    assert "editable" not in (facts["direct_url"] or "")  # installed from the wheel file


def test_vscode_init_from_the_wheel(venv: Venv):
    project = venv.work / "project"
    proc = venv.run("msmon vscode init", "msmon", "vscode", "init", str(project))
    assert proc.stdout.count("created ") == len(TEMPLATES), proc.stdout
    for name in TEMPLATES:
        text = (project / ".vscode" / name).read_text()
        assert text == (ROOT / "vscode" / name).read_text()
        assert isinstance(parse_jsonc(text), dict)


def wait_for_line(proc: subprocess.Popen, pattern: re.Pattern, lines: list[str]) -> re.Match:
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if found := pattern.search(lines[-1]):
            return found
    raise AssertionError(f"the viewer ended without {pattern.pattern!r}: {lines}")


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status, resp.read()


def test_demo_then_the_viewer_serves_it(venv: Venv):
    base = venv.work / "summary"
    demo = venv.run("msmon demo --no-view --steps 30", "msmon", "demo", "--no-view",
                    "--steps", "30", "--dir", str(base), timeout=600)  # fmt: skip
    assert f"run written to {base}" in demo.stdout and "30 steps" in demo.stdout, demo.stdout
    proc = subprocess.Popen(
        [str(venv.prefix / "bin" / "msmon"), "view", str(base), "--host", "127.0.0.1",
         "--port", "0"],
        cwd=venv.work, env=venv.env, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        lines: list[str] = []
        url = wait_for_line(proc, re.compile(r"^msmon view: serving .* at (http://\S+)"), lines)[1]
        assert url.startswith("http://127.0.0.1:")
        status, page = get(url)
        assert status == 200 and b"<html" in page.lower()
        # app, css, chart.js, heatmap.js and uPlot, all relative (the page works under a
        # proxy's prefix), and each served from the installed package
        assets = re.findall(rb'(?:src|href)="(?!data:)([^"]+)"', page)
        assert sorted(assets) == sorted(
            [b"app.css", b"app.js", b"vendor/chart.css", b"vendor/chart.js", b"vendor/heatmap.js",
             b"vendor/uPlot.iife.min.js", b"vendor/uPlot.min.css"]
        ), assets  # fmt: skip
        for asset in assets:
            status, body = get(url + asset.decode())
            assert status == 200 and body, asset
        status, body = get(url + "api/runs")
        (run,) = json.loads(body)
        assert run["status"] == "finished" and run["last_step"] == 29
        assert "train/loss" in run["tags"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


KERNEL_DRIVER = '''
import json, sys
from jupyter_client.manager import start_new_kernel

name, base = sys.argv[1], sys.argv[2]
cells = [
    "import sys, msmon_nb; print(sys.executable); print(msmon_nb.__file__)",
    """import os
os.environ["GLOG_v"] = "3"
import mindspore as ms, numpy as np
from mindspore import nn
import msmon_nb as mm
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype(np.float32); y = (x[:, 0] > 0).astype(np.int32)
net = nn.SequentialCell([nn.Dense(8, 8), nn.ReLU(), nn.Dense(8, 2)])
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
opt = nn.SGD(net.trainable_params(), 0.05)
grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
%load_ext msmon_nb""",
    f"""%%msmonitor --dir {base} --run wheel --no-panel
for i in range(5):
    loss, grads = grad_fn(ms.Tensor(x[:32]), ms.Tensor(y[:32]))
    opt(grads)""",
    "print(mm.last_run().scalars('train/loss').steps.tolist())",
]
km, kc = start_new_kernel(kernel_name=name, startup_timeout=120)
results = []
try:
    for code in cells:
        out = []
        def hook(msg, out=out):
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                out.append("\\n".join(content["traceback"]))
        reply = kc.execute_interactive(code, output_hook=hook, timeout=300)
        results.append({"status": reply["content"]["status"], "out": "".join(out)})
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
print(json.dumps(results))
'''


def test_kernel_install_then_load_ext_in_that_kernel(venv: Venv):
    name = "msmon-wheel-test"
    proc = venv.run("msmon kernel install", "msmon", "kernel", "install", "--name", name,
                    "--display-name", "msmon wheel test")  # fmt: skip
    spec_dir = Path(venv.env["JUPYTER_DATA_DIR"]) / "kernels" / name
    assert str(spec_dir) in proc.stdout, proc.stdout
    # the anywidget wheel put its front end where VS Code's notebooks look for it
    widgets = venv.prefix / "share" / "jupyter" / "nbextensions" / "anywidget"
    assert f"VS Code finds the panel's widget code in {widgets}" in proc.stdout, proc.stdout
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert Path(spec["argv"][0]) == venv.python and spec["display_name"] == "msmon wheel test"
    driver = venv.work / "kernel_driver.py"
    driver.write_text(KERNEL_DRIVER)
    base = venv.work / "nb_summary"
    out = venv.run("kernel: %load_ext + %%msmonitor", "python", str(driver), name, str(base),
                   timeout=600)  # fmt: skip
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert [r["status"] for r in results] == ["ok"] * 4, results
    executable, module_file = results[0]["out"].split()
    assert Path(executable) == venv.python
    assert Path(module_file).is_relative_to(venv.prefix)
    assert results[3]["out"].strip() == "[0, 1, 2, 3, 4]", results
