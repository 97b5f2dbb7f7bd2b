"""Viewer fixtures: real servers on free ports, real files, a real MindSpore-written run."""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from msmon_nb.viewer.server import ViewerServer, make_server
from tests.conftest import run_python

MS_SCRIPT = r"""
import sys, numpy as np, mindspore as ms
from mindspore.train.summary import SummaryRecord
with SummaryRecord(sys.argv[1]) as sr:
    for step in range(1, 31):
        sr.add_value("scalar", "loss", ms.Tensor(np.float32(1.0 / step)))
        sr.add_value("scalar", "acc", ms.Tensor(np.float32(step / 30)))
        sr.record(step)
"""


class Client:
    """HTTP against one server, with the request path sent byte for byte."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def request(
        self, path: str, method: str = "GET", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            names = set(headers or {})
            conn.putrequest(
                method,
                path,
                skip_host="Host" in names,
                skip_accept_encoding="Accept-Encoding" in names,
            )
            for name, value in (headers or {}).items():
                conn.putheader(name, value)
            conn.endheaders()
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    def json(self, path: str) -> tuple[int, object]:
        status, _, body = self.request(path)
        return status, json.loads(body)


@pytest.fixture
def serve() -> Iterator:
    """``serve(base, **kw) -> (server, client)``; every server is stopped at the end."""
    servers: list[ViewerServer] = []

    def start(base: Path, **kw) -> tuple[ViewerServer, Client]:
        server = make_server(base, port=0, **kw)
        server.start()
        servers.append(server)
        return server, Client(*server.server_address[:2])

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def mindspore_run(tmp_path_factory) -> Path:
    """A run dir written by MindSpore's own SummaryRecord (loss = 1/step, acc = step/30)."""
    run_dir = tmp_path_factory.mktemp("ms_base") / "ms_run"
    run_python(MS_SCRIPT, str(run_dir))
    return run_dir


def msmon_cmd(*args: str) -> list[str]:
    """The ``msmon`` command line in this venv."""
    return [sys.executable, "-m", "msmon_nb.cli", *args]
