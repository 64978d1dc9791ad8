"""`routerops dvc-yaml [--check]`: every dvc.yaml, written from the declarations (stages/declarations.py).

DVC reads YAML, so its files are generated, never edited: each stage's `cmd` is `routerops stage NAME`,
its deps, params and outs are its `Dvc` entry, and a file under pipelines/X/ runs from the repository
root (`wdir: ../..`, params from `../../params.yaml`). `--check` writes nothing and fails, naming the
file, pipeline and stage, when a committed file is not what the declarations give (the test suite runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from routerops.errors import InputError, RouteropsError
from routerops.files import read_yaml_mapping
from stages.declarations import DVC_FILES, PIPELINES, STAGES, Dvc, dvc_stage_names

INDENT = "  "
REPO = Path(__file__).resolve().parents[1]
SETTING = re.compile(r"^\$\{([\w.]+)\}$")  # a dependency named by a settings key: ${prices.collection}


def setting(params: dict[str, Any], key: str, source: Path) -> str:
    """The value of dotted `key` in the params mapping (checked by routerops.config.load_params)."""
    node: Any = params
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise InputError(source, key, "missing: a dvc.yaml dependency is named by it (stages/declarations.py)")
        node = node[part]
    if not isinstance(node, str) or not node:
        raise InputError(source, key, f"expected a file path, got {node!r}")
    return node


def resolved(dvc: Dvc, params: dict[str, Any], source: Path) -> Dvc:
    """The entry with each `${key}` dependency replaced by the file the settings name."""
    deps = tuple(setting(params, m.group(1), source) if (m := SETTING.match(d)) else d for d in dvc.deps)
    return dataclasses.replace(dvc, deps=deps)


def settings_of(root: Path) -> dict[str, Any]:
    """params.yaml under `root`, checked by the settings' own loader, as the mapping the keys name."""
    from routerops.config import load_params

    path = root / "params.yaml"
    load_params(path)
    return read_yaml_mapping(path)


def _entries(key: str, values, depth: int) -> list[str]:
    """`key:` and its list, in the style DVC's own files use (`- path` or `- path:` with options)."""
    pad = INDENT * depth
    lines = [f"{pad}{key}:"]
    for value in values:
        if isinstance(value, dict):
            (name, options), = value.items()
            lines.append(f"{pad}{INDENT}- {name}:")
            if isinstance(options, dict):
                lines += [f"{pad}{INDENT * 3}{k}: {yaml.safe_dump(v).splitlines()[0]}" for k, v in options.items()]
            else:
                lines += [f"{pad}{INDENT * 3}- {item}" for item in options]
        else:
            lines.append(f"{pad}{INDENT}- {value}")
    return lines


def stage_lines(name: str, dvc: Dvc, wdir: str) -> list[str]:
    lines = [f"{INDENT}{name}:" + (f"  # {dvc.note}" if dvc.note else "")]
    if wdir:
        lines.append(f"{INDENT * 2}wdir: {wdir}")
    lines.append(f"{INDENT * 2}cmd: routerops stage {name}")
    lines += _entries("deps", dvc.deps, 2)
    if dvc.params:
        lines += _entries("params", [{f"{wdir}/params.yaml": dvc.params}] if wdir else dvc.params, 2)
    for key in ("outs", "metrics"):
        if getattr(dvc, key):
            lines += _entries(key, getattr(dvc, key), 2)
    return lines


def render(path: str, root: Path = REPO) -> str:
    """The text of dvc file `path` (relative to the repository root) from the declarations and the
    settings of `root`'s params.yaml (the files its `${key}` dependencies name)."""
    params = settings_of(root)
    spec = DVC_FILES[path]
    depth = len(Path(path).parts) - 1
    wdir = "/".join([".."] * depth)
    lines = [f"# {line}" if line else "#" for line in spec.header.splitlines()]
    lines += [f"# Generated from stages/declarations.py by `routerops dvc-yaml`: edit the declarations, not this file."]
    lines.append("stages:")
    for name in dvc_stage_names(path):
        dvc = STAGES[name].dvc
        if dvc is None:
            raise ValueError(f"stage {name!r} of {path} has no DVC entry in stages/declarations.py")
        lines += stage_lines(name, resolved(dvc, params, root / "params.yaml"), wdir)
    text = "\n".join(lines) + "\n"
    return text + ("\n" + spec.tail if spec.tail else "")


def pipeline_of(path: str, stage: str) -> str:
    return next((name for name, p in PIPELINES.items() if p.dvc_file == path and stage in p.stages), "none")


def differences(root: Path) -> list[str]:
    """One line per dvc file that is not what the declarations give, naming the pipeline and stage."""
    found = []
    for path in DVC_FILES:
        target, want = root / path, render(path, root)
        have = target.read_text() if target.exists() else None
        if have == want:
            continue
        if have is None:
            found.append(f"{path}: missing")
            continue
        try:
            old, new = yaml.safe_load(have).get("stages", {}), yaml.safe_load(want)["stages"]
        except (yaml.YAMLError, AttributeError):
            found.append(f"{path}: not a DVC file")
            continue
        stale = [s for s in dict.fromkeys([*old, *new]) if old.get(s) != new.get(s)]
        for stage in stale:
            what = "is in no declaration" if stage not in new else (
                "is missing" if stage not in old else "differs from its declaration")
            found.append(f"{path}: stage {stage} (pipeline {pipeline_of(path, stage)}) {what}")
        if not stale:
            found.append(f"{path}: its comments, order or the lines after the stages differ from the generated text")
    return found


def write_all(root: Path) -> list[Path]:
    from routerops import schema

    written = []
    for path in DVC_FILES:
        target = root / path
        text = render(path, root)
        if not target.exists() or target.read_text() != text:
            schema.write_text_atomic(text, target)
            written.append(target)
    return written


def dvc_yaml_command(args: argparse.Namespace) -> None:
    from routerops.files import check_output

    root = Path(args.root)
    check_output(root, "--root", folder=True)
    if args.check:
        stale = differences(root)
        if stale:
            raise RouteropsError("dvc.yaml files are stale (run `routerops dvc-yaml`): " + "; ".join(stale))
        print(f"{len(DVC_FILES)} dvc files match the declarations")
        return
    written = write_all(root)
    print("\n".join(f"wrote {p}" for p in written) or f"{len(DVC_FILES)} dvc files already match the declarations")


def add_dvc_yaml_parser(sub) -> None:
    parser = sub.add_parser("dvc-yaml", help="write every dvc.yaml from the pipeline declarations "
                                             "(stages/declarations.py)")
    parser.add_argument("--check", action="store_true", help="write nothing; fail if a file is stale")
    parser.add_argument("--root", default=".", help="the repository root the dvc files live under")
    parser.set_defaults(func=dvc_yaml_command)
