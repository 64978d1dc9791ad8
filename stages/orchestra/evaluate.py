"""Stage orchestra-evaluate: base, SFT and RL controllers beside the baselines on test and OOD."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from evaluation.orchestra_results import controller_rows, results_table, write_results_report
from routerops.envs.suites import read_tasks
from routerops.layout import Layout
from stages.manifest import write_manifest
from stages.orchestra.config import OrchestraRun
from stages.orchestra.workers import load_controller, rollout_run_id, controller_rollouts, tasks_of, run_inputs

log = logging.getLogger(__name__)


EVAL_SPLITS = ["val", "test", "ood"]  # val: the promotion gate's tasks; test and OOD: the report


def evaluate(run: OrchestraRun, layout: Layout, tasks: Path, adapter: Path, rl_adapter: Path,
             baselines_table: Path) -> Path:
    """The controller before (π(0)), after SFT and after RL, rolled out on val, test and OOD through the
    real executor; its rows (accuracy, USD per episode, valid-turn rate, modes) beside the baselines' in
    one table (reports/orchestra/results.*)."""
    task_list = tasks_of(read_tasks(tasks), EVAL_SPLITS, tasks)
    versions = {"base": None, "sft": Path(adapter), "rl": Path(rl_adapter)}
    adapter_files = [f for weights in versions.values() if weights for f in sorted(weights.glob("*"))]
    batches = []
    for version, weights in versions.items():
        controller = load_controller(run, layout, weights, version)
        inputs = run_inputs(run, layout, tasks, *(sorted(weights.glob("*")) if weights else []))
        batches.append((controller, task_list, rollout_run_id(run, layout, f"eval-{version}", inputs)))
    out = layout.orchestra_eval
    episodes, turns = controller_rollouts(run, layout, batches, out.folder)
    reported = ["test", "ood"]
    table = results_table(controller_rows(episodes, turns, EVAL_SPLITS), pd.read_csv(baselines_table), reported)
    book = run.market(layout).evaluation.book
    notes = [f"orchestrator-base is π(0), the untrained {run.model.name}; orchestrator-sft adds the LoRA "
             "adapter of the SFT stage (trained on D_SFT, train tasks only); orchestrator-rl continues it with "
             f"{run.rl.advantages.estimator} on train-task rollouts (orchestra-rl).",
             "valid_turn_rate: controller turns the strict grammar parser accepted; "
             + ("a malformed turn ends its episode." if run.evaluation.end_on_malformed
                else "a malformed turn is answered with an <error> block and retried within Tmax."),
             "mode_*: share of episodes in each behaviour mode (004 App. E, Tab. 14).",
             "Baseline rows: reports/orchestra/baselines.md says how each was fitted and chosen.",
             "val rows: the controller only, the promotion gate's evidence (the baselines chose their λ there)."]
    reports = write_results_report(table, layout.orchestra_results, layout.orchestra_results_markdown, book.version,
                                   notes)
    metrics = {f"{col}/{row.split}/{row.policy}": float(getattr(row, col))
               for row in table[table.kind == "orchestrator"].itertuples()
               for col in ("accuracy", "usd_per_episode", "valid_turn_rate")}
    write_manifest(layout.orchestra_manifests, "orchestra-evaluate", run,
                   [tasks, *adapter_files, baselines_table], [*out.paths(), *reports], metrics, artifacts=reports[1:])
    return layout.orchestra_results
