"""The arena flow (issue 39, items 3–4): every method on the RouteLLM GSM8K pool under one split —
trivial policies, routers and the cascade → the LM critique-and-route and CoRL controllers → the
orchestrator (004; with arena.orchestrator.run) → the report
(benchmarks/results/arena.json, reports/arena/accuracy_cost.png, one MLflow run per method).

`routerops run arena` (`make arena`) runs it; each stage skips the (method, seed) outputs it already
made with the same settings, so a rerun resumes. The same stages are in pipelines/arena/dvc.yaml.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow

from evaluation.arena_config import load_arena_run
from routerops.layout import Layout
from routerops.runlog import run_flow_logged
from tasks.stages import TASKS


@flow(name="arena", log_prints=True)
def arena_flow(params_file: str = "params.yaml", root: str = ".") -> dict:
    layout = Layout(Path(root))
    run = load_arena_run(layout.resolve(params_file))
    policies = TASKS["arena-policies"](run, layout)
    lm = TASKS["arena-lm"](run, layout)
    TASKS["arena-orchestra"](run, layout)  # data/arena/orchestrator/, read by the report beside data/arena/lm
    report = TASKS["arena-report"](run, layout, policies, lm)
    print(summary(report["results"]))
    return report


def summary(results: Path) -> str:
    """One line per row: accuracy, USD and GPT-4 calls per query, and the difference to the logistic
    router at the row's own USD with its interval."""
    result = json.loads(Path(results).read_text())
    lines = [f"{'policy':58s} {'acc':>6s} {'USD/q':>9s} {'GPT-4/q':>7s}  vs logistic at equal USD"]
    for r in result["rows"]:
        d = r["comparisons"]["vs_logistic_at_usd"]
        lines.append(f"{r['policy'][:58]:58s} {r['accuracy']:6.3f} {r['usd_per_query']:9.5f} "
                     f"{r['gpt4_calls_per_query']:7.2f}  {d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"
                     + (" constant" if r["constant"] else ""))
    lines += [f"not run: {n['family']}: {n['reason']}" for n in result["not_run"]]
    return "\n".join(lines)


def run_with_log(params_file: str = "params.yaml", root: str = ".") -> dict:
    """The flow as `make arena` runs it (`routerops run arena`): quiet console, full log in a file."""
    layout = Layout(Path(root))
    return run_flow_logged("arena", arena_flow, layout.arena_reports, layout.run_log("arena"),
                           params_file=params_file, root=root)
