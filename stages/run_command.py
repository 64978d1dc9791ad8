"""`routerops run PIPELINE [--set KEY=VALUE ...]`: the one front door to every pipeline (the make
targets call it). A pipeline with a Prefect flow runs as that flow; the critique pipelines, which have
none, run their stages in order, as `routerops stage NAME` would.

`--set orchestra.rl.max_steps=4` changes one value for this run without editing params.yaml: the
params file with the changes applied is written under <root>/.routerops/run/, checked by the
pipeline's own config loader first (an unknown or mistyped key is refused naming the `--set`), and the
pipeline reads it. Values are YAML (`--set materialise.families='[gcd, lcm]'`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from routerops.errors import InputError
from routerops.files import read_yaml_mapping
from stages.declarations import PIPELINES, Pipeline  # declared with their stages there


def add_run_parser(sub) -> None:
    run = sub.add_parser("run", help="run a whole pipeline: " + ", ".join(PIPELINES),
                         description="\n".join(f"{name}: {p.help}" for name, p in PIPELINES.items()),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("name", metavar="PIPELINE", choices=list(PIPELINES))
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="change one params value for this run, e.g. orchestra.rl.max_steps=4 (repeatable)")
    run.add_argument("--params", default="params.yaml", help="relative to --root")
    run.add_argument("--root", default=".", help="where data/, reports/ and mlflow/ live")
    run.set_defaults(func="stages.run_command:run_command")


def parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, value = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(part.strip() for part in parts):
        raise InputError("command line", "--set", f"expected KEY=VALUE with a dotted KEY, got {text!r}")
    try:
        return [p.strip() for p in parts], yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError as exc:
        raise InputError("command line", f"--set {key}", f"the value is not YAML: {exc.problem}") from None


def apply_overrides(params: dict, overrides: list[str]) -> dict:
    """`params` with each KEY=VALUE set (sections created as needed); the input is not changed."""
    out = yaml.safe_load(yaml.safe_dump(params)) or {}
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise InputError("command line", f"--set {text.partition('=')[0]}",
                                 f"{'.'.join(parts[:i + 1])} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return out


def params_for_run(name: str, root: Path, params: str, overrides: list[str]) -> Path:
    """The params file the pipeline reads: --params itself, or a copy with the overrides applied."""
    source = root / params
    if not overrides:
        return source
    changed = apply_overrides(read_yaml_mapping(source), overrides)
    target = root / ".routerops" / "run" / f"{name}.params.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    from routerops import schema  # pandas: only when a run has overrides, not at parse time

    schema.write_text_atomic(f"# {source} with: {' '.join(overrides)}\n" + yaml.safe_dump(changed, sort_keys=False),
                             target)
    return target


def check_config(pipeline: Pipeline, path: Path, overrides: list[str]) -> None:
    """The pipeline's own loader on the file it will read; an error in a key given with --set names it."""
    from stages import resolve

    try:
        resolve(pipeline.config)(path)
    except InputError as exc:
        for text in overrides:
            key = text.partition("=")[0].strip()
            if exc.field == key or exc.field.startswith(key + ".") or key.startswith(exc.field + "."):
                raise InputError("command line", f"--set {key}", exc.problem) from None
        raise


def run_command(args: argparse.Namespace) -> None:
    from routerops.files import check_output
    from stages import resolve, run_stage

    root = Path(args.root)
    check_output(root, "--root", folder=True)
    pipeline = PIPELINES[args.name]
    params = params_for_run(args.name, root, args.params, args.overrides)
    check_config(pipeline, params, args.overrides)
    if pipeline.flow:
        flow = resolve(pipeline.flow)
        if hasattr(flow, "fn"):  # a Prefect flow itself: SIGTERM / Ctrl-C cancel it cleanly (stages/flow_runner.py)
            from stages.flow_runner import prefect_home, run_flow_cancellable

            run_flow_cancellable(flow, args.name, params, prefect_home(), params_file=str(params.resolve()),
                                 root=str(root))
            return
        flow(params_file=str(params.resolve()), root=str(root))
        return
    for stage in pipeline.stages:
        print(run_stage(stage, str(params.resolve()), str(root)))
