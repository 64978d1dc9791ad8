"""The orchestrator's arena records (evaluation/arena_orchestra.py) without a model: episodes → the
arena's per-query format, the blind relabelling of the teacher's trajectories (004 §5), the variants'
shared SFT-start row and the Agentic-GRPO goal read off the rows (evaluation/arena_report.py)."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

from evaluation.arena_orchestra import SELF, SFT_ROW, blind_sft_records, episode_records, held_out, row_name
from routerops.types import Task

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pool_and_book():
    from routerops.pricing import load_pool, load_price_book

    return load_pool(REPO / "configs/pool.yaml"), load_price_book(REPO / "configs/prices/current.yaml")


def task(qid: str, row: int) -> Task:
    return Task(task_id=qid, suite="gsm8k", split="test", prompt=f"question {qid}", answer="1",
                meta={"verifier": "math-verify", "query_id": qid, "arena_row": row})


def test_episodes_become_the_arena_records_with_the_worker_whose_answer_stood(pool_and_book):
    pool, _ = pool_and_book
    episodes = pd.DataFrame([
        {"episode_id": "e1", "task_id": "q1", "policy": "orchestrator", "success": True, "cost_usd": 0.02,
         "mode": "oneshot", "ended_by": "done", "conversation": json.dumps([{"role": "assistant", "content": "a"}])},
        {"episode_id": "e2", "task_id": "q2", "policy": "orchestrator", "success": False, "cost_usd": 0.001,
         "mode": "oneshot", "ended_by": "done", "conversation": "[]"}])
    turns = pd.DataFrame([  # q1: GPT-4 answered after a Mixtral call; q2: the only call failed (a 404)
        {"episode_id": "e1", "turn_index": 1, "actor": "worker", "worker": "mixtral-8x7b", "response": "5"},
        {"episode_id": "e1", "turn_index": 2, "actor": "worker", "worker": "gpt-4-1106", "response": "1"},
        {"episode_id": "e2", "turn_index": 1, "actor": "worker", "worker": "gpt-4-1106", "response": ""}])
    records = episode_records(episodes, turns, [task("q1", 7), task("q2", 3)], pool)
    h = held_out(records)
    assert h == {"rows": [7, 3], "correct": [1.0, 0.0], "usd": [0.02, 0.001], "strong_calls": [1.0, 1.0],
                 "final": ["gpt-4-1106-preview", SELF]}  # the table's worker names, as the other rows'
    assert records[1]["failed_calls"] == 1 and records[0]["decisions"] == ["a"]


def test_the_teacher_trajectories_are_relabelled_as_a_blind_controller_sees_its_pool(pool_and_book):
    from routerops.orchestra.executor import ExecutorConfig, opening, worker_labels

    pool, book = pool_and_book
    config = ExecutorConfig(budget_usd=0.25, turn_limit=2, prompt="compact", anonymize_models=True)
    _, named = opening(pool, book, config, "Q?", worker_labels(pool, False, random.Random(0)))
    turn = '<plan round="1">\n<subtask id="1" depends_on="">\nsolve\n</subtask>\n</plan>\n' \
           '<route subtask="1" model="gpt-4-1106" skill="answer">\nQ?\n</route>'
    record = {"task_id": "q", "episode_id": "e", "messages": [*named, {"role": "assistant", "content": turn}]}
    [blind] = blind_sft_records([record], pool, book, config, seed=0)
    system, route = blind["messages"][0]["content"], blind["messages"][2]["content"]
    assert "gpt-4-1106" not in system + route and "mixtral-8x7b" not in system and "Worker1" in system
    label = route.split('model="')[1].split('"')[0]
    assert label.startswith("Worker") and f"- {label}: skills answer; $10 / $30" in system  # GPT-4's price row
    assert blind["messages"][1] == record["messages"][1]


def test_variants_share_one_sft_start_row_and_the_agentic_goal_reads_the_row(tmp_path):
    import numpy as np

    from evaluation.arena import Outcome, References, arena_row
    from evaluation.arena_config import OrchestratorSettings
    from evaluation.arena_report import agentic_grpo_goal, orchestrator_outcomes

    start = {"rows": [0, 1, 2, 3], "correct": [0, 0, 1, 0], "usd": [0.001] * 4, "strong_calls": [0] * 4,
             "final": ["mistralai/Mixtral-8x7B-Instruct-v0.1"] * 4}
    after = {**start, "correct": [1, 1, 1, 1], "final": ["gpt-4-1106-preview", "mistralai/Mixtral-8x7B-Instruct-v0.1"] * 2}
    for variant in ("grpo", "agentic_grpo"):
        (tmp_path / f"{variant}_seed0.json").write_text(json.dumps(
            {"policy": row_name(variant), "seed": 0, "held_out": after, "sft_start": start,
             "sft_start_policy": SFT_ROW, "evidence": {"decisions_changed_by_rl": 0.5}}))
    by_policy, starts = defaultdict(list), {}
    assert orchestrator_outcomes(tmp_path, OrchestratorSettings(run=True), by_policy, starts) == []
    assert len(by_policy[SFT_ROW]) == 1 and starts[row_name("grpo")] == starts[row_name("agentic_grpo")] == SFT_ROW
    assert by_policy[row_name("agentic_grpo")][0].meta["evidence"]["decisions_changed_by_rl"] == 0.5

    from evaluation.arena import Curve

    zeros = np.zeros((2, 4))
    sweep = Curve(np.array([0.0, 1.0]), zeros, np.array([[0.0] * 4, [0.01] * 4]), zeros)  # always wrong

    def single(usd):
        return Outcome("w", "trivial", 0, np.arange(4), np.zeros(4), np.full(4, usd), np.zeros(4), ["w"] * 4)
    refs = References(np.arange(4), [sweep], [sweep], single(0.0), single(0.01))
    row = arena_row(by_policy[row_name("agentic_grpo")], refs, 50, 0, 0.9, by_policy[SFT_ROW])
    goal = agentic_grpo_goal(row, [])
    c = row["comparisons"]
    assert c["vs_sft_start"]["diff"] == pytest.approx(0.75) and c["vs_logistic_at_usd"]["diff"] == 1.0
    assert goal["checks"] == {"above its SFT start": c["vs_sft_start"]["lo"] > 0, "not constant": True,
                              "not below the logistic router at equal USD": True,
                              "above the random mix at equal USD": True}
    assert goal["status"] == ("met" if all(goal["checks"].values()) else "not met")
    assert agentic_grpo_goal(None, [{"family": "orchestrator", "reason": "off"}]) == {"status": "not run",
                                                                                     "evidence": "off"}
