"""``msmon view`` as a jupyter-server-proxy server: JupyterLab's launcher and ``<lab>/msmon/``.

jupyter-server-proxy (the ``jupyter`` extra) finds ``setup_msmon_view`` through the
``jupyter_serverproxy_servers`` entry point in ``pyproject.toml``, starts the viewer on a
port it picks when the page is first opened, and forwards requests to it behind Jupyter's
own login. This module imports nothing of it: it only describes the process, so
importing msmon_nb never needs it.

The proxy passes the browser's ``Host`` on unchanged, which behind JupyterHub is the hub's
name, not a loopback one; so the spec hands the viewer a fresh access token
(``MSMON_VIEW_TOKEN``) and has the proxy add it to every request it forwards
(``X-Msmon-View-Token``, ``request_headers_override``), which is how the viewer tells its
proxy from a DNS-rebinding page (``access.py``).
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import Any

from msmon_nb.viewer.access import TOKEN_ENV, TOKEN_HEADER

ICON = Path(__file__).resolve().parent / "icon.svg"
TITLE = "msmon viewer"
START_TIMEOUT_SECS = 30.0  # the viewer answers within a second; a loaded machine is slower


def root_dir() -> str:
    """The directory the Jupyter server serves (``--ServerApp.root_dir``, the notebook
    directory), where notebooks write ``./summary``; its working directory otherwise."""
    try:
        from jupyter_server.serverapp import ServerApp
    except ImportError:
        return str(Path.cwd())
    if ServerApp.initialized():
        return str(Path(ServerApp.instance().root_dir).expanduser())
    return str(Path.cwd())


def viewer_command(port: int) -> list[str]:
    """``msmon view ROOT --port PORT`` in this Python (the one msmon_nb is installed in);
    called by jupyter-server-proxy at start, once the server's root dir is known."""
    return [sys.executable, "-m", "msmon_nb.cli", "view", root_dir(), "--port", str(port)]


def setup_msmon_view() -> dict[str, Any]:
    """The server-process spec jupyter-server-proxy reads (its ``ServerProcess`` keys)."""
    token = secrets.token_urlsafe(24)
    return {
        "command": viewer_command,
        "environment": {TOKEN_ENV: token},
        "request_headers_override": {TOKEN_HEADER: token},
        # the viewer sees paths from / (every URL of its page is relative)
        "absolute_url": False,
        "timeout": START_TIMEOUT_SECS,
        "launcher_entry": {"enabled": True, "title": TITLE, "icon_path": str(ICON)},
    }
