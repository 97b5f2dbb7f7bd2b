"""The manual builds as a site: ``mkdocs build --strict``, as ``make docs`` runs it, so a
broken link, anchor or nav entry, or a page left out of the nav, fails ``make test`` and CI.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tomllib

from tests.readme.manual import DOCS, ROOT


def test_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    home = (site / "index.html").read_text()
    # the home page is the README (docs/site_hooks.py), its links made relative to docs/
    assert "Three ways in" in home and 'href="guide/setup/"' in home, home[:2000]
    assert 'src="panel.png"' in home
    pages = {p.relative_to(DOCS).with_suffix("") for p in DOCS.rglob("*.md")}
    for page in pages - {Path("index")}:
        assert (site / page / "index.html").exists(), f"{page} is not in the site"
    assert not list(site.rglob("*.py")), "the screenshot scripts are not pages"


def test_docs_pins_agree():
    """``make docs`` installs the MkDocs that pyproject's docs and dev extras pin."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (pin,) = re.findall(r"^DOCS_PIN := (\S+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert extras["docs"] == [pin]
    assert pin in extras["dev"]
