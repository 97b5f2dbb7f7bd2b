"""``msmon doctor``: is this environment able to monitor MindSpore training?

Every check is a frozen ``Check(name, status, value, detail, fix)``; the report exits 1
when one of them fails (something blocks monitoring). MindSpore is imported only in a
subprocess: a broken install can crash or hang the importing process, and a clean one
takes seconds to import, which the other checks need not wait for (they run meanwhile).

The subprocess also looks at what training processes see and this one cannot: the
protobuf implementation once ``import mindspore`` has run (it sets
``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python`` when unset), and whether a first
Tensor -> numpy conversion prints NumPy's "compiled using NumPy 1.x" error or MindSpore's
"Numpy init failed" (MindSpore 2.10 is built against NumPy 1.x; under NumPy 2 the
conversion still returns, so only that output tells).

``rundir.facts.quick_facts()`` is the cheap subset recorded in every ``msmon_run.json``
(no subprocess, no kernel scan): the version helpers live there, and this module builds
on them.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from msmon_nb.rundir.facts import (
    NUMPY_FIX,
    dist_version,
    mindspore_brief,
    msmon_version,
    numpy_problem,
    quick_facts,
    version_tuple,
)
from msmon_nb.vscode_init import parse_jsonc

log = logging.getLogger(__name__)

__all__ = ["mindspore_brief", "numpy_problem", "quick_facts", "run_doctor"]

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
_MARKS = {OK: "ok", INFO: "info", WARN: "warn", FAIL: "FAIL"}
MIN_FREE_BYTES = 1 << 30
PROBE_TIMEOUT = 120.0
# what MindSpore built for NumPy 1.x prints under NumPy 2 -> how the report quotes it
_NUMPY2_SIGNS = {
    "compiled using NumPy 1.x": "'A module that was compiled using NumPy 1.x cannot be run in "
    "NumPy 2...'",
    "Numpy init failed": "'Numpy init failed'",
}
_PROBE_TAG = "MSMON_PROBE "
_PYTHON_NAMES = re.compile(r"python(\d+(\.\d+)?)?(\.exe)?$")

_PROBE = f"""
import json, os
out = {{"protobuf_env_before": os.environ.get("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION")}}
import mindspore
out["version"] = getattr(mindspore, "__version__", "unknown")
out["file"] = getattr(mindspore, "__file__", None)
out["device"] = mindspore.get_context("device_target")
out["protobuf_env_after"] = os.environ.get("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION")
from google.protobuf.internal import api_implementation
out["protobuf_implementation"] = api_implementation.Type()
import numpy
try:
    got = (mindspore.Tensor(numpy.array([1.0, 2.0], dtype=numpy.float32)) * 2).asnumpy()
    out["tensor_ok"] = got.tolist() == [2.0, 4.0]
except Exception as exc:
    out["tensor_error"] = f"{{type(exc).__name__}}: {{exc}}"
try:
    from msmon_nb.collect.hooks import ways_in
    out["ways_in"] = ways_in()
except Exception as exc:
    out["ways_in_error"] = f"{{type(exc).__name__}}: {{exc}}"
