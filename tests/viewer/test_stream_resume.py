"""``/api/stream`` honours ``Last-Event-ID``: a reconnect resumes right after the last event
its client saw, or says it cannot (another server start, events dropped) so the page
reloads instead of keeping a gap. What the page does with it: test_reconnect_browser.py."""

from __future__ import annotations

import http.client
import json

from msmon_nb.viewer.sse import Broadcaster


def read_events(server, count: int, last_id: str | None = None) -> list[dict]:
    """The first ``count`` events of a new stream (``hello`` included), as
    ``{id, event, data}``; ``last_id`` is sent as a reconnecting browser sends it."""
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=5)
    headers = {"Last-Event-ID": last_id} if last_id is not None else {}
    conn.request("GET", "/api/stream", headers=headers)
    resp = conn.getresponse()
    assert resp.status == 200
    out: list[dict] = []
    event: dict = {}
    try:
        while len(out) < count:
            line = resp.fp.readline().decode()
            assert line, "the stream ended"
            line = line.rstrip("\n")
            if not line:
                if "event" in event:
                    out.append(event)
                event = {}
            elif line.startswith(("id: ", "event: ")):
                name, _, value = line.partition(": ")
                event[name] = value
            elif line.startswith("data: "):
                event["data"] = json.loads(line[6:])
    finally:
        conn.close()
    return out


def test_a_reconnect_with_last_event_id_gets_exactly_what_it_missed(tmp_path, serve):
    server, _ = serve(tmp_path)
    events = server.events
    for i in range(3):
        events.publish("data", {"run": "r", "last_step": i})
    (hello,) = read_events(server, 1)
    assert hello["event"] == "hello" and hello["data"]["resumed"] is False
    assert hello["id"] == events.event_id(3)  # where this client starts: an id of its own
    for i in range(3, 6):
        events.publish("data", {"run": "r", "last_step": i})
    hello, *missed = read_events(server, 4, last_id=events.event_id(3))
    assert hello["data"] == {"base": str(server.base), "seq": 3, "resumed": True}
    assert [e["data"]["last_step"] for e in missed] == [3, 4, 5]  # each once, in order
    assert [e["id"] for e in missed] == [events.event_id(s) for s in (4, 5, 6)]
    # a client that had seen everything: resumed, and the next event is the next one
    first = events.publish("runs", {"names": ["r"]})
    hello, nxt = read_events(server, 2, last_id=events.event_id(6))
    assert hello["data"]["resumed"] is True and nxt["id"] == events.event_id(first)


def test_an_id_it_cannot_resume_from_says_so(tmp_path, serve):
    """Another server's id (a restart: sequence numbers start again), garbage, or an id
    older than the events held: the stream starts at the newest, resumed false."""
    server, _ = serve(tmp_path)
    events = server.events
    events.publish("data", {"run": "r", "last_step": 0})
    other = Broadcaster()
    for last_id in (other.event_id(0), "7", "", "x-y", events.event_id(99)):
        (hello,) = read_events(server, 1, last_id=last_id)
        assert hello["data"]["resumed"] is False and hello["data"]["seq"] == 1, last_id


def test_resume_is_refused_once_an_event_after_it_was_dropped():
    events = Broadcaster(keep=3)
    for _ in range(5):
        events.publish("data", {})
    assert events.resume(events.event_id(1)) is None  # 2 was dropped
    assert events.resume(events.event_id(2)) == 2  # 3, 4, 5 are held
    assert events.resume(events.event_id(5)) == 5
    assert events.resume(events.event_id(6)) is None  # not given yet


def test_head_of_the_stream_is_its_headers_alone(tmp_path, serve):
    _, client = serve(tmp_path)
    status, headers, body = client.request("/api/stream", method="HEAD")
    assert status == 200 and headers["Content-Type"] == "text/event-stream" and body == b""
