"""Tiny in-memory fixtures for the MTRouter tests: a 3-worker pool, its price book, and logged
trajectories (single-model runs and random-router runs) in the routerops.schema tables."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pandas as pd
import pytest

from models.mtrouter.config import MTRouterConfig
from models.mtrouter.history import HashingTextEncoder, HistoryEncoder
from routerops import schema
from routerops.pricing import Pool, Price, PriceBook, WorkerSpec

WORKERS = ("cheap", "mid", "dear")


@pytest.fixture(scope="session")
def tiny_cfg() -> MTRouterConfig:
    """Small widths and few epochs so every test trains in well under a second."""
    return MTRouterConfig(encoder_kind="hashing", hashing_dim=64, hidden_dims=(32,), attr_embed_dim=8,
                          residual_dim=4, model_embed_dim=8, max_epochs=30, patience=30, dropout=0.0,
                          disk_cache=False, surface_features=False, expected_episode_length=2.0)


@pytest.fixture(scope="session")
def tiny_encoder(tiny_cfg) -> HistoryEncoder:
    return HistoryEncoder(HashingTextEncoder(tiny_cfg.hashing_dim, tiny_cfg.max_history_tokens), tiny_cfg)


@pytest.fixture(scope="session")
def pool() -> Pool:
    def spec(name: str, context: float, cutoff: float) -> WorkerSpec:
        return WorkerSpec(name=name, kind="llm", primitives=("answer",), model=name,
                          generation={"max_tokens": 32}, attributes={"context_limit": context, "knowledge_cutoff": cutoff})

    return Pool("tiny", (spec("cheap", 8192, 2023.5), spec("mid", 32768, 2024.0), spec("dear", 131072, 2024.5)))


@pytest.fixture(scope="session")
def book() -> PriceBook:
    prices = {"cheap": Price(0.1, 0.4), "mid": Price(1.0, 4.0), "dear": Price(10.0, 30.0)}
    return PriceBook("test", dt.date(2026, 1, 1), prices)


def chat(text: str) -> str:
    return json.dumps([{"role": "user", "content": text}])


def outcome(kind: str, worker: str) -> float:
    """The synthetic world: every worker solves 'easy' tasks, only 'dear' solves 'hard' ones."""
    return 1.0 if kind == "easy" or worker == "dear" else 0.0


def trajectory_tables(n_tasks: int = 24, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """Single-model runs for every (task, worker) and one 3-turn random-router run per task; the
    cheap worker's turns log a medium-severity format error. Splits: 3/4 train, 1/4 val."""
    rng = np.random.default_rng(seed)
    episodes, turns, prompts = [], [], {}
    for i in range(n_tasks):
        kind = "hard" if i % 2 else "easy"
        task_id = f"t{i}"
        prompts[task_id] = f"{kind} puzzle {i}: combine the numbers {i} and {i + 3} carefully"
        split = "val" if i % 4 == 3 else "train"
        runs = [(f"single/{w}/answer", [w]) for w in WORKERS]
        runs.append(("random_multi_turn", list(rng.choice(WORKERS, size=3))))
        for policy, workers in runs:
            eid = schema.episode_id("test", task_id, policy, 0)
            for t, w in enumerate(workers):
                errors = [{"rule": "format_error", "severity": "medium"}] if w == "cheap" else []
                message = chat(prompts[task_id] if t == 0 else f"observation after turn {t}")
                turns.append({
                    "episode_id": eid, "turn_index": t, "actor": policy, "worker": w, "primitive": "answer",
                    "subtask_id": "", "depends_on": "[]", "message": message, "response": f"{w} says {i + t}",
                    "observation": f"observation after turn {t + 1}",
                    "prompt_tokens": 100, "completion_tokens": 20, "cached_tokens": 0, "latency_s": 0.1,
                    "cost_usd": 0.0, "errors": json.dumps(errors), "propensity": 1.0,
                })
            episodes.append({
                "episode_id": eid, "run_id": "test", "task_id": task_id, "suite": "synthetic", "split": split,
                "policy": policy, "policy_version": "1", "seed": 0, "budget_usd": 1.0, "turn_limit": 4,
                "price_book_version": "test", "final_answer": "x", "score": outcome(kind, workers[-1]),
                "success": bool(outcome(kind, workers[-1])), "turns": len(workers), "prompt_tokens": 100 * len(workers),
                "completion_tokens": 20 * len(workers), "cached_tokens": 0, "cost_usd": 0.0, "ended_by": "done", "error": "",
            })
    return pd.DataFrame(episodes), pd.DataFrame(turns), prompts


@pytest.fixture(scope="session")
def tables():
    return trajectory_tables()
