"""Critique-and-route controller (paper 002) and CoRL budget modes (paper 003) on RouteLLM's GSM8K
logged outcomes (bundled under datasets/), cross-fitted, beside the single-turn replay routers.

    python experiments/critique_route.py [--params params.yaml] [--set grpo.iterations=50 ...]
        [--out experiments/results/critique_route.json]

Settings come from the `critique` section of the params file (configs/paper/critique.yaml: the
papers' own values). What it prints and writes is described in README "Critique-and-route".
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from evaluation.critique import run_critique_benchmark  # noqa: E402
from models.critique.config import critique_config, load_critique_config  # noqa: E402
from routerops import schema  # noqa: E402
from routerops.errors import InputError  # noqa: E402


def overridden(path: Path, assignments: list[str]):
    """The params file's section with `section.key=value` overrides (values parsed as YAML-ish JSON)."""
    import dataclasses

    raw = dataclasses.asdict(load_critique_config(path))
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError("--set", item, "expected key=value, e.g. grpo.iterations=50")
        *parents, leaf = key.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
        try:
            node[leaf] = json.loads(value)
        except json.JSONDecodeError:
            node[leaf] = value
    return critique_config(raw, source=f"{path} with --set")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "critique_route.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cfg = overridden(args.params, args.set)
    result = run_critique_benchmark(cfg, REPO)
    result["machine"] = {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()}
    result["config"] = json.loads(json.dumps(cfg, default=lambda o: o.__dict__))
    schema.write_json_atomic(result, args.out)
    print(json.dumps(result["summary"], indent=1))
    for row in result["baselines"]:
        print(f"{row['router']}: APGR {row.get('apgr', float('nan')):.3f} best accuracy {row['best_accuracy']:.3f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
