"""The index pages of the experiment and benchmark scripts (docs/experiments.md, docs/benchmarks.md),
generated from the scripts themselves so a page cannot miss one or drift from it.

Each row is read from the tree, never typed: the script's module docstring (its first paragraph is
what it measures; a script without one is refused), the result files under its folder's `results/`
whose names start with the script's name, and the documentation pages that name the script. Files in
`results/` that no script claims by name are listed apart, so nothing there goes unmentioned.

    python -m routerops.script_index          # rewrite both pages
    python -m routerops.script_index --check  # exit 1 when a committed page is stale
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from routerops.errors import InputError
from routerops.schema import write_text_atomic

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Folder:
    """One folder of scripts and the page that indexes it."""
    name: str  # experiments or benchmarks
    page: str  # under docs/
    title: str
    intro: str


FOLDERS = (
    Folder("experiments", "experiments.md", "Experiments",
           "Experiments are the scripts under `experiments/` whose numbers the README and these pages quote: "
           "quality, accuracy and cost studies, each reproducible by the one command in its docstring. Each "
           "writes its results under `experiments/results/`, named after it; a rerun replaces them (earlier runs "
           "are in git's history). "
           "Speed and memory are measured apart, on the [benchmarks](benchmarks.md) page."),
    Folder("benchmarks", "benchmarks.md", "Benchmarks",
           "Benchmarks are the scripts under `benchmarks/` that measure speed and memory; each writes JSON under "
           "`benchmarks/results/`. `make benchmarks` runs the first three quick ones; the others are run by hand. "
           "On a shared machine take the lock the long ones use (`flock /tmp/routerops-bench.lock …`) so two "
           "benchmarks do not time each other. `benchmarks/results/arena.json` is written by `routerops run arena` "
           "(`make arena`; see [the arena](arena.md)). Quality and cost studies are on the "
           "[experiments](experiments.md) page."),
)


@lru_cache(maxsize=256)
def parsed(script: Path, mtime_ns: int) -> ast.Module:
    """The script's syntax tree, read once per version of the file."""
    return ast.parse(script.read_text(), filename=str(script))


def tree(script: Path) -> ast.Module:
    return parsed(script, script.stat().st_mtime_ns)


def docstring(script: Path) -> str:
    """The script's module docstring; refused when it has none."""
    doc = ast.get_docstring(tree(script))
    if not doc or not doc.strip():
        raise InputError(script, "module docstring", "missing; the index pages are built from it")
    return doc


def summary(script: Path) -> str:
    """The first sentence of the docstring's first paragraph, on one line."""
    paragraph = " ".join(docstring(script).strip().split("\n\n")[0].split())
    first = re.match(r"(.+?[.!?])(\s|$)", paragraph)
    return first.group(1) if first else paragraph


def command(script: Path) -> str | None:
    """The docstring's command that runs the script (`python FOLDER/NAME.py …`, continuation lines joined)."""
    lines = docstring(script).splitlines()
    call = f"{script.parent.name}/{script.name}"
    for i, line in enumerate(lines):
        if "python" in line and call in line:
            parts = [line.strip()]
            while parts[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                parts[-1] = parts[-1][:-1].rstrip()
                parts.append(lines[i].strip())
            return " ".join(parts)
    return None


def also_writes(script: Path) -> tuple[str, ...]:
    """Result-name prefixes a script declares beside its own name (`ALSO_WRITES = ("gateway_sweep",)`)."""
    for node in tree(script).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ALSO_WRITES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


def scripts(folder: Folder, root: Path = REPO) -> list[Path]:
    return sorted((root / folder.name).glob("*.py"))


def results_of(script: Path, claimed: set[Path]) -> list[str]:
    """The result files named after the script (NAME.json, NAME_variant.json, NAME_runs/) or after a prefix
    it declares in ALSO_WRITES, marked claimed."""
    found = []
    for stem in (script.stem, *also_writes(script)):
        for path in sorted((script.parent / "results").glob(f"{stem}*")):
            rest = path.name[len(stem):]
            if rest[:1] in ("", ".", "_") and path not in claimed:
                found.append(path.name + ("/" if path.is_dir() else ""))
                claimed.add(path)
    return found


def documentation(root: Path = REPO) -> dict[str, tuple[str, str]]:
    """Every documentation page but the index pages: link from docs/ → (title, text)."""
    out = {}
    for page in sorted((root / "docs").rglob("*.md")):
        if page.parent == root / "docs" and page.name in {f.page for f in FOLDERS}:
            continue
        text = page.read_text()
        title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), page.stem)
        out[page.relative_to(root / "docs").as_posix()] = (title, text)
    return out


def pages_naming(relative: str, pages: dict[str, tuple[str, str]]) -> list[tuple[str, str]]:
    """(link, title) of every page that names `relative` (e.g. experiments/x.py)."""
    return [(link, title) for link, (title, text) in pages.items() if relative in text]


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(folder: Folder, root: Path = REPO) -> str:
    """The Markdown page of one folder's scripts."""
    claimed: set[Path] = set()
    docs = documentation(root)
    lines = [f"# {folder.title}", "", "<!-- generated by `python -m routerops.script_index`; do not edit by hand -->",
             "", folder.intro, "", "| script | measures | command | results | discussed in |", "|---|---|---|---|---|"]
    for script in scripts(folder, root):
        relative = f"{folder.name}/{script.name}"
        results = ", ".join(f"`{name}`" for name in results_of(script, claimed)) or "—"
        pages = ", ".join(f"[{cell(title)}]({link})" for link, title in pages_naming(relative, docs)) or "—"
        run = command(script)
        lines.append(f"| `{script.name}` | {cell(summary(script))} | {f'`{cell(run)}`' if run else '—'} | {results} "
                     f"| {pages} |")
    others = [p for p in sorted((root / folder.name / "results").glob("*")) if p not in claimed]
    if others:
        lines += ["", f"Other files in `{folder.name}/results/` (written by a command, not by a script here):",
                  "", *(f"- `{p.name}`" for p in others)]
    return "\n".join(lines) + "\n"


def stale_pages(root: Path = REPO) -> list[str]:
    """The index pages whose committed text differs from what the scripts give now."""
    return [f.page for f in FOLDERS if (root / "docs" / f.page).read_text() != render(f, root)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed page is stale")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_pages()
            for page in stale:
                print(f"docs/{page} is stale: run python -m routerops.script_index", file=sys.stderr)
            return 1 if stale else 0
        for folder in FOLDERS:
            write_text_atomic(render(folder), REPO / "docs" / folder.page)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
