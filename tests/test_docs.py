"""The README stays a front door (short), and every relative link in it and in docs/*.md leads
to a file that exists and, with a #anchor, to a heading that exists there (GitHub's rule)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
DOCS = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 220

FENCE = re.compile(r"^ *(```|~~~).*?^ *\1", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#* *$", re.M)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation other than - and _ dropped, spaces to -;
    a repeated one gets -1, -2, ... Headings inside fenced code are not headings."""
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


def relative_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    return [url for url in LINK.findall(text) if not re.match(r"[a-z]+:", url)]


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_every_relative_link_and_anchor_exists(path):
    broken = []
    for url in relative_links(path):
        target, _, anchor = url.partition("#")
        target_path = (path.parent / target).resolve() if target else path
        if not target_path.exists():
            broken.append(f"{url}: no file {os.path.relpath(target_path, REPO_ROOT)}")
        elif anchor and target_path.suffix == ".md" and anchor not in anchors(target_path):
            broken.append(f"{url}: no heading #{anchor} in {target_path.name}")
    assert not broken, f"{path.relative_to(REPO_ROOT)}: " + "; ".join(broken)


def test_anchor_rule_and_broken_links_are_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "## `pretrain/` — data preparation\n```\n# not a heading\n```\n"
        "[a](#pretrain--data-preparation) [b](#not-a-heading) [c](missing.md) [d](https://x.org)\n"
    )
    assert anchors(page) == {"pretrain--data-preparation"}
    assert relative_links(page) == ["#pretrain--data-preparation", "#not-a-heading", "missing.md"]


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"
