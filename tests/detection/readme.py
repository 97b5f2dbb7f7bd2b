"""The detection tables as the README states them (the block bench/detect.py printed)."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
START = "<!-- detect:tables -->"
END = "<!-- /detect:tables -->"


def readme_block() -> str:
    """The text between the README's detection-table markers, fences stripped."""
    text = README.read_text()
    body = text[text.index(START) + len(START) : text.index(END)]
    lines = [line for line in body.strip().splitlines() if not line.startswith("```")]
    return "\n".join(lines).strip()


def stated(which: str) -> dict[str, dict[str, str]]:
    """``{row label: {detector: cell}}`` of the ``which`` set's table in the README."""
    lines = readme_block().splitlines()
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
