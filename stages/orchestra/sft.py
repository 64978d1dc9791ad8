"""Stages orchestra-probe (π(0) on the teacher's tasks), orchestra-filter (004 eq. 3: the verifier
filter into D_SFT and D_RL) and orchestra-sft (the LoRA warm start)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from evaluation.orchestra_results import controller_rows
from evaluation.sft_tracking import train_sft_tracked
from models.orchestrator.sft import RESULT_FILE, holds_other_run
from routerops import schema
from routerops.envs.suites import read_tasks, write_tasks
from routerops.errors import RouteropsError
from routerops.layout import Layout, Trajectories
from routerops.orchestra.curriculum import (
    REASON_CODES, curriculum_expectations, filter_curriculum, sft_records,
)
from routerops.validation import ephemeral_context, run_suite
from stages.manifest import write_manifest
from stages.orchestra.config import OrchestraRun, lm_config
from stages.orchestra.workers import load_controller, rollout_run_id, controller_rollouts, tasks_of, run_inputs

log = logging.getLogger(__name__)


def verifier_filter(run: OrchestraRun, layout: Layout, tasks: Path, teacher_out: Trajectories,
                    probe: Trajectories | None = None) -> dict[str, Path]:
    """D_SFT, D_RL and the reason for every trajectory (004 eq. 3, App. A.4), gated by a
    great-expectations suite on what it writes: a failed check writes nothing and raises."""
    task_list = read_tasks(tasks)
    episodes, turns = schema.read_table(teacher_out.episodes, "episodes"), schema.read_table(teacher_out.turns, "turns")
    probe_episodes = schema.read_table(probe.episodes, "episodes") if probe and probe.episodes.is_file() else None
    curriculum = filter_curriculum(task_list, episodes, turns, probe_episodes)
    check_curriculum(curriculum)
    paths = {"sft": layout.orchestra_sft, "rl": layout.orchestra_rl_tasks, "decisions": layout.orchestra_decisions}
    write_jsonl_atomic(sft_records(curriculum.sft), paths["sft"])
    write_tasks(curriculum.rl_tasks, paths["rl"])
    schema.write_csv_atomic(curriculum.decisions, paths["decisions"])
    counts = curriculum.decisions.reason.value_counts().to_dict()
    write_manifest(layout.orchestra_manifests, "orchestra-filter", run, [tasks, *teacher_out.paths()], paths.values(),
                   {"sft_trajectories": len(curriculum.sft), "rl_tasks": len(curriculum.rl_tasks),
                    "sft_tasks": int(curriculum.sft.task_id.nunique()),
                    **{f"modes/{k}": int(v) for k, v in curriculum.sft["mode"].value_counts().items()},
                    **{f"reasons/{REASON_CODES[k]}": int(v) for k, v in counts.items()}})
    return paths


def check_curriculum(curriculum) -> None:
    """The great-expectations gate on the filter's outputs (routerops/orchestra/curriculum.py)."""
    import great_expectations.expectations as gxe

    context = ephemeral_context()
    suites = curriculum_expectations(gxe)
    results = [*run_suite(context, "decisions", curriculum.decisions, suites["decisions"])]
    if len(curriculum.sft):
        results += run_suite(context, "sft", curriculum.sft, suites["sft"])
    failed = [r for r in results if not r.success]
    if failed:
        raise RouteropsError("curriculum data gate failed: " + "; ".join(f"{r.table}.{r.check}" for r in failed))


def write_jsonl_atomic(records: list[dict], path: Path) -> Path:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return schema.write_text_atomic(text, path)


def probe(run: OrchestraRun, layout: Layout, tasks: Path) -> Trajectories:
    """The cold-start controller π(0) (the base model, no adapter) on the teacher's tasks: the filter
    drops the tasks it already solves (004 eq. 3: no learning signal)."""
    chosen = tasks_of(read_tasks(tasks), run.teacher.splits, tasks)
    controller = load_controller(run, layout)
    run_id = rollout_run_id(run, layout, "probe", run_inputs(run, layout, tasks))
    out = layout.orchestra_probe
    episodes, turns = controller_rollouts(run, layout, [(controller, chosen, run_id)], out.folder)
    rows = controller_rows(episodes, turns, sorted(set(episodes.split)))
    write_manifest(layout.orchestra_manifests, "orchestra-probe", run, run_inputs(run, layout, tasks), out.paths(),
                   {"episodes": len(episodes), "solved": int(episodes.success.sum()),
                    **{f"valid_turn_rate/{r.split}": float(r.valid_turn_rate) for r in rows.itertuples()}})
    return out


def sft(run: OrchestraRun, layout: Layout, sft_data: Path) -> Path:
    """LoRA SFT of the controller on D_SFT (models/orchestrator/sft.py: TRL's SFTTrainer, loss on the
    controller's tokens only, 004 App. E), tracked in MLflow (curve, settings, adapter). A rerun
    resumes from the last checkpoint of the same run; other data or settings start over."""
    config = lm_config(run, layout.resolve("params.yaml"))
    out_dir = layout.orchestra_sft_run
    resume = not holds_other_run(config, sft_data, out_dir)
    if not resume:
        log.info("%s holds another SFT run's checkpoints (other data or settings): starting over", out_dir)
    result, mlflow_run = train_sft_tracked(config, sft_data, out_dir, track=run.track, resume=resume,
                                           model_cache=layout.model_cache)
    losses = [p["loss"] for p in result.loss_curve if "loss" in p]
    metrics = {"global_step": result.global_step, "train_seconds": result.train_seconds,
               **{f"data/{k}": v for k, v in result.data.items()}}
    if losses:
        metrics.update(first_loss=losses[0], last_loss=losses[-1])
    write_manifest(layout.orchestra_manifests, "orchestra-sft", {"sft": run.sft, "model": run.model,
                                                                "mlflow_run": mlflow_run or ""},
                   [sft_data], [*sorted(result.adapter_dir.glob("*")), out_dir / RESULT_FILE], metrics)
    return result.adapter_dir
