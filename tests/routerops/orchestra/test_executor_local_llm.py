"""One orchestrated episode through the embedded pool (configs/pool.yaml): SmolLM2 on llama.cpp's
server, the Python sandbox, every kind of LLM primitive, priced by the shipped price book."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from routerops.orchestra.executor import Executor, ExecutorConfig
from routerops.orchestra.grammar import FinalAnswer, Plan, Subtask, Turn, Verify
from routerops.orchestra.render import render_turn
from routerops.orchestra.scripted import ScriptedController
from routerops.pricing import Price, derive_costs, load_pool, load_price_book
from routerops.types import Task
from routerops.workers import build_workers
from routerops.workers.sandbox import sandbox_problem

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sandbox_problem() is not None, reason=f"no OS sandbox here: {sandbox_problem()}")]
REPO = Path(__file__).resolve().parents[3]
TASK = Task("local/1", "unit/orchestra", "test", "Codename QUOKKA-19. What is 6 times 7?", "42")

PLAN = Plan(1, (
    Subtask(1, "the product by code", (), "python", "python", "print(6 * 7)"),
    Subtask(2, "the product by a written program", (), "smol-direct", "execute_python", "Print 6 times 7."),
    Subtask(3, "a sanity check", (1,), "smol-cot", "reason", "Is this number even?"),
    Subtask(4, "an independent check", (1,), "smol-direct", "verify", "Claim: 6 times 7 is this number."),
))
SCRIPT = [render_turn(Turn(PLAN)), render_turn(Turn(FinalAnswer("42"), Verify("subtask 1 printed 42", False)))]


async def test_an_orchestrated_episode_through_the_embedded_pool(llm_url):
    pool = load_pool(REPO / "configs/pools/embedded-smollm2.yaml")
    shipped = load_price_book(REPO / "configs/prices/current.yaml")
    book = dataclasses.replace(shipped, prices={**shipped.prices, "scripted": Price(0.0, 0.0)})
    controller = ScriptedController(SCRIPT)
    workers = build_workers(pool, llm_url)
    executor = Executor(pool, workers, book, ExecutorConfig(budget_usd=0.01))
    result = await executor.run_episode(TASK, controller, "local-run", 0)
    for worker in workers.values():
        if hasattr(worker, "aclose"):
            await worker.aclose()
    episode, turns = result.episode, pd.DataFrame(result.turns)
    assert (episode["ended_by"], episode["final_answer"], episode["score"]) == ("done", "42", 1.0)
    assert episode["mode"] == "oneshot"
    calls = turns[turns["actor"] == "worker"]
    assert calls[["subtask_id", "worker"]].values.tolist() == [
        ["1", "python"], ["2", "smol-direct"], ["2", "python"], ["3", "smol-cot"], ["4", "smol-direct"]]
    assert calls["response"].iloc[0] == "42\n" and (calls["errors"] == "[]").all()
    llm = calls[calls["worker"] != "python"]
    assert (llm["prompt_tokens"] > 0).all() and (llm["completion_tokens"] > 0).all()  # llama.cpp's usage
    assert turns["cost_usd"].tolist() == pytest.approx(derive_costs(turns, book).tolist())
    assert 0 < episode["cost_usd"] <= 0.01
    assert not calls["message"].str.contains("QUOKKA").any()  # blind: the task never reaches a worker
    assert "[result of subtask 1]\n42" in json.loads(calls["message"].iloc[3])[-1]["content"]
