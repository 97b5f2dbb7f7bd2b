"""The VSCode tasks in a real VS Code (code-server), driven by Playwright in headless Chromium.

code-server is not a Python dependency and its npm install builds native modules (about 3
minutes here): ``tests/vscode/install_code_server.sh DIR`` installs it (CI does, see
``.ci/run``); point ``MSMON_CODE_SERVER`` at ``DIR/node_modules/.bin/code-server`` (or put
code-server on PATH) and run ``pytest tests/vscode/test_code_server.py``. Without it the
tests skip, except under CI, where they fail.

Microsoft's Python extensions (``ms-python.python``, ``ms-python.debugpy``) come from the VS
Code Marketplace or Open VSX, neither reachable here, so ``python_stub/`` stands in for what
the presets use: the command ``python.interpreterPath`` (``python.defaultInterpreterPath``
from the project's settings, which ``msmon vscode init`` sets to
``${workspaceFolder}/.venv/bin/python``), and the ``debugpy`` debug type, served as that
extension serves it, by the debugpy package's own adapter (``python -m debugpy.adapter``).

A ``preLaunchTask`` waits until its task is done; for ``msmon: clean + viewer`` that is when
the viewer task's background problem matcher has seen its end pattern. The test adds a task
that depends on ``msmon: clean + viewer`` and writes a file: VS Code starts it only after
the matcher reported the viewer ready, exactly when a debug session would start.

The presets are checked against VS Code's own schemas where VS Code applies them: opened in
its editor, the stub (with ``MSMON_STUB_DIAGNOSTICS``) writes every diagnostic VS Code holds,
what the Problems view lists. The stub declares debugpy's launch attributes and the Python
and Jupyter settings the presets use, copied from those extensions' manifests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from msmon_nb.vscode_init import parse_jsonc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CODE_SERVER = os.environ.get("MSMON_CODE_SERVER") or shutil.which("code-server")
# set by .ci/run, which installs code-server while the other tests run: "ok" or why not
INSTALL_STATUS = os.environ.get("MSMON_CODE_SERVER_STATUS")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--headless=new", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]  # fmt: skip
PROBE = "msmon test: after clean + viewer"
USER_SETTINGS = {
    "workbench.startupEditor": "none",
    "workbench.tips.enabled": False,
    "workbench.welcomePage.walkthroughs.openOnInstall": False,
    "extensions.ignoreRecommendations": True,
    "security.workspace.trust.enabled": False,
    "task.autoDetect": "off",
    "telemetry.telemetryLevel": "off",
    "update.mode": "none",
}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CODE_SERVER and not os.environ.get("CI"),
        reason="no code-server (MSMON_CODE_SERVER unset; CI installs it)",
    ),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no chromium"),
]


@pytest.fixture(autouse=True, scope="module")
def code_server_installed() -> None:
    """Under CI, wait for .ci/run's install of code-server to end (within the test timeout)."""
    if not INSTALL_STATUS:
        return
    status = Path(INSTALL_STATUS)
    deadline = time.monotonic() + 500
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(2)
    assert status.exists(), "code-server's install did not end in time"
    assert status.read_text().strip() == "ok", status.read_text()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stub_vsix(out: Path) -> Path:
    """``python_stub/`` packed as a .vsix (a zip with a manifest), as ``vsce`` would."""
    manifest = json.loads((HERE / "python_stub" / "package.json").read_text())
    identity = (
        f'<Identity Language="en-US" Id="{manifest["name"]}" Version="{manifest["version"]}" '
        f'Publisher="{manifest["publisher"]}"/>'
    )
    vsixmanifest = (
        '<?xml version="1.0" encoding="utf-8"?>\n<PackageManifest Version="2.0.0" '
        'xmlns="http://schemas.microsoft.com/developer/vsx-schema/2011"><Metadata>'
        f"{identity}<DisplayName>{manifest['displayName']}</DisplayName>"
        '<Properties><Property Id="Microsoft.VisualStudio.Code.Engine" '
        f'Value="{manifest["engines"]["vscode"]}"/></Properties></Metadata>'
        '<Installation><InstallationTarget Id="Microsoft.VisualStudio.Code"/></Installation>'
        '<Dependencies/><Assets><Asset Type="Microsoft.VisualStudio.Code.Manifest" '
        'Path="extension/package.json" Addressable="true"/></Assets></PackageManifest>'
    )
    types = (
        '<?xml version="1.0" encoding="utf-8"?><Types xmlns="http://schemas.openxmlformats.org/'
        'package/2006/content-types"><Default Extension=".json" ContentType="application/json"/>'
        '<Default Extension=".js" ContentType="application/javascript"/>'
        '<Default Extension=".vsixmanifest" ContentType="text/xml"/></Types>'
    )
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("extension.vsixmanifest", vsixmanifest)
        zf.writestr("[Content_Types].xml", types)
        for name in ("package.json", "extension.js"):
            zf.write(HERE / "python_stub" / name, f"extension/{name}")
    return out


