"""Every guide under docs/guides/ names real files: each path it gives in backticks (or in a command of
its code blocks) exists in the tree, a glob matches at least one file, a placeholder's folder exists
(`models/<name>/` → models/), and a bare file name is some file's name. Every guide is in the nav."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GUIDES = sorted((REPO / "docs" / "guides").glob("*.md"))
FENCE = re.compile(r"```.*?```", re.S)
EXTENSIONS = (".py", ".md", ".yaml", ".yml", ".toml", ".json", ".sh", ".cfg", ".lock")


def tracked_names() -> set[str]:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return {Path(line).name for line in files.splitlines()}


def named_paths(text: str) -> set[str]:
    """The repository paths a guide names: inline code that looks like a path, and path-like words of
    its code blocks. Routes (`/v1/models`), URLs and dotted module names are not paths."""
    blocks = FENCE.findall(text)
    inline = re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
    words = [w for block in blocks for w in re.split(r"[\s=]+", block) if "/" in w and w.endswith(EXTENSIONS)]
    out = set()
    for token in [*inline, *words]:
        token = token.strip().rstrip(".,;:)")
        if " " in token or token.startswith(("/", "…", "-")) or "://" in token or "{" in token:
            continue
        if "/" in token or token.endswith(EXTENSIONS):
            out.add(token)
    return out


def missing(token: str, names: set[str]) -> bool:
    if "<" in token:  # a placeholder (`models/<name>/`, `tests/stages/test_<module>.py`): its folder must exist
        fixed = token.split("<")[0]
        return not (REPO / (fixed if fixed.endswith("/") else fixed.rpartition("/")[0])).is_dir()
    if "*" in token:
        return not list(REPO.glob(token))
    if "/" not in token:
        return token not in names
    return not (REPO / token).exists()


@pytest.mark.parametrize("guide", GUIDES, ids=[g.stem for g in GUIDES])
def test_every_path_a_guide_names_exists(guide):
    names = tracked_names()
    paths = named_paths(guide.read_text())
    assert paths, f"{guide.name} names no file"
    gone = sorted(p for p in paths if missing(p, names))
    assert not gone, f"{guide.relative_to(REPO)} names paths that are not in the tree: {gone}"


def test_every_guide_is_in_the_nav():
    def pages(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            yield from pages(value) if isinstance(value, list) else [value]

    nav = set(pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]))
    assert GUIDES and {f"guides/{g.name}" for g in GUIDES} <= nav


def test_a_path_that_is_not_there_is_caught():
    names = tracked_names()
    text = ("Edit `models/registry.py`, then `models/no_such_module.py`; see `evaluation/serving/*.py`, "
            "`tests/stages/test_<module>.py` and `nowhere/<name>.py`.\n")
    assert sorted(p for p in named_paths(text) if missing(p, names)) == ["models/no_such_module.py", "nowhere/<name>.py"]
