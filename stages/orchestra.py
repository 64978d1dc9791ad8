"""The orchestrator's stages (paper 004, Uno-Orchestra §4): tasks → teacher → verifier filter → SFT →
evaluate → register.

Each is `stage(run, layout, *inputs) -> outputs` like every other stage (stages/pipeline.py): the
Prefect tasks of flows/orchestra.py and `routerops stage orchestra-…` (dvc.yaml) call them. Defaults
live in params.yaml, section `orchestra` (small scale for this CPU); configs/paper/orchestra.yaml is
the paper-scale run. The controller trains on train tasks only; the promotion gate judges on val;
test and OOD are only rolled out on.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from routerops.envs.suites import materialise_suites, write_tasks
from routerops.errors import InputError
from routerops.layout import Layout
from stages.manifest import write_manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OrchestraTasks:
    """The task pool D_0 (004 §4): verifiable reasoning-gym families, one held out as OOD. The split
    seeds are per (family, split), so with the main pipeline's families and seed the test and OOD
    tasks are the main pipeline's, whatever the train size."""

    families: list[str] = field(default_factory=lambda: ["basic_arithmetic", "chain_sum", "gcd", "lcm"])
    ood_families: list[str] = field(default_factory=lambda: ["decimal_chain_sum"])
    train: int = 12  # tasks per family: the teacher's pool, split by the filter into D_SFT and D_RL
    val: int = 2  # the promotion gate's tasks
    test: int = 4
    ood: int = 6
    seed: int = 7


@dataclass(frozen=True)
class OrchestraRun:
    """params.yaml → orchestra."""

    pool: str = "configs/pool.yaml"
    price_book: str = "configs/prices/current.yaml"
    tasks: OrchestraTasks = field(default_factory=OrchestraTasks)
    budget_usd: float = 0.01  # per episode, checked before every worker call
    turn_limit: int = 8  # Tmax, controller turns per episode (004 App. B: Tmax = 8)


def load_run(path: str | Path = "params.yaml") -> OrchestraRun:
    raw = (yaml.safe_load(Path(path).read_text()) or {}).get("orchestra", {}) or {}
    return _build(OrchestraRun, raw, path, "orchestra")


def _build(cls, raw, path, where: str):
    if not isinstance(raw, dict):
        raise InputError(path, where, f"expected a mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise InputError(path, f"{where}.{unknown[0]}", "unknown key")
    values = {}
    for name, value in raw.items():
        default = fields[name].default_factory() if fields[name].default_factory is not dataclasses.MISSING else None
        values[name] = _build(type(default), value, path, f"{where}.{name}") if dataclasses.is_dataclass(default) else value
    return cls(**values)


# ---------------------------------------------------------------- stage: tasks


def tasks(run: OrchestraRun, layout: Layout) -> Path:
    """D_0: the procedural QA tasks the teacher, the filter and the evaluation share."""
    cfg = run.tasks
    pool = materialise_suites(families=list(cfg.families), ood_families=list(cfg.ood_families),
                              sizes={"train": cfg.train, "val": cfg.val, "test": cfg.test, "ood": cfg.ood},
                              seed=cfg.seed)
    write_tasks(pool, layout.orchestra_tasks)
    counts = pd.Series([t.split for t in pool]).value_counts().to_dict()
    write_manifest(layout.orchestra_manifests, "orchestra-tasks", run, [], [layout.orchestra_tasks],
                   {f"tasks_{k}": int(v) for k, v in counts.items()})
    return layout.orchestra_tasks
