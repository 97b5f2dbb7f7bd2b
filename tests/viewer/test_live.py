"""Live runs: new points within 2 s, server-sent events, 50 concurrent clients."""

import http.client
import json
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.livewriter import start_writer


@pytest.fixture
def writer_proc(tmp_path):
    """``start(run_dir, pause) -> Popen`` of a live writer; killed at the end."""
    procs = []

    def start(run_dir, pause=0.05):
        proc = start_writer(run_dir, pause)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def q(**params) -> str:
    return urllib.parse.urlencode(params)


def last_step(client, run="live") -> int:
    status, body = client.json("/api/scalars?" + q(run=run, tag="train/loss"))
    assert status == 200
    return body["last_step"]


def test_new_points_visible_within_two_seconds(tmp_path, serve, writer_proc):
    proc = writer_proc(tmp_path / "live", pause=0.3)
    first = int(proc.stdout.readline())
    _, client = serve(tmp_path)
    assert last_step(client) >= first
    delays = []
    for _ in range(5):
        written = int(proc.stdout.readline())  # on disk now
        t0 = time.monotonic()
        while last_step(client) < written:
            assert time.monotonic() - t0 < 2.0, f"step {written} not served within 2 s"
            time.sleep(0.02)
        delays.append(time.monotonic() - t0)
    assert max(delays) < 2.0


def read_sse(host, port, stop: threading.Event, out: list, connected: threading.Event):
    """Collect ``(event, data)`` from /api/stream until ``stop`` is set."""
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.request("GET", "/api/stream")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    connected.set()
    event = None
    try:
        while not stop.is_set():
            line = resp.fp.readline().decode()
            if not line:
                break
            if line.startswith("event: "):
                event = line[7:].strip()
            elif line.startswith("data: "):
                out.append((event, json.loads(line[6:])))
    except TimeoutError:
        pass
    finally:
        conn.close()


def test_stream_announces_new_runs_and_data(tmp_path, serve, writer_proc):
    server, client = serve(tmp_path)
    events: list = []
    stop, connected = threading.Event(), threading.Event()
    host, port = server.server_address[:2]
    reader = threading.Thread(target=read_sse, args=(host, port, stop, events, connected))
    reader.start()
    try:
        assert connected.wait(5)
        proc = writer_proc(tmp_path / "live", pause=0.2)
        proc.stdout.readline()
        client.json("/api/scalars?" + q(run="live", tag="train/loss"))  # a client watches it
        written = int(proc.stdout.readline())
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            kinds = {(e, d.get("run")) for e, d in events}
            steps = [d["last_step"] for e, d in events if e == "data"]
            if ("hello", None) in kinds and steps and max(steps) >= written:
                break
            time.sleep(0.05)
        assert events[0][0] == "hello"
        assert any(e == "runs" and "live" in d["names"] for e, d in events)
        assert max(d["last_step"] for e, d in events if e == "data") >= written
        (tmp_path / "live" / "alerts.jsonl").write_text('{"step": 1, "message": "x"}\n')
        deadline = time.monotonic() + 2.0
        while not any(e == "alerts" for e, _ in events) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ("alerts", {"run": "live"}) in events
    finally:
        stop.set()
        server.events.publish("bye", {})
        reader.join(5)


def test_fifty_concurrent_clients_while_a_run_is_written(tmp_path, serve, writer_proc):
    proc = writer_proc(tmp_path / "live", pause=0.05)
    proc.stdout.readline()
    server, client = serve(tmp_path)
    host, port = server.server_address[:2]
    stop = threading.Event()
    streams = []
    for _ in range(5):  # a few browsers keep their event streams open meanwhile
        connected = threading.Event()
        t = threading.Thread(target=read_sse, args=(host, port, stop, [], connected))
        t.start()
        streams.append((t, connected))
    try:
        assert all(c.wait(5) for _, c in streams)

        def session(i: int) -> list[tuple[int, int]]:
            seen = []
            for _ in range(4):
                status, runs = client.json("/api/runs")
                assert status == 200 and runs[0]["name"] == "live"
                status, body = client.json(
                    "/api/scalars?" + q(run="live", tag="train/loss", max_points=200)
                )
                assert status == 200 and len(body["steps"]) <= 400
                seen.append((time.monotonic(), body["last_step"]))
                status, _ = client.json("/api/alerts?" + q(run="live"))
                assert status == 200
            return seen

        t0 = time.monotonic()
        with ThreadPoolExecutor(50) as pool:
            results = list(pool.map(session, range(50)))
        elapsed = time.monotonic() - t0
        assert len(results) == 50 and all(len(r) == 4 for r in results)
        points = sorted(p for r in results for p in r)
        assert points[-1][1] > points[0][1], "the run grew while the clients read it"
        assert elapsed < 60
        assert proc.poll() is None  # the writer was never blocked
    finally:
        stop.set()
        server.events.publish("bye", {})
        for t, _ in streams:
            t.join(5)
