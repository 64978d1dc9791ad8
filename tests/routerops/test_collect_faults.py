"""Collection against the real local llama.cpp server behind a proxy that injects faults on 20% of
calls (hangs past the timeout, 429, 500, truncated bodies): it finishes, with every episode either
complete or carrying its error, exactly the planned episodes, budgets kept."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from routerops import schema
from routerops.envs.qa import QAEnvironment
from routerops.policies import RandomMultiTurnPolicy, SinglePolicy, UniformRandomRouter
from routerops.pricing import load_pool, load_price_book
from routerops.rollout import collect, prompt_token_bound
from routerops.types import Task
from routerops.workers import build_workers
from routerops.workers.chaos import FaultProxy

REPO = Path(__file__).resolve().parents[2]
BUDGET, TURN_LIMIT = 0.01, 3
# llama.cpp's server answers one request at a time, so the client timeout must cover a queue of
# CONCURRENCY calls on a busy 2-core machine; the proxy's hangs outlast it.
CONCURRENCY, MAX_TOKENS, TIMEOUT_S, HANG_S = 2, 8, 10.0, 12.0
TASKS = [Task(task_id=f"add/{i}", suite="unit/add", split="train", prompt=f"What is {i} + {2 * i}?",
              answer=str(3 * i)) for i in range(1, 5)]
POLICIES = [SinglePolicy("smol-direct"), UniformRandomRouter(seed=1), RandomMultiTurnPolicy(stop_prob=0.5, seed=1)]


def faulty_pool(proxy_url: str):
    """The embedded pool's LLM workers, pointed at the proxy, with small outputs."""
    pool = load_pool(REPO / "configs" / "pools" / "embedded-smollm2.yaml")
    llms = []
    for spec in pool.workers:
        if spec.kind == "llm":
            generation = {**spec.generation, "max_tokens": MAX_TOKENS}
            llms.append(dataclasses.replace(spec, endpoint=proxy_url, generation=generation,
                                            timeout_s=TIMEOUT_S, concurrency=CONCURRENCY))
    return dataclasses.replace(pool, workers=tuple(llms))


@pytest.mark.slow
async def test_collection_through_injected_faults_finishes_with_the_planned_episodes(tmp_path, llm_url):
    book = load_price_book(REPO / "configs" / "prices" / "collection-2026-11.yaml")
    proxy = FaultProxy(llm_url, fault_rate=0.2, seed=3, hang_s=HANG_S)
    with proxy as proxy_url:
        pool = faulty_pool(proxy_url)
        workers = build_workers(pool, None)
        episodes, turns = await collect(TASKS, POLICIES, QAEnvironment(), workers, book, BUDGET, TURN_LIMIT,
                                        tmp_path, "faults", 0, concurrency=CONCURRENCY, progress=False)
        for worker in workers.values():
            await worker.aclose()

    planned = {schema.episode_id("faults", t.task_id, p.name, 0) for t in TASKS for p in POLICIES}
    assert set(episodes["episode_id"]) == planned and episodes["episode_id"].is_unique
    assert len(schema.read_table(tmp_path / "episodes.parquet", "episodes")) == len(planned) == 12
    failed = episodes[episodes["ended_by"] == "error"]
    completed = episodes[episodes["ended_by"] != "error"]
    assert (failed["error"].str.len() > 0).all() and (completed["error"] == "").all()
    assert sum(proxy.faults.values()) > 0, "the proxy injected no fault: the test proved nothing"
    assert sum(w.stats.attempts - w.stats.calls for w in workers.values()) > 0  # faults were retried
    assert (episodes["cost_usd"] <= BUDGET).all()
    answered = turns[turns["response"] != ""]
    assert len(answered) > 0 and (answered["prompt_tokens"] > 0).all()
    # The pre-call budget check over-estimates the real tokenizer's prompt count, call by call.
    systems = {spec.name: spec.generation.get("system", "") for spec in pool.workers}
    for turn in answered.itertuples():
        assert turn.prompt_tokens <= prompt_token_bound(json.loads(turn.message), systems[turn.worker])
        assert turn.completion_tokens <= MAX_TOKENS
