"""The documentation site builds strictly (a broken link, a missing anchor or a page left out of the
nav is an error), every page under docs/ is in the nav, and the README stays a short tour whose links
resolve."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300


def nav_pages(entries) -> list[str]:
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def mkdocs_config() -> dict:
    # The config's own tags (!ENV, !relative) are not used here; refuse them rather than misread them.
    return yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_mkdocs_build_strict_succeeds(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site/index.html").is_file()
    assert (tmp_path / "site/guides/add-stage/index.html").is_file()


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    docs = REPO / "docs"
    pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")}
    in_nav = nav_pages(mkdocs_config()["nav"])
    assert len(in_nav) == len(set(in_nav)), "a page is listed twice"
    assert pages - set(in_nav) == set(), "pages missing from mkdocs.yml's nav"
    assert set(in_nav) - pages == set(), "nav entries without a page"


def test_readme_is_a_short_tour_with_the_two_commands_near_the_top():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    top = "\n".join(lines[:20])
    assert "make demo" in top and "make test" in top


def test_readme_links_point_at_files_that_exist():
    text = (REPO / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert targets
    missing = [t for t in targets if not (REPO / t).exists()]
    assert not missing, missing
