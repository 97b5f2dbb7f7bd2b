"""The configuration page's table is ``MonitorConfig``: every field, in order, with its
default as YAML spells it. A field added, renamed or given a new default without the page
following fails here."""

from __future__ import annotations

import dataclasses

import yaml

from msmon_nb.config import MonitorConfig
from tests.readme.manual import DOCS

PAGE = DOCS / "guide" / "configuration.md"


def page_table() -> list[tuple[str, str]]:
    """``(key, default)`` of each row of the page's key table, code marks stripped."""
    text = PAGE.read_text()
    lines = text[text.index("| key | default | what it sets |") :].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("| "):
            break
        key, default = (cell.strip().strip("`") for cell in line.split(" | ")[:2])
        rows.append((key.lstrip("| `"), default))
    return rows


def test_the_table_is_every_field_with_its_default():
    defaults = MonitorConfig()
    fields = [f.name for f in dataclasses.fields(MonitorConfig)]
    rows = page_table()
    assert [key for key, _ in rows] == fields
    for key, default in rows:
        assert yaml.safe_load(default) == getattr(defaults, key), (key, default)


def test_the_table_reads_real_values():
    # the reader above is not vacuous: a default changed on the page would be seen
    assert ("log_interval", "1") in page_table()
    assert ("save_dir", "./summary") in page_table()
