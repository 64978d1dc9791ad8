"""What a finished `make demo` says last: the routers' leaderboard on the bundled real outcomes, the
registered champion, where the reports and plots are, how to open the UIs and where the full log is.

Read from the files the stages wrote under one Layout (nothing recomputed), so it describes exactly
the run that left them; a file a stage did not write is left out of the summary, not invented.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd

from routerops.layout import Layout

UI_COMMANDS = (
    ("make mlflow-ui", "MLflow: runs, metrics, plots and the model registry on http://127.0.0.1:5000"),
    ("make prefect-ui", "Prefect: this flow run, its tasks and their lineage on http://127.0.0.1:4200"),
)


def shown(path: Path) -> str:
    """`path` relative to the working directory when it is under it (what a person types next)."""
    try:
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else str(path)
    except ValueError:  # another drive
        return str(path)


def duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def _number(value, digits: int = 3) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def replay_rows(leaderboard: Path, top: int) -> tuple[list[str], str]:
    """The top `top` routers by APGR (the oracle, an upper bound, and single workers, which have none,
    below them), as text rows; and the table's protocol."""
    table = pd.read_csv(leaderboard)
    protocol = str(table["protocol"].iloc[0]) if "protocol" in table and len(table) else ""
    table = table.assign(_bound=table["router"].eq("oracle"), _apgr=table["apgr"].fillna(-math.inf))
    table = table.sort_values(["_bound", "_apgr"], ascending=[True, False]).head(top)
    width = max(len("router"), *(len(str(r)) for r in table["router"]))
    rows = [f"  {'router':<{width}}  APGR   95% interval    best accuracy  USD/query there"]
    for _, row in table.iterrows():
        interval = (f"[{_number(row.get('apgr_lo'))}, {_number(row.get('apgr_hi'))}]"
                    if not pd.isna(row.get("apgr_lo", math.nan)) else "")
        rows.append(f"  {row['router']:<{width}}  {_number(row['apgr']):<5}  {interval:<14}  "
                    f"{_number(row['best_accuracy']):<13}  {_number(row['usd_per_query_at_best'], 5)}")
    return rows, protocol


def champion_lines(registry: Path) -> list[str]:
    report = json.loads(registry.read_text())
    decision = report.get("decision", {})
    version = decision.get("evidence", {}).get("candidate_version") or report.get("model_uri", "").rsplit("/", 1)[-1]
    verdict = "took the alias `champion`" if decision.get("promote") else "did not take the alias `champion`"
    lines = [f"  {report.get('name')} version {version} ({report.get('family')}, chosen by "
             f"{report.get('chosen_by')}) {verdict} on the {report.get('gate_split')} split:",
             f"    {decision.get('reason', 'no decision recorded')}"]
    return lines


def serve_lines(layout: Layout, params_file: str = "params.yaml") -> list[str]:
    """How to call the champion just registered: a key, the gateway (with the pool's replay endpoints
    and llama.cpp server started), five lines of the openai SDK asking a test question of the table
    (a replay endpoint answers only its logged questions). Empty when no champion was promoted."""
    from routerops.config import load_params

    report = json.loads(layout.registry_report.read_text())
    if not report.get("decision", {}).get("promote") or not layout.tasks.is_file():
        return []
    params = load_params(layout.resolve(params_file), sections=("pool", "reprice", "track"))
    tracking = os.environ.get("MLFLOW_TRACKING_URI") or params.track.tracking_uri
    question = next((t["prompt"] for t in map(json.loads, layout.tasks.read_text().splitlines())
                     if t.get("split") == "test"), "What is 6 times 7?")
    return [
        "Serve the champion (a key, then the gateway; it starts the pool's replay endpoints and llama.cpp):",
        "  routerops gateway keys create --budget-usd 1 --name demo   # prints the api_key once",
        f"  routerops gateway serve --router {report.get('name')} --local-server --pool-file {params.pool.file} "
        f"--price-book {params.prices.evaluation} --tracking-uri {tracking} --port 8000",
        "Then, with ROUTEROPS_API_KEY set to that key (Python, openai SDK):",
        "  import os, openai",
        "  client = openai.OpenAI(base_url=\"http://127.0.0.1:8000/v1\", api_key=os.environ[\"ROUTEROPS_API_KEY\"])",
        f"  raw = client.chat.completions.with_raw_response.create(model=\"auto\", messages=[{{\"role\": \"user\", "
        f"\"content\": {json.dumps(question)}}}])",
        "  print(raw.parse().choices[0].message.content)",
        "  print({k: v for k, v in raw.headers.items() if k.startswith(\"x-routerops\")})",
        "",
    ]


def pipeline_summary(layout: Layout, log_file: Path | None = None, elapsed_s: float | None = None,
                     top: int = 5) -> str:
    """The main pipeline's closing summary, from the reports under `layout`."""
    took = f" in {duration(elapsed_s)}" if elapsed_s is not None else ""
    lines = [f"routerops pipeline finished{took}.", ""]
    replay = layout.replay_dir / "leaderboard.csv"
    if replay.is_file():
        rows, protocol = replay_rows(replay, top)
        lines += [f"Routers on real model outcomes (RouteLLM's GSM8K: GPT-4 vs Mixtral; {protocol}), by APGR:",
                  *rows, ""]
    if layout.registry_report.is_file():
        lines += ["Registered router:", *champion_lines(layout.registry_report), ""]
        lines += serve_lines(layout)
    reports = [p for p in (layout.replay_dir / "leaderboard.md", layout.replay_dir / "accuracy_cost.png",
                           layout.routers_dir / "leaderboard.md", layout.routers_dir / "accuracy_cost.png",
                           layout.eval_dir / "leaderboard.md", layout.eval_dir / "accuracy_cost.png",
                           layout.validation, layout.registry_report) if p.is_file()]
    if reports:
        lines += ["Reports and plots:", *(f"  {shown(p)}" for p in reports), ""]
    lines += ["Open the UIs:", *(f"  {command:<16} {what}" for command, what in UI_COMMANDS)]
    if log_file is not None:
        lines += ["", f"Full log of this run: {shown(log_file)}"]
    return "\n".join(lines) + "\n"
