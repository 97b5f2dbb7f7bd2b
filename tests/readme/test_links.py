"""Every link of the manual leads somewhere: README -> docs, docs -> docs, and the repository
paths the pages quote. ``mkdocs build --strict`` (tests/readme/test_site.py) checks the
site's pages as MkDocs renders them; this checks them as GitHub shows them too, and the
README, which GitHub shows first. An anchor must name a heading under both GitHub's and
MkDocs' rules (they differ on punctuation such as ``/``), so a link works in both.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.readme.manual import (
    DOCS,
    README,
    ROOT,
    anchors,
    code_spans,
    github_slug,
    links,
    mkdocs_slug,
    name,
    pages,
)

README_MAX_LINES = 300
# where a path quoted in a page's code may live: the repository's top-level dirs, and the
# package's rooms, which the pages name without the ``msmon_nb/`` prefix (a module's row in
# docs/ARCHITECTURE.md may name a file beside it, ``static/panel.js``, from its room)
ROOTS = ("msmon_nb", "tests", "bench", "docs", "notebooks", "vscode", ".ci")
ROOMS = tuple(p.name for p in (ROOT / "msmon_nb").iterdir() if p.is_dir() and p.name[0] != "_")
PATH = re.compile(r"^(?:\.?[\w-]+/)+[\w.*-]*$")


def broken(link_page: Path, target: str) -> str | None:
    """Why ``target``, linked from ``link_page``, leads nowhere; ``None`` when it is fine."""
    path, _, anchor = target.partition("#")
    dest = (link_page.parent / path).resolve() if path else link_page
    if not dest.exists():
        return f"no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}"
    if link_page != README and not dest.is_relative_to(DOCS):
        return "a page under docs/ links outside docs/, which the site does not hold"
    if anchor:
        if dest.suffix != ".md":
            return f"an anchor into {dest.name}, which is not a page"
        github, mkdocs = anchors(dest)
        if anchor not in github or anchor not in mkdocs:
            return (
                f"#{anchor} is not a heading of {dest.name} on "
                f"{'GitHub' if anchor not in github else 'the site'}"
            )
    return None


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail to a page "
        "of docs/guide/ and link it from 'Where to go next'"
    )


def test_readme_links_every_guide_page():
    linked = {(README.parent / link.target.partition("#")[0]).resolve() for link in links(README)}
    guide = set((DOCS / "guide").glob("*.md"))
    assert guide <= linked, f"not linked from the README: {sorted(map(name, guide - linked))}"


def test_every_link_and_anchor_resolves():
    checked, problems = 0, []
    for page in pages():
        for link in links(page):
            checked += 1
            why = broken(page, link.target)
            if why:
                problems.append(f"{link.where()}: {why}")
    assert checked > 40, checked  # the README and the guide do link
    assert not problems, "\n".join(problems)


def test_quoted_repository_paths_exist():
    checked, problems = 0, []
    for page in pages():
        for line, span in code_spans(page):
            for word in span.split():
                word = word.rstrip(".,;:)").split("::")[0]
                if not PATH.match(word) or "<" in word:
                    continue
                top = word.split("/")[0]
                if top in ROOTS:
                    candidates = [ROOT / word]
                elif top in ROOMS:
                    candidates = [ROOT / "msmon_nb" / word, *(ROOT / "msmon_nb").glob(f"*/{word}")]
                else:
                    continue
                checked += 1
                if not any(p.exists() or list(p.parent.glob(p.name)) for p in candidates):
                    problems.append(f"{name(page)}:{line}: `{word}` is not in the repository")
    assert checked > 100, checked  # the guide names its sources
    assert not problems, "\n".join(problems)


def test_the_slug_rules_differ_where_they_should():
    # the checks above lean on these two: GitHub keeps every hyphen, MkDocs folds them
    heading = "MindNLP / transformers Trainer"
    assert github_slug(heading) == "mindnlp--transformers-trainer"
    assert mkdocs_slug(heading) == "mindnlp-transformers-trainer"
    heading = "msmon ctl: the panel's buttons"
    assert github_slug(heading) == mkdocs_slug(heading) == "msmon-ctl-the-panels-buttons"