print({_PROBE_TAG!r} + json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class Check:
    """One line of the report; ``fix`` says what to do whenever ``status`` is warn or fail."""

    name: str
    status: str
    value: str
    detail: str = ""
    fix: str | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def blocking(self) -> bool:
        return self.status == FAIL


@dataclass(frozen=True)
class Report:
    """Every check, in order, and the exit code they add up to."""

    checks: tuple[Check, ...]
    interpreter: str

    @property
    def blocking(self) -> list[Check]:
        return [c for c in self.checks if c.blocking]

    @property
    def exit_code(self) -> int:
        return 1 if self.blocking else 0

    def facts(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for c in self.checks:
            merged.update(c.facts)
        return merged

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.blocking,
            "exit_code": self.exit_code,
            "interpreter": self.interpreter,
            "facts": self.facts(),
            "checks": [{k: v for k, v in asdict(c).items() if k != "facts"} for c in self.checks],
            "problems": [
                {"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix}
                for c in self.checks
                if c.status in (WARN, FAIL)
            ],
        }

    def render(self) -> str:
        """The short aligned table people read; each problem is followed by its fix."""
        width = max(len(c.name) for c in self.checks)
        lines = [f"msmon doctor: {self.interpreter}"]
        for c in self.checks:
            lines.append(f"  {_MARKS[c.status]:<4}  {c.name:<{width}}  {c.value}".rstrip())
            pad = " " * (width + 10)
            if c.status != OK and c.detail:
                lines.extend(
                    textwrap.wrap(c.detail, 100, initial_indent=pad, subsequent_indent=pad)
                )
            if c.status != OK and c.fix:
                lines.append(f"{pad}fix: {c.fix}")
        warns = sum(c.status == WARN for c in self.checks)
        if self.blocking:
            names = ", ".join(c.name for c in self.blocking)
            lines.append(f"{len(self.blocking)} problem(s) block monitoring: {names}")
        else:
            lines.append(f"nothing blocks monitoring ({warns} warning(s))")
        return "\n".join(lines)


# --- the MindSpore probe (subprocess) -------------------------------------------------


@dataclass
class Probe:
    """``import mindspore`` in a child of this interpreter, started early, read later."""

    timeout: float = PROBE_TIMEOUT
    proc: subprocess.Popen[str] | None = None
    installed: bool = False

    def start(self) -> Probe:
        self.installed = find_spec("mindspore") is not None
        if self.installed:
            # GLOG_v=2 keeps "Numpy init failed" (a WARNING) visible even when the
            # user silences MindSpore with GLOG_v=3
            env = dict(os.environ, GLOG_v="2", PYTHONUNBUFFERED="1")
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _PROBE],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        return self

    def result(self) -> dict[str, Any]:
        """``{"installed", "ok", ...probe facts, "error", "numpy_messages"}``."""
        if self.proc is None:
            return {"installed": False, "ok": False}
        try:
            out, err = self.proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return {
                "installed": True,
                "ok": False,
                "error": f"`import mindspore` did not finish in {self.timeout:.0f} s",
            }
        found = [line for line in out.splitlines() if line.startswith(_PROBE_TAG)]
        if not found:
            tail = [line.strip() for line in err.splitlines() if line.strip()]
            error = tail[-1] if tail else f"exit status {self.proc.returncode}"
            return {"installed": True, "ok": False, "error": error}
        data = json.loads(found[-1][len(_PROBE_TAG) :])
        data.update(
            installed=True,
            ok=True,
            numpy_messages=[quote for sign, quote in _NUMPY2_SIGNS.items() if sign in err],
        )
        return data


# --- checks -----------------------------------------------------------------------------


# The Pythons MindSpore 2.7-2.10 publish CPU wheels for, from 3.10 (docs/guide/setup.md, "Python
# versions"); 3.11 is the one the test suite runs on
SUPPORTED_PYTHONS = ((3, 10), (3, 11), (3, 12))


def check_python() -> Check:
    version = platform.python_version()
    facts = {"python": version, "executable": sys.executable, "prefix": sys.prefix}
    if sys.version_info[:2] in SUPPORTED_PYTHONS:
        return Check("python", OK, version, facts=facts)
    return Check(
        "python",
        WARN,
        version,
        "msmon_nb supports Python 3.10-3.12, the Pythons MindSpore 2.7-2.10 publish wheels for",
        "create the environment with Python 3.11 (the one tested here): python3.11 -m venv .venv",
        facts,
    )


def check_msmon() -> Check:
    version = msmon_version()
    where = Path(__file__).resolve().parent
    return Check("msmon_nb", OK, f"{version} ({where})", facts={"msmon_nb": version})


def check_mindspore(probe: dict[str, Any]) -> Check:
    if not probe.get("installed"):
        return Check(
            "mindspore",
            FAIL,
            "not installed",
            "collecting needs MindSpore in this interpreter (viewing and export do not)",
            "pip install 'mindspore>=2.7,<2.11'",
            {"mindspore": None, "device": None},
        )
    if not probe["ok"]:
        return Check(
            "mindspore",
            FAIL,
            "import fails",
            f"`import mindspore` failed: {probe['error']}",
            f"{sys.executable} -c 'import mindspore' shows the whole error; reinstall with "
            "pip install --force-reinstall 'mindspore>=2.7,<2.11'",
            {"mindspore": None, "device": None},
        )
    facts = {
        "mindspore": probe["version"],
        "device": probe["device"],
        "mindspore_path": probe.get("file"),
    }
    value = f"{probe['version']}, device {probe['device']}"
    if probe.get("tensor_error"):
        return Check(
            "mindspore",
            FAIL,
            value,
            f"a first Tensor operation failed: {probe['tensor_error']}",
            f"{sys.executable} -c 'import mindspore; mindspore.run_check()' shows where",
            facts,
        )
    return Check("mindspore", OK, value, facts=facts)


def check_ways_in(probe: dict[str, Any]) -> Check:
    """Which of watch()'s ways in the installed MindSpore offers (``collect.hooks``)."""
    if not probe.get("ok"):
        return Check("ways in", INFO, "unknown", "MindSpore does not import (see above)")
    ways = probe.get("ways_in")
    if ways is None:
        return Check(
            "ways in",
            WARN,
            "unknown",
            f"looking them up failed: {probe.get('ways_in_error')}",
            "reinstall msmon_nb in this interpreter: pip install -e .",
        )
    lines = []
    for name, way in ways.items():
        if not way["available"]:
            mark = "missing"
        elif way.get("absent"):
            mark = "partly (" + ", ".join(way["absent"]) + " absent)"
        else:
            mark = "at " + str(way["where"])
        lines.append(f"{name}: {mark}")
    usable = sum(1 for w in ways.values() if w["available"] and not w.get("absent"))
    value = f"{usable}/{len(ways)} available: " + ", ".join(
        n for n, w in ways.items() if w["available"] and not w.get("absent")
    )
    facts = {"ways_in": {n: bool(w["available"]) for n, w in ways.items()}}
    if usable == len(ways):
        return Check("ways in", OK, value, "; ".join(lines), facts=facts)
    return Check(
        "ways in",
        WARN,
        value,
        "; ".join(lines) + ". A watched loop records what the others observe and warns once "
        "about the rest",
        "mon.step(loss=..., grad_norm=..., lr=...) records it explicitly; or use a "
        "MindSpore msmon_nb supports (2.7 to 2.10)",
        facts,
    )


def check_numpy(probe: dict[str, Any]) -> Check:
    try:
        import numpy
    except ImportError as exc:
        return Check(
            "numpy",
            FAIL,
            "import fails",
            f"msmon_nb and MindSpore need numpy: {exc}",
            NUMPY_FIX,
            {"numpy": None},
        )
    version = numpy.__version__
    facts = {"numpy": version}
    ms_version = probe.get("version")
    reason = numpy_problem(version, ms_version)
    seen = probe.get("numpy_messages") or []
    if seen:
        reason = (
            f"with numpy {version}, MindSpore {ms_version}'s first Tensor->numpy conversion "
            f"printed {' and '.join(seen)}: it is built against NumPy 1.x"
        )
    if reason:
        return Check("numpy", FAIL, version, reason, NUMPY_FIX, facts)
    return Check("numpy", OK, version, facts=facts)


def check_protobuf(probe: dict[str, Any]) -> Check:
    try:
        import google.protobuf
        from google.protobuf.internal import api_implementation
    except ImportError as exc:
        return Check(
            "protobuf",
            FAIL,
            "not installed",
            f"msmon_nb reads and writes summary files with protobuf: {exc}",
            "pip install 'protobuf>=4.21'",
            {"protobuf": None},
        )
    version = google.protobuf.__version__
    here = api_implementation.Type()
    env = os.environ.get("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION")
    facts: dict[str, Any] = {
        "protobuf": version,
        "protobuf_implementation": here,
        "protobuf_implementation_under_mindspore": probe.get("protobuf_implementation"),
    }
    if version_tuple(version) < (4, 21):
        return Check(
            "protobuf",
            FAIL,
            version,
            "msmon_nb's summary schema needs protobuf >= 4.21",
            "pip install 'protobuf>=4.21'",
            facts,
        )
    under_ms = probe.get("protobuf_implementation")
    value = f"{version}, {here} here" + (f", {under_ms} under MindSpore" if under_ms else "")
    if under_ms == "python" and here != "python" and env is None:
        return Check(
            "protobuf",
            INFO,
            value,
            "`import mindspore` sets PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python when it "
            "is unset, so training processes parse protobuf in pure Python (about 7x "
            "slower); msmon's writer encodes scalars itself and does not slow down",
            None,
            facts,
        )
    return Check("protobuf", OK, value, facts=facts)


def _package_check(
    name: str, minimum: tuple[int, ...], why: str, fix: str, missing: str = WARN
) -> Check:
    version = dist_version(name)
    facts = {name: version}
    if version is None:
        return Check(name, missing, "not installed", why, fix, facts)
    if version_tuple(version) < minimum:
        return Check(name, WARN, version, why, fix, facts)
    return Check(name, OK, version, facts=facts)


def check_ipywidgets() -> Check:
    return _package_check(
        "ipywidgets",
        (8,),
        "the live panel is built with ipywidgets 8 (JupyterLab, Notebook 7, VSCode)",
        "pip install 'ipywidgets>=8,<9'",
    )


def check_vscode_widgets(prefix: str | os.PathLike[str] | None = None) -> Check:
    """anywidget's front end where VS Code's notebooks look for it: the kernel
    environment's ``share/jupyter/nbextensions/anywidget/`` (installed with the anywidget
    wheel's data files; a copy that lost them, or a ``--target`` install, has none, and
    VS Code then tries a CDN, which fails offline)."""
    root = Path(prefix if prefix is not None else sys.prefix) / "share" / "jupyter"
    found = root / "nbextensions" / "anywidget"
    files = sorted(p.name for p in found.glob("*.js")) if found.is_dir() else []
    facts = {"path": str(found), "files": files}
    if "index.js" in files or "extension.js" in files:
        return Check("vscode widgets", OK, str(found), facts=facts)
    return Check(
        "vscode widgets",
        WARN,
        "anywidget's front end missing",
        f"VS Code loads the panel's widget code from {found} (nothing there): without it "
        "it tries a CDN, which fails offline",
        "pip install --force-reinstall --no-deps anywidget",
        facts,
    )


def check_ipykernel() -> Check:
    return _package_check(
        "ipykernel",
        (7,),
        "the panel's Pause/Stop/frequency buttons act while a cell runs only with ipykernel >= 7",
        "pip install 'ipykernel>=7'",
    )


def check_jupyterlab() -> Check:
    return _package_check(
        "jupyterlab",
        (4,),
        "only needed to work in JupyterLab (VSCode notebooks need ipykernel alone)",
        "pip install 'jupyterlab>=4'",
        missing=INFO,
    )


def same_interpreter(path: str | os.PathLike[str], executable: str | None = None) -> bool:
    """Whether ``path`` runs this interpreter: same file, or a python* beside it.

    Symlinks are resolved only up to the directory: a venv's ``bin/python`` links to
    the base interpreter, and resolving it would make every venv look like every other.
    """
    exe = Path(executable or sys.executable)
    cand = Path(path)
    if not cand.is_absolute():
        return False
    if os.path.normpath(cand) == os.path.normpath(exe):
        return True
    try:
        same_dir = cand.parent.resolve() == exe.parent.resolve()
    except OSError:
        return False
    return same_dir and bool(_PYTHON_NAMES.match(cand.name)) and cand.exists()


def check_kernel() -> Check:
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        return Check(
            "jupyter kernel",
            WARN,
            "jupyter_client not installed",
            "notebooks need a Jupyter kernel for this interpreter",
            "pip install 'ipykernel>=7' && msmon kernel install",
            {"kernels": []},
        )
    # ensure_native_kernel=False: otherwise jupyter_client invents a "python3" spec for
    # the asking process itself, which no other Jupyter or VSCode would see
    specs = KernelSpecManager(ensure_native_kernel=False).get_all_specs()
    mine: list[str] = []
    bare: list[str] = []
    for name, entry in sorted(specs.items()):
        argv = entry.get("spec", {}).get("argv") or [""]
        if same_interpreter(argv[0]):
            mine.append(name)
        elif _PYTHON_NAMES.match(argv[0]) and Path(entry.get("resource_dir", "")).is_relative_to(
            sys.prefix
        ):
            bare.append(name)
    facts = {"kernels": mine}
    if mine:
        return Check("jupyter kernel", OK, ", ".join(mine), facts=facts)
    detail = f"no registered Jupyter kernel runs {sys.executable}"
    if bare:
        detail += (
            f" (this environment's {', '.join(bare)} runs the python of whichever Jupyter "
            "starts it, so only a Jupyter started from this environment gets it)"
        )
    return Check(
        "jupyter kernel", WARN, "none for this interpreter", detail, "msmon kernel install", facts
    )


def _expand_vscode(value: str, project: Path) -> Path:
    """VSCode's variables in a settings path, relative paths taken from the project."""
    env = os.environ
    text = value.replace("${workspaceFolder}", str(project))
    text = text.replace("${workspaceFolderBasename}", project.name)
    text = text.replace("${userHome}", str(Path.home()))
    text = re.sub(r"\$\{env:([^}]*)\}", lambda m: env.get(m.group(1), ""), text)
    path = Path(text).expanduser()
    return path if path.is_absolute() else project / path


def check_vscode(project: str | os.PathLike[str] | None = None) -> Check:
    root = Path(project or Path.cwd()).absolute()
    settings = root / ".vscode" / "settings.json"
    venv_here = same_interpreter(root / ".venv" / "bin" / "python")
    set_it = f'set "python.defaultInterpreterPath": "{sys.executable}" in {settings}'
    add_fix = f"msmon vscode init {root}" if venv_here else set_it
    facts: dict[str, Any] = {"vscode_settings": str(settings), "vscode_interpreter": None}
    if not settings.is_file():
        return Check(
            "vscode settings",
            INFO,
            f"no {settings}",
            "VSCode will ask which interpreter to use",
            add_fix,
            facts,
        )
    try:
        data = parse_jsonc(settings.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return Check(
            "vscode settings", WARN, "unreadable", f"{settings}: {exc}", "fix the file", facts
        )
    value = data.get("python.defaultInterpreterPath") if isinstance(data, dict) else None
    if not isinstance(value, str) or not value:
        return Check(
            "vscode settings",
            INFO,
            "python.defaultInterpreterPath not set",
            f"{settings} does not say which interpreter to use",
            add_fix,
            facts,
        )
    target = _expand_vscode(value, root)
    if target.is_dir():
        target = target / "bin" / "python"
    facts["vscode_interpreter"] = str(target)
    if same_interpreter(target):
        return Check("vscode settings", OK, f"{value} -> this interpreter", facts=facts)
    return Check(
        "vscode settings",
        WARN,
        f"{value} -> another interpreter",
        f"python.defaultInterpreterPath is {target}, not {sys.executable}: VSCode runs "
        "tasks, the debugger and notebooks elsewhere",
        set_it + (" (`msmon vscode init` never overwrites a setting)" if venv_here else ""),
        facts,
    )


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not os.path.lexists(path) and path != path.parent:  # a dangling link is in the way
        path = path.parent
    return path


def check_base_dir(base_dir: str | os.PathLike[str]) -> tuple[Check, Check]:
    """(writable?, free disk) for the summary base dir or, if missing, where it would go."""
    base = Path(base_dir)
    target = _nearest_existing(base)
    facts: dict[str, Any] = {"base_dir": str(base.absolute()), "base_dir_writable": False}
    fix = (
        f"make {target} writable, or write elsewhere: MonitorConfig(save_dir=...), "
        "%%msmonitor --dir DIR, `msmon doctor --dir DIR` to check it"
    )
    shown = str(base) if target == base.absolute() else f"{base} (would be created in {target})"
    if not target.is_dir():
        return (
            Check("summary dir", FAIL, shown, f"{target} is not a directory", fix, facts),
            Check("disk free", INFO, "-", facts={"disk_free_bytes": None}),
        )
    try:
        fd, name = tempfile.mkstemp(prefix=".msmon_doctor_", dir=target)
        try:
            os.write(fd, b"msmon doctor")
        finally:
            os.close(fd)
            Path(name).unlink()
    except OSError as exc:
        writable = Check(
            "summary dir",
            FAIL,
            shown,
            f"cannot create a file in {target}: {exc.strerror or exc}",
            fix,
            facts,
        )
    else:
        facts["base_dir_writable"] = True
        writable = Check("summary dir", OK, f"{shown}: writable", facts=facts)
    free = shutil.disk_usage(target).free
    disk_facts = {"disk_free_bytes": free}
    text = f"{free / 2**30:.1f} GB free on {target}"
    if free < MIN_FREE_BYTES:
        disk = Check(
            "disk free",
            WARN,
            text,
            "under 1 GB: a long run with snapshots can fill it (writing then stops, "
            "training goes on)",
            "free space, or write runs to another disk (save_dir / --dir)",
            disk_facts,
        )
    else:
        disk = Check("disk free", OK, text, facts=disk_facts)
    return writable, disk


# --- the whole report -------------------------------------------------------------------


def _guarded(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as exc:  # a broken third-party install must not stop the self-check
        log.debug("msmon doctor: check %s crashed", name, exc_info=True)
        return Check(
            name,
            WARN,
            "check crashed",
            f"{type(exc).__name__}: {exc}",
            "reinstall the package it names",
        )


def run_doctor(
    base_dir: str | os.PathLike[str] = "./summary",
    project: str | os.PathLike[str] | None = None,
    timeout: float = PROBE_TIMEOUT,
) -> Report:
    """Run every check; MindSpore's import runs in a subprocess meanwhile."""
    probe = Probe(timeout=timeout).start()
    early = [
        _guarded("python", check_python),
        _guarded("msmon_nb", check_msmon),
    ]
    late = [
        _guarded("ipywidgets", check_ipywidgets),
        _guarded("ipykernel", check_ipykernel),
        _guarded("jupyterlab", check_jupyterlab),
        _guarded("jupyter kernel", check_kernel),
        _guarded("vscode widgets", check_vscode_widgets),
        _guarded("vscode settings", lambda: check_vscode(project)),
    ]
    try:
        late.extend(check_base_dir(base_dir))
    except OSError as exc:
        late.append(Check("summary dir", FAIL, str(base_dir), str(exc), "check the path"))
    found = probe.result()
    middle = [
        _guarded("mindspore", lambda: check_mindspore(found)),
        _guarded("ways in", lambda: check_ways_in(found)),
        _guarded("numpy", lambda: check_numpy(found)),
        _guarded("protobuf", lambda: check_protobuf(found)),
    ]
    return Report(tuple(early + middle + late), sys.executable)