def make_project(root: Path, viewer_port: int, never_ready: bool) -> Path:
    """A project after ``msmon vscode init``, its .venv this venv, plus the probe task.

    ``never_ready``: the viewer task's end pattern can never match (the control case).
    """
    project = root / "project"
    project.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "msmon_nb.cli", "vscode", "init", str(project)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert proc.stdout.count("created") == 4
    (project / ".venv").symlink_to(Path(sys.prefix))
    tasks_file = project / ".vscode" / "tasks.json"
    tasks = parse_jsonc(tasks_file.read_text())
    (viewer,) = (t for t in tasks["tasks"] if t["label"] == "msmon: viewer")
    # the only change to msmon's tasks: a free port, not 8080 (other viewers may run here)
    viewer["args"][viewer["args"].index("8080")] = str(viewer_port)
    if never_ready:
        viewer["problemMatcher"]["background"]["endsPattern"] = "^never printed$"
    tasks["tasks"].append(
        {
            "label": PROBE,
            "type": "shell",
            "command": f"date +%s.%N > '{project}/ready.txt'",
            "dependsOn": ["msmon: clean + viewer"],
            "problemMatcher": [],
        }
    )
    tasks_file.write_text(json.dumps(tasks, indent=4))
    return project


def start_code_server(root: Path, port: int, project: Path) -> subprocess.Popen:
    data, extensions = root / "data", root / "extensions"
    (data / "User").mkdir(parents=True)
    (data / "User" / "settings.json").write_text(json.dumps(USER_SETTINGS))
    config = root / "config.yaml"
    config.write_text(f"bind-addr: 127.0.0.1:{port}\nauth: none\ncert: false\n")
    common = ["--config", str(config), "--user-data-dir", str(data),
              "--extensions-dir", str(extensions)]  # fmt: skip
    subprocess.run(
        [CODE_SERVER, *common, "--install-extension", str(stub_vsix(root / "stub.vsix"))],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    with open(root / "code-server.log", "w") as log:
        proc = subprocess.Popen(
            [CODE_SERVER, *common, "--disable-telemetry", "--disable-update-check",
             "--disable-workspace-trust", "--disable-getting-started-override", str(project)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env=dict(os.environ, GLOG_v="3", MSMON_STUB_READY=str(root / "stub-ready"),
                     MSMON_STUB_DIAGNOSTICS=str(root / "diagnostics.json")),
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
            return proc
        except OSError:
            time.sleep(0.3)
    raise AssertionError((root / "code-server.log").read_text())


@contextlib.contextmanager
def code_server_page(root: Path, port: int, project: Path) -> Iterator[tuple[Any, Any]]:
    """(browser, page): code-server on ``project`` open in Chromium, its extension host up."""
    from playwright.sync_api import sync_playwright

    server = start_code_server(root, port, project)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            try:
                page.goto(f"http://127.0.0.1:{port}/?folder={project}")
                page.locator(".monaco-workbench .statusbar").wait_for(timeout=90_000)
                # the extension host is up and the stub has registered its parts (a cold
                # machine takes far longer than a warm one: no fixed sleep)
                deadline = time.monotonic() + 120
                while not (root / "stub-ready").exists():
                    assert time.monotonic() < deadline, diagnosis(root, page)
                    time.sleep(0.2)
                yield browser, page
            finally:
                browser.close()
    finally:
        stop(server)


def diagnosis(root: Path, page) -> str:
    """What a failed wait shows: notifications, the terminal, code-server's logs' tails."""
    parts = []
    with contextlib.suppress(Exception):
        page.screenshot(path=str(root / "failed.png"))
        notes = page.locator(".notifications-toasts, .notification-list-item").all_inner_texts()
        parts.append("notifications: " + " | ".join(notes))
        parts.append("terminal: " + " | ".join(page.locator(".xterm-rows").all_inner_texts()))
    logs = [root / "code-server.log", *sorted((root / "data" / "logs").rglob("*.log"))]
    for log in logs:
        with contextlib.suppress(OSError):
            parts.append(f"--- {log.relative_to(root)}\n" + log.read_text()[-1500:])
    return "\n".join(parts)


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 15)
        proc.wait(20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, 9)


def run_task(page, label: str) -> None:
    """Terminal > Run Task... > ``label``, as a user picks it."""

    def pick(text: str) -> None:
        rows = page.locator(".quick-input-list .monaco-list-row")
        row = rows.filter(has=page.get_by_text(text, exact=True)).first
        row.wait_for(timeout=30_000)
        row.click()

    page.keyboard.press("F1")
    box = page.locator(".quick-input-widget input")
    box.wait_for(state="visible", timeout=30_000)
    box.fill(">Tasks: Run Task")
    pick("Tasks: Run Task")
    box.fill(label)
    pick(label)


def viewer_runs(port: int) -> list:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=5) as resp:
        return json.load(resp)


@pytest.mark.parametrize("never_ready", [False, True], ids=["as_shipped", "control"])
def test_clean_and_viewer_task_in_code_server(tmp_path, never_ready):
    """As shipped: ready soon after the viewer answers. Control: a matcher that never sees
    its end pattern keeps the dependent task waiting although the viewer answers."""
    viewer_port, server_port = free_port(), free_port()
    project = make_project(tmp_path, viewer_port, never_ready)
    ready = project / "ready.txt"
    with code_server_page(tmp_path, server_port, project) as (_browser, page):
        started = time.time()
        run_task(page, PROBE)
        answered = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if answered is None:
                try:
                    assert viewer_runs(viewer_port) == []  # clean ran, viewer serves
                    answered = time.time()
                    if never_ready:
                        deadline = time.monotonic() + 15
                except OSError:
                    pass
            # the probe may run within one poll of the viewer's first answer: ask it first
            if answered is not None and ready.exists():
                break
            time.sleep(0.2)
        page.screenshot(path=str(tmp_path / "vscode.png"))
        assert answered is not None, "the viewer task never answered\n" + diagnosis(tmp_path, page)
        assert "Could not resolve" not in page.content()
        if never_ready:
            assert not ready.exists(), "the probe did not wait for the matcher"
        else:
            assert ready.exists(), "the task after clean + viewer never started"
            waited = float(ready.read_text()) - started
            print(f"viewer answered after {answered - started:.1f} s, ready (the "
                  f"dependent task ran) after {waited:.1f} s")  # fmt: skip
            assert 0 < waited < 60, waited
    # code-server's pty host takes the viewer task's process down with it
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            viewer_runs(viewer_port)
        except OSError:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("the viewer outlived code-server")


TRAIN_SCRIPT = """import time
import mindspore as ms
from mindspore import nn
import msmon_nb as mm
from tests.support import tiny

x, y = tiny.data()
net = tiny.mlp()
opt = nn.SGD(net.trainable_params(), 0.05)
loss_fn = tiny.loss_fn()
grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
with mm.Monitor(save_dir="summary", run_name="debugged") as mon, mon.watch():
    for a, b in tiny.batches(x, y, steps=100000):
        loss, grads = grad_fn(a, b)
        opt(grads)
        time.sleep(0.01)
open("ended.txt", "w").write(mon.status)
"""


def command(page, name: str) -> None:
    """F1, then the command ``name``, as a user runs it."""
    page.keyboard.press("F1")
    box = page.locator(".quick-input-widget input")
    box.wait_for(state="visible", timeout=30_000)
    box.fill(">" + name)
    rows = page.locator(".quick-input-list .monaco-list-row")
    rows.filter(has=page.get_by_text(name, exact=True)).first.click(timeout=30_000)


def test_launch_preset_debugs_a_script_the_viewer_shows_live_and_stops(tmp_path):
    """ "msmon: debug current file" on train.py: the preLaunchTask starts the viewer, the
    script runs under the debugger, the viewer lists its run live, and the viewer's Stop
    button ends it at a step boundary (status stopped)."""

    viewer_port, server_port = free_port(), free_port()
    project = make_project(tmp_path, viewer_port, never_ready=False)
    (project / "train.py").write_text(TRAIN_SCRIPT)
    settings = project / ".vscode" / "launch.json"
    launch = parse_jsonc(settings.read_text())
    (current,) = (c for c in launch["configurations"] if c["name"] == "msmon: debug current file")
    current["env"]["PYTHONPATH"] = str(ROOT)  # the script imports tests.support.tiny
    settings.write_text(json.dumps(launch, indent=4))
    with code_server_page(tmp_path, server_port, project) as (browser, page):
        command(page, "Go to File...")
        page.locator(".quick-input-widget input").fill("train.py")
        rows = page.locator(".quick-input-list .monaco-list-row")
        rows.filter(has_text="train.py").first.click(timeout=30_000)
        page.locator('.tab[data-resource-name="train.py"]').wait_for(timeout=30_000)
        command(page, "Debug: Start Debugging")
        steps, deadline = [], time.monotonic() + 180
        while time.monotonic() < deadline and len(steps) < 3:
            try:
                runs = [r for r in viewer_runs(viewer_port) if r["name"] == "debugged"]
            except OSError:
                runs = []
            if runs and runs[0]["status"] == "running" and runs[0]["last_step"]:
                steps.append(runs[0]["last_step"])
            time.sleep(1.0)
        page.screenshot(path=str(tmp_path / "vscode-debug.png"))
        assert len(steps) == 3, "the viewer never listed the debugged run running\n" + diagnosis(
            tmp_path, page
        )
        assert steps[0] < steps[1] < steps[2], steps  # live: it advances
        viewer = browser.new_page()
        viewer.goto(f"http://127.0.0.1:{viewer_port}/")
        controls = '.control-row[data-run="debugged"]'
        viewer.wait_for_selector(controls, timeout=30_000)
        viewer.click(f'{controls} button[data-cmd="stop"]')
        ended = project / "ended.txt"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not ended.exists():
            time.sleep(0.3)
        assert ended.exists(), "the debugged script did not end after Stop"
        assert ended.read_text() == "stopped"
        deadline, status = time.monotonic() + 15, None  # the viewer re-reads the marker
        while time.monotonic() < deadline and status != "stopped":
            (run,) = (r for r in viewer_runs(viewer_port) if r["name"] == "debugged")
            status = run["status"]
            time.sleep(0.3)
        assert status == "stopped"


# One mistake per preset file, each of a kind VS Code's schema for that file must catch: a
# task's boolean given as a string; a debugpy attribute of the wrong type (caught only with
# debugpy's configurationAttributes); a Python setting of the wrong type (caught only with
# ms-python.python's configuration); an extension id that is not one.
BREAKS = {
    "tasks.json": ('"isBackground": true', '"isBackground": "yes"'),
    "launch.json": ('"subProcess": true', '"subProcess": "yes"'),
    "settings.json": (
        '"python.terminal.activateEnvironment": true',
        '"python.terminal.activateEnvironment": "yes"',
    ),
    "extensions.json": ('"ms-python.python"', '"ms python"'),
}


def diagnostics(root: Path) -> dict[str, list[dict]]:
    """path -> the diagnostics VS Code holds for it, as the stub last wrote them."""
    try:
        listed = json.loads((root / "diagnostics.json").read_text())
    except (OSError, ValueError):
        return {}
    return {entry["path"]: entry["diagnostics"] for entry in listed if entry["diagnostics"]}


def open_file(page, relative: str) -> None:
    """Go to File... ``relative``, as a user opens it (its editor validates it)."""
    name = relative.rsplit("/", 1)[-1]
    command(page, "Go to File...")
    page.locator(".quick-input-widget input").fill(relative)
    rows = page.locator(".quick-input-list .monaco-list-row")
    rows.filter(has_text=name).first.click(timeout=30_000)
    page.locator(f'.tab[data-resource-name="{name}"]').first.wait_for(timeout=30_000)


def test_presets_pass_vs_code_schemas_and_the_matcher_files_the_viewer_error(tmp_path):
    """The presets as ``msmon vscode init`` installs them, opened in VS Code: no schema
    warning in any of them (a copy with one mistake per file shows one in each, so the check
    can fail), and the viewer task's problem matcher puts a real ``msmon view`` error in the
    Problems view: an error, its message, on the summary dir it names."""
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(
        [sys.executable, "-m", "msmon_nb.cli", "vscode", "init", str(project)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (project / ".venv").symlink_to(Path(sys.prefix))
    files = {name: project / ".vscode" / name for name in BREAKS}
    shipped = {name: path.read_text() for name, path in files.items()}
    for name, (good, bad) in BREAKS.items():
        assert shipped[name].count(good) == 1, (name, good)
        files[name].write_text(shipped[name].replace(good, bad))
    paths = {str(path): name for name, path in files.items()}
    with code_server_page(tmp_path, free_port(), project) as (_browser, page):
        for name in BREAKS:
            open_file(page, f".vscode/{name}")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and set(paths) - set(diagnostics(tmp_path)):
            time.sleep(0.3)
        found = diagnostics(tmp_path)
        print("broken copy:", json.dumps({paths.get(k, k): v for k, v in found.items()}))
        for path, name in paths.items():
            assert path in found, (name, "no diagnostic for its mistake", found)
            assert any(d["severity"] in ("Warning", "Error") for d in found[path]), found[path]

        for name, path in files.items():  # as shipped: VS Code re-validates each open file
            path.write_text(shipped[name])
        clean_since, deadline = None, time.monotonic() + 90
        while time.monotonic() < deadline:
            left = {paths[k]: v for k, v in diagnostics(tmp_path).items() if k in paths}
            if left:
                clean_since = None
            elif clean_since is None:
                clean_since = time.monotonic()
            elif time.monotonic() - clean_since > 5:
                break
            time.sleep(0.3)
        page.screenshot(path=str(tmp_path / "presets.png"))
        assert not left, f"VS Code finds problems in the presets as shipped: {left}"
        assert clean_since is not None

        # the viewer task on a port another program holds: msmon view's real error line
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            other.listen()
            port = other.getsockname()[1]
            tasks = parse_jsonc(shipped["tasks.json"])
            (viewer,) = (t for t in tasks["tasks"] if t["label"] == "msmon: viewer")
            viewer["args"][viewer["args"].index("8080")] = str(port)  # the only change
            files["tasks.json"].write_text(json.dumps(tasks, indent=4))
            (project / "summary").mkdir()
            run_task(page, "msmon: viewer")
            summary = str(project / "summary")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and summary not in diagnostics(tmp_path):
                time.sleep(0.3)
            page.screenshot(path=str(tmp_path / "matcher.png"))
        problems = diagnostics(tmp_path).get(summary)
        assert problems, "no problem filed on the summary dir\n" + diagnosis(tmp_path, page)
        (problem,) = problems
        print("viewer error as VS Code files it:", problem)
        assert problem["severity"] == "Error" and problem["source"] == "msmon view"
        assert problem["message"].startswith(f"cannot listen on 127.0.0.1:{port}")
        assert "--port" in problem["message"]
