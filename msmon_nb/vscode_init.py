"""``msmon vscode init [DIR]``: put msmon's VSCode tasks, launch configs and settings in a project.

The templates ship inside the package, ``msmon_nb/vscode_templates/`` (JSON with comments,
as VSCode writes them), so a wheel install has them; the repository's ``vscode/`` is a copy
for readers, checked identical by a test. A file the project lacks is copied verbatim,
comments included. A file it has is never overwritten: the entries it lacks (tasks by label,
launch configurations by name, settings by key, list items, extension ids) are merged in
when the file is plain JSON (``inputs`` the tasks and configurations prompt for, by id,
too); when it holds comments, rewriting it would drop them, so nothing is written and the
message names what to add by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TEMPLATES = ("tasks.json", "launch.json", "settings.json", "extensions.json")
# file -> its lists: (list key, identity key of an item; None: the item itself)
_LISTS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "tasks.json": (("tasks", "label"), ("inputs", "id")),
    "launch.json": (("configurations", "name"), ("inputs", "id")),
    "extensions.json": (("recommendations", None),),
}


TEMPLATE_DIR = Path(__file__).resolve().parent / "vscode_templates"


def template_dir() -> Path:
    """The packaged templates; a clear error when an install lost its package data."""
    missing = [name for name in TEMPLATES if not (TEMPLATE_DIR / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"msmon's VSCode templates {', '.join(missing)} are missing from {TEMPLATE_DIR}: "
            "this msmon_nb install lacks its package data; reinstall it "
            "(pip install --force-reinstall msmon_nb)"
        )
    return TEMPLATE_DIR


def _scan(text: str, drop_comments: bool, drop_trailing_commas: bool) -> str:
    """``text`` without comments and/or trailing commas, strings left untouched."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif drop_comments and text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
        elif drop_comments and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise ValueError("unterminated /* comment")
            i = end + 2
        elif drop_trailing_commas and c == ",":
            j = i + 1
            while j < n and text[j] in " \t\r\n":
                j += 1
            if j >= n or text[j] not in "]}":
                out.append(c)
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_jsonc(text: str) -> Any:
    """Parse VSCode's JSON with comments (``//``, ``/* */``, trailing commas)."""
    return json.loads(_scan(_scan(text, True, False), False, True))


def has_comments(text: str) -> bool:
    """True when ``text`` holds a ``//`` or ``/* */`` comment outside strings."""
    return _scan(text, True, False) != text


def merge(name: str, ours: Any, theirs: Any) -> tuple[Any, list[str]]:
    """``theirs`` plus what of ``ours`` it lacks; and a line per addition."""
    merged = json.loads(json.dumps(theirs))
    added: list[str] = []
    if name in _LISTS:
        for key, ident in _LISTS[name]:
            if key not in ours:
                continue
            items = merged.setdefault(key, [])
            have = {item.get(ident) if isinstance(item, dict) else item for item in items}
            for item in ours[key]:
                item_id = item[ident] if ident else item
                if item_id not in have:
                    items.append(item)
                    added.append(f"{key[:-1] if key.endswith('s') else key} {item_id!r}")
        return merged, added
    for key, value in ours.items():
        if key not in merged:
            merged[key] = value
            added.append(f"setting {key!r}")
        elif isinstance(value, list) and isinstance(merged[key], list):
            for item in value:
                if item not in merged[key]:
                    merged[key].append(item)
                    added.append(f"{item!r} in setting {key!r}")
        elif isinstance(value, dict) and isinstance(merged[key], dict):
            for sub, sub_value in value.items():
                if sub not in merged[key]:
                    merged[key][sub] = sub_value
                    added.append(f"{sub!r} in setting {key!r}")
    return merged, added


def init(project: str | Path, out=sys.stdout) -> int:
    """Install the templates into ``project/.vscode``; 0 done, 1 when a file was refused."""
    try:
        source = template_dir()
    except FileNotFoundError as exc:
        print(f"msmon vscode init: {exc}", file=sys.stderr)
        return 1
    target = Path(project) / ".vscode"
    target.mkdir(parents=True, exist_ok=True)
    status = 0
    for name in TEMPLATES:
        src, dst = source / name, target / name
        shown = dst
        if not dst.exists():
            dst.write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
            print(f"created {shown}", file=out)
            continue
        text = dst.read_text(encoding="utf-8")
        try:
            theirs = parse_jsonc(text)
        except ValueError as exc:
            print(f"left {shown} alone: it does not parse ({exc}); see {src}", file=out)
            status = 1
            continue
        merged, added = merge(name, parse_jsonc(src.read_text(encoding="utf-8")), theirs)
        if not added:
            print(f"{shown} already has everything msmon adds", file=out)
        elif has_comments(text):
            print(
                f"left {shown} alone: it has comments, which rewriting would lose; "
                f"add by hand from {src}: {', '.join(added)}",
                file=out,
            )
            status = 1
        else:
            dst.write_text(json.dumps(merged, indent=4) + "\n", encoding="utf-8")
            print(f"added to {shown}: {', '.join(added)}", file=out)
    return status
