"""The viewer's control route: the panel's buttons for a live run, from the viewer."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest

from msmon_nb.monitor import Monitor, StopTraining
from msmon_nb.rundir import read_marker
from msmon_nb.rundir.control import CONTROL
from msmon_nb.viewer.server import make_server
from tests.support.training import training_script
from tests.viewer.test_browser import browser, open_page, wait_for  # noqa: F401 (fixture)


class Training(threading.Thread):
    """A monitored loop in a thread: one step every 20 ms until stopped."""

    def __init__(self, base) -> None:
        super().__init__(daemon=True)
        self.mon = Monitor(save_dir=str(base), run_name="live", log_interval=1)
        self.ended = threading.Event()

    def run(self) -> None:
        with self.mon:
            try:
                for i in range(100_000):
                    self.mon.step(loss=1.0 / (i + 1))
                    time.sleep(0.02)
            except StopTraining:
                pass
        self.ended.set()


@pytest.fixture
def viewer(tmp_path):
    server = make_server(tmp_path, port=0)
    server.start()
    yield server
    server.stop()


def post(server, body, token=None, host=None, content_type="application/json", length=None):
    host_port = server.server_address[:2]
    conn = http.client.HTTPConnection(*host_port, timeout=30)
    data = json.dumps(body).encode()
    headers = {"Content-Type": content_type, "Content-Length": length or str(len(data))}
    if token is not None:
        headers["X-Msmon-Token"] = token
    if host is not None:
        headers["Host"] = host
    try:
        conn.request("POST", "/api/control", body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def token_of(server):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    try:
        conn.request("GET", "/api/info")
        return json.loads(conn.getresponse().read())["control_token"]
    finally:
        conn.close()


def test_stop_a_live_run_from_the_viewer(viewer, tmp_path):
    training = Training(tmp_path)
    training.start()
    time.sleep(0.5)
    token = token_of(viewer)
    status, body = post(viewer, {"run": "live", "cmd": "freq", "arg": 3}, token)
    assert status == 200 and body["ok"], body
    assert body["acks"][0]["message"] == "collecting every 3 steps"
    status, body = post(viewer, {"run": "live", "cmd": "stop"}, token)
    assert status == 200 and body["ok"], body
    assert training.ended.wait(10)
    marker = read_marker(training.mon.run_dir)
    assert marker["status"] == "stopped" and "msmon view" in marker["stop_reason"]
    # the run is over: a further command is refused with the reason
    status, body = post(viewer, {"run": "live", "cmd": "pause"}, token)
    assert status == 409 and "no live monitor owns" in body["error"]


def test_control_needs_the_token_a_local_host_and_a_known_run(viewer, tmp_path):
    training = Training(tmp_path)
    training.start()
    try:
        time.sleep(0.5)
        token = token_of(viewer)
        assert post(viewer, {"run": "live", "cmd": "stop"})[0] == 403  # no token
        assert post(viewer, {"run": "live", "cmd": "stop"}, "x" * 32)[0] == 403
        status, body = post(viewer, {"run": "live", "cmd": "stop"}, token, host="evil.example")
        assert status == 403 and "local-only" in body["error"]
        status, _ = post(viewer, {"run": "live", "cmd": "stop"}, token, content_type="text/plain")
        assert status == 415
        status, body = post(viewer, {"run": "live", "cmd": "stop"}, token, length="12abc")
        assert status == 400 and "Content-Length" in body["error"]
        status, body = post(viewer, {"run": "../elsewhere", "cmd": "stop"}, token)
        assert status == 404
        status, body = post(viewer, {"run": "live", "cmd": "jump"}, token)
        assert status == 409 and "unknown command" in body["error"]
        assert not training.ended.is_set()  # none of these reached the loop
        assert not (training.mon.run_dir / CONTROL).exists()  # refused: nothing queued
    finally:
        training.mon.stop()
        training.ended.wait(10)


@pytest.mark.slow
def test_the_viewer_stop_button_ends_a_script_run(browser, serve, tmp_path):  # noqa: F811
    """A ``python train.py`` run (no page, no kernel) stopped from the viewer's page."""
    with training_script(tmp_path) as (proc, run_dir):
        server, _client = serve(tmp_path)
        page, problems = open_page(browser)
        page.goto(server.url)
        row = f'#runs tr[data-run="{run_dir.name}"]'
        wait_for(page, f"() => document.querySelector('{row}') !== null", timeout=30_000)
        if not page.is_checked(f"{row} input[type=checkbox]"):  # live runs start selected
            page.click(f"{row} input[type=checkbox]")
        controls = f'.control-row[data-run="{run_dir.name}"]'
        page.wait_for_selector(controls, timeout=10_000)
        # "collect every" starts where the panel's does, at the product's default (the
        # run's own, here): it started at 10, a value the run did not have
        assert page.input_value(f"{controls} input.control-freq") == "1"
        page.click(f'{controls} button[data-cmd="stop"]')
        # the answer shows in the run's control row until the run has ended; then the row
        # goes (its run is no longer live) and the runs table says "stopped": a run that
        # ends quickly may take its row before the answer is read, so either is seen
        status = f"{row} span.status"
        wait_for(
            page,
            f"() => {{ const m = document.querySelector('{controls} .control-msg');"
            " return (m !== null && m.textContent.includes('stopping at the next step boundary'))"
            f" || document.querySelector('{status}')?.textContent === 'stopped'; }}",
            timeout=15_000,
        )
        out, _err = proc.communicate(timeout=60)
        assert "status stopped" in out
        assert read_marker(run_dir)["status"] == "stopped"
        # what the user is left with: the run marked stopped, and no buttons for it
        wait_for(
            page,
            f"() => document.querySelector('{status}')?.textContent === 'stopped'"
            f" && document.querySelector('{controls}') === null",
            timeout=15_000,
        )
        assert not problems, problems
