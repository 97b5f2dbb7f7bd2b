"""The panel's messages through VS Code's relay, before and after splitting them.

VS Code hands a widget message's binary frame to the notebook page as a JSON array of
byte values (``bench/relay.js`` does what vscode-jupyter's ``serializeDataViews`` does, in
both its branches: an ArrayBuffer -- what its kernel sockets hold -- is spread into an
array; a view goes through ``Array.apply`` over its whole buffer, which throws in V8,
"Maximum call stack size exceeded", past ~120 KB), which costs time per byte. The panel
here follows a 1 M-step run of ``--series`` series (first view = the reset a page asks
for; steady = the appends of a live run) and each message's size goes through the relay
in Node. "before": the reset as one message (what the panel sent until the split);
"after": as sent now, at most ``MAX_MESSAGE_BYTES`` of points a message. Target: every
message <= 5 ms. ``tests/vscode/test_webview.py`` measures the same relay in Chromium.

    python bench/relay.py [--series 12] [--steps 1000000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
from pathlib import Path

import numpy as np

from msmon_nb.metrics.series import Series
from msmon_nb.notebook.panel import Panel
from msmon_nb.notebook.updates import MAX_MESSAGE_BYTES, PointStream

RELAY = Path(__file__).with_name("relay.js")


Row = tuple[int, str, float, float, bool]


def relay(sizes: list[int], repeats: int = 15) -> list[Row]:
    node = shutil.which("node")
    if node is None:
        raise SystemExit("needs Node.js (the machine's node) to run bench/relay.js")
    out = subprocess.run(
        [node, str(RELAY), str(repeats)],
        input="\n".join(map(str, sizes)) + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for line in out.strip().splitlines():
        b, branch, med, mx, ok = line.split()
        rows.append((int(b), branch, float(med), float(mx), ok == "true"))
    return rows


def series(n: int, count: int) -> dict[str, Series]:
    data = {}
    for i in range(count):
        s = Series()
        s.extend(np.arange(n), np.sin(np.arange(n) / (100 + i)) + i, np.zeros(n))
        data[f"{('val', 'sys', 'train')[i // 6 % 3]}/metric_{i:02d}"] = s
    return data


def report(name: str, rows: list[Row]) -> None:
    sizes = [b for b, branch, *_ in rows if branch == "arraybuffer"]
    print(f"  {name}: {len(sizes)} message(s), largest {max(sizes) / 1024:.0f} KB")
    for branch in ("arraybuffer", "view"):
        mine = [r for r in rows if r[1] == branch]
        failed = [b for b, _, _, _, ok in mine if not ok]
        worked = [(med, mx) for _, _, med, mx, ok in mine if ok]
        line = f"    {branch:>11}:"
        if worked:
            line += (
                f" relay per message median {statistics.median(m for m, _ in worked):.2f} ms,"
                f" max {max(x for _, x in worked):.2f} ms"
            )
        if failed:
            line += f" {len(failed)} FAILED (RangeError) at {min(failed) / 1024:.0f} KB and up"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--series", type=int, default=12)
    parser.add_argument("--steps", type=int, default=1_000_000)
    args = parser.parse_args()
    data = series(args.steps, args.series)
    panel = Panel("relay", live=False)
    sent: list[int] = []
    panel.widget.send = lambda msg, buffers=None: sent.append(sum(map(len, buffers or [])))
    panel.set_data(data)
    panel.send(reset=True)
    after = list(sent)
    keys = panel._chart_keys  # the bench looks inside: the keys the plan charts
    before = len(PointStream().take(data, keys).buffer)
    steady = []  # a live run: 500 new steps per key between two messages
    for key, s in data.items():
        s.extend(np.arange(args.steps, args.steps + 500), np.ones(500), np.zeros(500))
        data[key] = s
    sent.clear()
    panel.send()
    steady = list(sent)
    print(
        f"The panel's first view of {len(set(keys) & set(data))} series x {args.steps:,} steps "
        f"(MAX_MESSAGE_BYTES {MAX_MESSAGE_BYTES // 1024} KB), through VS Code's relay in Node:"
    )
    report("before, the reset as one message", relay([before]))
    report("after, the reset split", relay(after))
    report("a live update (500 new steps a series)", relay(steady))


if __name__ == "__main__":
    main()
