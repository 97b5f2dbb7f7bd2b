"""The manual as the tests read it: its pages, their code blocks, links and headings.

The README and every Markdown page under ``docs/`` (the site's pages) are read the same
way, so a check added here covers the whole manual. Kept free of anything the site's
generator does, so that a page GitHub shows (the README, any page browsed in the
repository) is checked as GitHub shows it too.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# a stub whose text the site replaces by the README's (docs/site_hooks.py)
HOME_STUB = DOCS / "index.md"

FENCE = re.compile(r"^(`{3,})([^\n`]*)\n(.*?)^\1[ \t]*$", re.M | re.S)
# the marker a block that cannot run here carries on the line before its fence
NO_EXEC = re.compile(r"<!--\s*no-exec:\s*(.*?)\s*-->\s*$")
# what a no-exec reason may say: the block needs something CI has not, or runs too long
NO_EXEC_REASON = re.compile(r"^(needs |long run)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)


def pages() -> list[Path]:
    """The README and every page of the site, in a stable order."""
    docs = sorted(p for p in DOCS.rglob("*.md") if p != HOME_STUB)
    return [README, *docs]


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    info: str
    code: str
    no_exec: str | None  # the reason given in a ``<!-- no-exec: ... -->`` marker

    @property
    def lang(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    def where(self) -> str:
        return f"{name(self.page)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, with the no-exec reason its marker gives."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NO_EXEC.search(before)
        found.append(
            Block(page, line, match.group(2).strip(), match.group(3), marker and marker.group(1))
        )
    return found


def python_blocks(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.lang == "python"]


def prose(text: str) -> str:
    """``text`` without its fenced blocks (their lines kept empty, so line numbers hold)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def heading_text(raw: str) -> str:
    """A heading as rendered to text: code spans keep their content, markup goes."""
    text = INLINE_CODE.sub(lambda m: m.group(2), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[*_]{1,2}(\S(?:.*?\S)?)[*_]{1,2}", r"\1", text)


def github_slug(text: str) -> str:
    """The anchor GitHub gives a heading (github-slugger: lowercase, punctuation dropped,
    each space a hyphen; letters, digits, ``_`` and ``-`` stay)."""
    kept = "".join(c for c in text.lower() if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def mkdocs_slug(text: str) -> str:
    """The anchor MkDocs gives a heading: Python-Markdown's ``toc`` default slugify."""
    value = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def anchors(page: Path) -> tuple[set[str], set[str]]:
    """The anchors of ``page``'s headings: as GitHub names them, as MkDocs does."""
    texts = [heading_text(m.group(2)) for m in HEADING.finditer(prose(page.read_text()))]
    return {github_slug(t) for t in texts}, {mkdocs_slug(t) for t in texts}


@dataclass(frozen=True)
class Link:
    page: Path
    line: int
    target: str

    def where(self) -> str:
        return f"{name(self.page)}:{self.line}: ({self.target})"


def links(page: Path) -> list[Link]:
    """Every link and image target of ``page``'s prose that is not an outside URL."""
    text = prose(page.read_text())
    text = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), text)
    found = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        found.append(Link(page, text.count("\n", 0, match.start()) + 1, target))
    return found


def code_spans(page: Path) -> list[tuple[int, str]]:
    """``(line, content)`` of every inline code span of ``page``'s prose."""
    text = prose(page.read_text())
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in INLINE_CODE.finditer(text)]
