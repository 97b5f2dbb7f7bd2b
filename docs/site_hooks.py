"""mkdocs hooks for the manual (mkdocs.yml ``hooks:``).

The site's home page is the README itself, so the first page a newcomer sees on GitHub and
on the site cannot drift apart: ``docs/index.md`` is a stub whose text is replaced by the
README's when mkdocs reads it. The README links into ``docs/`` from the repository root;
from ``docs/index.md`` the same files are one level up, so ``docs/`` is dropped from each
link target. mkdocs' strict mode then checks those links and anchors like any page's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_as_home() -> str:
    """The README's Markdown with its ``docs/...`` link targets made relative to docs/."""
    return re.sub(r"\]\(docs/", "](", README.read_text())


def on_page_read_source(page: Any, config: Any) -> str | None:
    """The README's text for the home page; ``None`` lets mkdocs read every other page."""
    if page.file.src_uri == "index.md":
        return readme_as_home()
    return None
