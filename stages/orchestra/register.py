"""Stage orchestra-register: the controller registered and judged by the promotion gate on val."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pandas as pd

from evaluation.serving.orchestra import Episodes, ServedOrchestrator
from evaluation.registry import Judged, register_and_promote
from evaluation.tracking import use_tracking
from routerops import schema
from routerops.envs.suites import read_tasks
from routerops.errors import InputError
from routerops.layout import Layout
from routerops.promotion import GateConfig, Outcomes
from stages.manifest import write_manifest
from stages.orchestra.config import CONTROLLER_NAME, OrchestraRun, lm_config
from stages.orchestra.workers import rollout_run_id, controller_rollouts, run_inputs

log = logging.getLogger(__name__)


def gate_config(run: OrchestraRun) -> GateConfig:
    """The paired gate on per-episode scores (the rollouts already enforced the per-episode budget)."""
    return GateConfig(objective="accuracy_at_budget", budget_usd=None, n_boot=run.gate.n_boot,
                      confidence=run.gate.confidence, min_improvement=run.gate.min_improvement,
                      seed=run.evaluation.seed)


def judged_on_val(episodes: pd.DataFrame) -> Judged:
    """Per val task: the episode's score and USD, as the registry's Judged (one operating point)."""
    val = episodes[episodes.split == "val"].set_index("task_id").sort_index()
    return Judged(list(val.index), Outcomes(val.score.to_numpy()[None], val.cost_usd.to_numpy()[None]))


def champion_on_val(run: OrchestraRun, layout: Layout, task_list: list, champion: ServedOrchestrator,
                    label: str) -> Judged:
    """Roll the registered champion out on the val tasks, as the candidate was."""
    val = [t for t in task_list if t.split == "val"]
    controller = champion.controller
    controller.version = label
    run_id = rollout_run_id(run, layout, f"gate-{label}", run_inputs(run, layout, *sorted(champion.adapter.glob("*"))))
    episodes, _ = controller_rollouts(run, layout, [(controller, val, run_id)], layout.orchestra_journals / "gate" / label)
    return judged_on_val(episodes)


REGISTERED_VERSION = "rl"  # the flow's last trained controller is the one registered


def register(run: OrchestraRun, layout: Layout, tasks: Path, adapter: Path, evaluation: Path) -> Path:
    """Register the RL'd controller (`adapter`, the flow's last) as `orchestrator`; it takes the
    `champion` alias only if it beats the champion on the val tasks (paired bootstrap gate,
    routerops/promotion.py). The SFT'd controller's val numbers stand beside it in results.csv."""
    task_list = read_tasks(tasks)
    episodes = schema.read_table(layout.orchestra_eval.episodes, "episodes")
    mine = episodes[(episodes.policy == CONTROLLER_NAME) & (episodes.policy_version == REGISTERED_VERSION)]
    if mine.empty:
        raise InputError(layout.orchestra_eval.episodes, "policy_version",
                         f"no {REGISTERED_VERSION!r} episodes: run orchestra-evaluate after orchestra-rl")
    candidate = judged_on_val(mine)
    config = lm_config(run, layout.resolve("params.yaml"))
    served = ServedOrchestrator.from_files(config.model, config.controller, Path(adapter), layout.resolve(run.pool),
                                           layout.resolve(run.price_book), Episodes(run.budget_usd, run.turn_limit, run.prompt),
                                           layout.model_cache)
    results = pd.read_csv(evaluation)
    own_rows = results[results.policy == f"{CONTROLLER_NAME}-{REGISTERED_VERSION}"]
    metrics = {f"{s}_{col}": float(v) for s, row in own_rows.set_index("split").iterrows()
               for col, v in row[["accuracy", "usd_per_episode", "valid_turn_rate"]].items()}
    metrics["val_score_mean"] = float(candidate.outcomes.correct.mean())
    hashes = {"sft_sha256": schema.file_sha256(layout.orchestra_sft), "tasks_sha256": schema.file_sha256(tasks),
              "adapter_sha256": schema.file_sha256(Path(adapter) / "adapter_model.safetensors")}
    use_tracking(run.track)
    registered, decision = register_and_promote(
        served, candidate, lambda champion, label: champion_on_val(run, layout, task_list, champion, label),
        gate_config(run), data_hashes=hashes, metrics=metrics,
        training_inputs=[layout.orchestra_sft, tasks, layout.resolve(run.pool), layout.resolve(run.price_book)],
        gate_inputs=[evaluation, tasks, layout.resolve(run.price_book)])
    summary = {"name": registered.name, "version": registered.version, "model_uri": registered.model_uri,
               "run_id": registered.run_id, "decision": decision.to_dict()}
    schema.write_json_atomic(summary, layout.orchestra_registry)
    write_manifest(layout.orchestra_manifests, "orchestra-register", {"gate": dataclasses.asdict(gate_config(run))},
                   [evaluation, tasks], [layout.orchestra_registry], {"promoted": float(decision.promote), **metrics})
    log.info("%s v%s: %s — %s", registered.name, registered.version,
             "promoted" if decision.promote else "refused", decision.reason)
    return layout.orchestra_registry
