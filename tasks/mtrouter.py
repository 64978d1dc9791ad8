"""Prefect tasks of the MTRouter flow: thin adapters over models/mtrouter/pipeline.py that log to
MLflow (one parent run; one nested run per ablation, for the evaluation, the registration and the
promotion gate)."""

from __future__ import annotations

import json
from functools import partial

import pandas as pd
from prefect import task

from models.mtrouter import pipeline as mt
from routerops.report import to_markdown


# Collection talks to live endpoints and resumes from its journal: a retry never duplicates.
@task(name="mtrouter-collect", retries=1, retry_delay_seconds=5)
def collect_task(run: mt.MTRouterRun) -> tuple[pd.DataFrame, pd.DataFrame, list]:
    episodes, turns = mt.collect(run)
    from routerops.envs.suites import read_tasks

    return episodes, turns, read_tasks(mt.OUT / "tasks.jsonl")


@task(name="mtrouter-ablation")
def ablation_task(run: mt.MTRouterRun, name: str, episodes, turns, tasks, parent_run_id: str) -> dict:
    import mlflow

    metrics = mt.ablation_metrics(run, name, episodes, turns, {t.task_id: t for t in tasks})
    with mlflow.start_run(run_id=parent_run_id):
        with mlflow.start_run(run_name=f"ablation:{name}", nested=True):
            mlflow.log_params({"ablation": name, **{k: str(v) for k, v in mt.ABLATIONS[name].items()}})
            mlflow.log_metrics(metrics)
    return {"ablation": name, **metrics}


@task(name="mtrouter-evaluate")
def evaluate_task(run: mt.MTRouterRun, episodes, turns, tasks, parent_run_id: str) -> pd.DataFrame:
    import mlflow

    table = mt.evaluate(run, episodes, turns, tasks)
    mt.REPORT.mkdir(parents=True, exist_ok=True)
    table.to_csv(mt.REPORT / "evaluation.csv", index=False)
    (mt.REPORT / "evaluation.md").write_text(to_markdown(table) + "\n")
    with mlflow.start_run(run_id=parent_run_id):
        with mlflow.start_run(run_name="evaluation", nested=True):
            for row in table.itertuples():
                key = f"{row.policy}/{row.split}".replace(":", "_")
                mlflow.log_metrics({f"score_mean/{key}": row.score_mean, f"usd_mean/{key}": row.usd_mean})
            mlflow.log_artifact(str(mt.REPORT / "evaluation.md"))
    return table


@task(name="mtrouter-analyses")
def analyses_task(parent_run_id: str) -> list[str]:
    """§4.3 analyses of every multi-turn policy on the evaluation rollouts, plotted."""
    import mlflow

    from routerops import analyses, schema
    from routerops.envs.scienceworld_env import action_category

    episodes = schema.read_table(mt.OUT / "eval/episodes.parquet", "episodes")
    turns = schema.read_table(mt.OUT / "eval/turns.parquet", "turns")
    out = mt.REPORT / "analyses"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, compute, plot in (
        ("cost_vs_switches", analyses.cost_vs_switches, analyses.plot_cost_vs_switches),
        ("error_switch_recovery", analyses.error_switch_recovery, analyses.plot_error_switch_recovery),
        ("usage_by_phase", analyses.usage_by_phase, analyses.plot_usage),
        ("action_lift", partial(analyses.action_lift, action_of=action_category), analyses.plot_action_lift),
    ):
        frame = compute(episodes, turns)
        frame.to_csv(out / f"{name}.csv", index=False)
        plot(frame, out / f"{name}.png")
        written += [str(out / f"{name}.csv"), str(out / f"{name}.png")]
    with mlflow.start_run(run_id=parent_run_id):
        mlflow.log_artifacts(str(out), artifact_path="analyses")
    return written


@task(name="mtrouter-register")
def register_task(run: mt.MTRouterRun, tasks: list, parent_run_id: str) -> dict:
    """Log the evaluated seeds[0] router as `mtrouter-<suite>` and promote it to `champion` only if it
    beats the current champion on the ID-test tasks (the champion is rolled out on the same tasks)."""
    import mlflow

    from tasks.registry import register_mtrouter

    router, outcomes = mt.registration_candidate(run)
    metrics = {"id_test_score_mean": float(outcomes.score.mean()), "id_test_usd_mean": float(outcomes.cost_usd.mean())}
    with mlflow.start_run(run_id=parent_run_id):
        registered, decision = register_mtrouter(router, mt.suite_name(tasks), outcomes,
                                                 partial(mt.champion_outcomes, run, tasks), mt.gate_config(run),
                                                 data_hashes=mt.training_hashes(), metrics=metrics)
    summary = {"name": registered.name, "version": registered.version, "model_uri": registered.model_uri,
               "run_id": registered.run_id, "decision": decision.to_dict()}
    mt.REPORT.mkdir(parents=True, exist_ok=True)
    (mt.REPORT / "registry.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    verdict = "promoted" if decision.promote else "refused"
    print(f"{registered.name} v{registered.version}: {verdict} — {decision.reason}")
    return summary
