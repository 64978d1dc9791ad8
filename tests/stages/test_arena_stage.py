"""The arena's stages end to end on a tiny table (the first 60 queries of the bundled RouteLLM GSM8K
table, the logistic router and the cascade only, no LM): a valid arena.json, the plot, one MLflow run
per row, and a rerun that skips every (method, seed) already done."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FIELDS = {"policy", "family", "seeds", "test_queries", "accuracy", "usd_per_query", "gpt4_calls_per_query",
          "action_shares", "constant", "comparisons"}


@pytest.fixture
def tiny_arena(tmp_path, monkeypatch) -> Path:
    table = pd.read_csv(REPO / "datasets/routellm/gsm8k_responses.csv").head(60)
    table.to_csv(tmp_path / "tiny.csv", index=False)
    (tmp_path / "contaminated.jsonl").write_text("")
    arena = {"table": str(tmp_path / "tiny.csv"), "contaminated": str(tmp_path / "contaminated.jsonl"),
             "fewshot": str(REPO / "datasets/gsm8k/train_first8.jsonl"),
             "split": {"seed": 0, "fractions": [0.6, 0.2, 0.2], "min_test_queries": 10},
             "routers": ["logistic"], "seeds": [0], "bootstrap": 50, "knob_points": 11,
             "lm": {"critique": False, "corl": False}}
    params = {"arena": arena, "prices": {"replay": str(REPO / "configs/prices/routellm-2024.yaml")}, "track": {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
                                        "artifact_root": str(tmp_path / "artifacts"), "experiment": "arena-test"}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.mark.slow
def test_the_arena_stages_write_every_row_the_plot_and_resume(tiny_arena, caplog):
    from stages import run_stage

    policies = run_stage("arena-policies", "params.yaml", tiny_arena)
    lm = run_stage("arena-lm", "params.yaml", tiny_arena)
    out = run_stage("arena-report", "params.yaml", tiny_arena)

    result = json.loads(Path(out["results"]).read_text())
    assert Path(out["results"]) == tiny_arena / "benchmarks/results/arena.json"
    rows = {r["policy"]: r for r in result["rows"]}
    assert {r["family"] for r in rows.values()} == {"trivial", "oracle", "router", "cascade"}
    assert len(rows) == 2 + 1 + 4 + 2  # always each worker, the oracle, four random mixes, logistic, cascade
    for row in rows.values():
        assert FIELDS <= set(row) and row["test_queries"] == 12  # 60 queries, a fifth for test
        assert set(row["comparisons"]) == {"vs_logistic_at_usd", "vs_cascade_at_gpt4_calls", "vs_random_mix_at_usd"}
        assert abs(sum(row["action_shares"].values()) - 1) < 1e-9
    assert rows["always gpt-4-1106-preview"]["constant"] and rows["always gpt-4-1106-preview"]["gpt4_calls_per_query"] == 1
    assert rows["oracle (cheapest correct)"]["accuracy"] >= max(r["accuracy"] for r in rows.values())
    assert rows["logistic"]["comparisons"]["vs_logistic_at_usd"]["diff"] == 0  # itself at its own cost
    assert "knob_chosen_on_val" in rows["logistic"] and "logistic" in result["curves"]
    assert {n["family"] for n in result["not_run"]} == {"critique_lm", "corl_lm", "orchestrator"}
    assert result["goals"]["agentic_grpo"]["status"] == "not run"
    assert len(result["mlflow_runs"]) == len(rows)
    plot = tiny_arena / "reports/arena/accuracy_cost.png"
    assert out["plot"] == plot and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["table"].read_text().count("\n| ") == len(rows)  # one Markdown line per row

    index = json.loads((Path(policies) / "index.json").read_text())
    test = set(index["split"]["test"])
    assert not test & set(index["split"]["train"]) and not test & set(index["split"]["val"])
    made = {p: p.stat().st_mtime_ns for p in Path(policies).glob("*.npz")}
    caplog.set_level("INFO", logger="evaluation.arena_policies")
    run_stage("arena-policies", "params.yaml", tiny_arena)  # a rerun: every output is cached
    assert {p: p.stat().st_mtime_ns for p in Path(policies).glob("*.npz")} == made
    assert "logistic seed 0 cached" in caplog.text and Path(lm).name == "lm"
