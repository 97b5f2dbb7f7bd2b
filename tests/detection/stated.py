"""The detection tables as the guide states them beside the rules (``docs/guide/alerts.md``:
the block bench/detect.py printed, pasted by ``bench/all.py --update-docs``)."""

from __future__ import annotations

from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "alerts.md"
START = "<!-- detect:tables -->"
END = "<!-- /detect:tables -->"


def page_block() -> str:
    """The text between the alerts page's detection-table markers, fences stripped."""
    text = PAGE.read_text()
    body = text[text.index(START) + len(START) : text.index(END)]
    lines = [line for line in body.strip().splitlines() if not line.startswith("```")]
    return "\n".join(lines).strip()


def stated(which: str) -> dict[str, dict[str, str]]:
    """``{row label: {detector: cell}}`` of the ``which`` set's table in the guide."""
    lines = page_block().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{which} set:"))
    head = lines[start + 1].split(" | ")
    names = [name.strip() for name in head[1:]]
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        if set(line) <= {"-"}:
            continue
        cells = line.split(" | ")
        label = cells[0][:16].strip()
        rows[label] = {name: cell.strip() for name, cell in zip(names, cells[1:], strict=True)}
    return rows
