"""The arena's stages (issue 39, items 3–4): every method on the RouteLLM GSM8K pool under one protocol.

- `arena-policies`: trivial policies, the registry's routers and the cascade, fitted on train, their
  knob chosen on val, read on test; one cached output per (method, seed) under data/arena/policies/;
- `arena-lm`: the LM critique-and-route (002) and CoRL (003) controllers re-run on the same split by
  evaluation/critique_lm.py (its `held_out` per-query records), one cached output per (controller, seed);
- `arena-report`: every row, the paired comparisons, benchmarks/results/arena.json, the plot, one MLflow
  run per method, and the logistic router's operating point through the promotion gate.

A rerun skips every (method, seed) whose cached output was made with the same settings (its `key`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from evaluation.arena import settings_key
from evaluation.arena_config import ArenaRun
from routerops import schema
from routerops.layout import Layout

log = logging.getLogger(__name__)


def cached(path: Path, key: str) -> dict | None:
    if not path.is_file():
        return None
    try:
        done = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return done if done.get("key") == key else None


def policies(run: ArenaRun, layout: Layout) -> Path:
    """Trivial policies, routers and the cascade: data/arena/policies/<method>_seed<s>.npz (+ .json)."""
    from evaluation.arena_policies import run_policies

    folder = layout.arena_data / "policies"
    run_policies(run.arena, layout.root, folder)
    return folder


def lm(run: ArenaRun, layout: Layout) -> Path:
    """The LM controllers on the arena's split: data/arena/lm/<controller>_seed<s>.json."""
    import dataclasses

    folder = layout.arena_data / "lm"
    settings = run.arena.lm
    units = ([("critique", ("with_multipliers",), False)] if settings.critique else []) + \
            ([("corl", (), True)] if settings.corl else [])
    for name, variants, corl in units:
        for seed in settings.seeds:
            protocol = dataclasses.replace(run.critique_lm.protocol, seeds=(seed,))
            cfg = dataclasses.replace(run.critique_lm, protocol=protocol)
            key = settings_key(name, dataclasses.asdict(cfg) | {"source": ""})
            out = folder / f"{name}_seed{seed}.json"
            if cached(out, key) is not None:
                log.info("arena-lm: %s seed %d cached", name, seed)
                continue
            from evaluation.critique_lm import run_critique_lm  # torch, transformers, peft only here

            partial = folder / f"{name}_seed{seed}.partial.json"

            def progress(part: dict, partial: Path = partial, key: str = key, name: str = name) -> None:
                # What a killed unit leaves behind: the SFT start's held-out evaluation and each RL step's
                # training row (the rows report only finished units; this file is evidence, not a row).
                schema.write_json_atomic({"key": key, "controller": name, **part}, partial)

            result = run_critique_lm(cfg, layout.root, folder / "work", layout.model_cache, variants=variants,
                                     corl=corl, on_progress=progress)
            schema.write_json_atomic({"key": key, "controller": name, "seed": seed, **result}, out)
    return folder


def report(run: ArenaRun, layout: Layout, policies_dir: Path, lm_dir: Path) -> dict[str, Path]:
    """arena.json, the plot, MLflow runs and registration."""
    from evaluation.arena_report import write_arena
    from stages.manifest import write_manifest

    outputs = write_arena(run, layout, Path(policies_dir), Path(lm_dir))
    result = json.loads(outputs["results"].read_text())
    metrics = {f"{r['policy']}/{k}": r[k] for r in result["rows"] for k in ("accuracy", "usd_per_query")}
    write_manifest(layout.manifests, "arena-report", {"arena": str(run.arena)}, [], [outputs["results"], outputs["plot"]],
                   metrics)
    return outputs
