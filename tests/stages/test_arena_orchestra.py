"""The orchestrator's arena unit end to end at tiny scale (stages/arena_orchestra.py): the first 60
queries of the bundled RouteLLM GSM8K table served by a replay endpoint, SmolLM2 live, the search
teacher, one SFT step, one Agentic-GRPO step at G = 2, two test queries. Its record has the arena's
per-query format, and the report turns it into an `orchestrator` row paired with its SFT start."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny_orchestra(tmp_path, monkeypatch) -> Path:
    from routerops.envs.replay import import_routellm_gsm8k, write_logged_outcomes

    table = pd.read_csv(REPO / "datasets/routellm/gsm8k_responses.csv").head(60)
    table.to_csv(tmp_path / "tiny.csv", index=False)
    (tmp_path / "contaminated.jsonl").write_text("")
    fewshot = REPO / "datasets/gsm8k/train_first8.jsonl"
    replay = import_routellm_gsm8k(tmp_path / "tiny.csv", contaminated_path=tmp_path / "contaminated.jsonl",
                                   train_path=fewshot)
    write_logged_outcomes(replay, tmp_path / "data/replay/routellm_gsm8k.parquet")  # what configs/pool.yaml names
    arena = {"table": str(tmp_path / "tiny.csv"), "contaminated": str(tmp_path / "contaminated.jsonl"),
             "fewshot": str(fewshot),
             "split": {"seed": 0, "fractions": [0.6, 0.2, 0.2], "min_test_queries": 10},
             "routers": ["logistic"], "seeds": [0], "bootstrap": 50, "knob_points": 11,
             "lm": {"critique": False, "corl": False},
             "orchestrator": {"run": True, "variants": ["agentic_grpo"], "pool": str(REPO / "configs/pool.yaml"),
                              "price_book": str(REPO / "configs/prices/current.yaml"),
                              "answers": str(REPO / "datasets/gsm8k/test_answers.jsonl"),
                              "train_queries": 2, "eval_queries": 2, "sft_steps": 1, "rl_steps": 1, "group_size": 2,
                              "probe": False, "max_new_tokens": 48, "max_seq_len": 768, "turn_limit": 2}}
    params = {"arena": arena, "prices": {"replay": str(REPO / "configs/prices/routellm-2024.yaml")}, "track": {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
                                        "artifact_root": str(tmp_path / "artifacts"), "experiment": "arena-test"}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.mark.slow
def test_the_orchestrator_unit_writes_records_the_report_turns_into_rows(tiny_orchestra, caplog):
    from stages import run_stage

    run_stage("arena-policies", "params.yaml", tiny_orchestra)
    folder = Path(run_stage("arena-orchestra", "params.yaml", tiny_orchestra))
    record = json.loads((folder / "agentic_grpo_seed0.json").read_text())
    assert record["policy"] == "orchestrator (004): Agentic-GRPO" and record["seed"] == 0 and record["key"]
    index = json.loads((tiny_orchestra / "data/arena/policies/index.json").read_text())
    for part in ("held_out", "sft_start"):
        h = record[part]
        assert set(h) == {"rows", "correct", "usd", "strong_calls", "final"}
        assert h["rows"] == index["split"]["test"][:2]  # the first two test queries of the arena's split
        assert all(len(h[k]) == 2 for k in h) and all(c in (0.0, 1.0) for c in h["correct"])
    assert len(record["evidence"]["train"]["train_return_mean"]) == 1  # one RL step, its reward recorded
    assert record["evidence"]["curriculum"]["teacher_tasks"] == 2

    caplog.set_level("INFO", logger="stages.arena_orchestra")
    run_stage("arena-orchestra", "params.yaml", tiny_orchestra)  # a rerun: the record is cached
    assert "seed 0 cached" in caplog.text

    out = run_stage("arena-report", "params.yaml", tiny_orchestra)
    result = json.loads(Path(out["results"]).read_text())
    rows = {r["policy"]: r for r in result["rows"]}
    rl, start = rows["orchestrator (004): Agentic-GRPO"], rows["orchestrator (004): SFT start"]
    assert rl["family"] == start["family"] == "orchestrator" and rl["test_queries"] == 2
    assert "vs_sft_start" in rl["comparisons"] and "evidence" in rl
    assert abs(sum(rl["action_shares"].values()) - 1) < 1e-9
    assert "orchestrator" not in {n["family"] for n in result["not_run"]}
    assert result["goals"]["agentic_grpo"]["status"] in ("met", "not met")
