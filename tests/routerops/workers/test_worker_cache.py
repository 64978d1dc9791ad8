"""The deterministic-worker cache (routerops/workers/cache.py) on real workers: sympy (a tool) and LLM
workers behind a real OpenAI-compatible test server (DelayedEndpoint echoes the last user message,
reports token usage and counts requests), called through the orchestrator's SubtaskRunner, where the
executor makes its worker calls."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import sqlite3

import pytest

from routerops.orchestra.dispatch import BudgetLedger, SubtaskRunner
from routerops.orchestra.grammar import Subtask
from routerops.pricing import Pool, Price, PriceBook, WorkerSpec
from routerops.primitives import DEFAULT_PRIMITIVES
from routerops.types import WorkerResult
from routerops.workers import LLMWorker, SympyWorker
from routerops.workers.cache import WorkerCache, cache_key, is_deterministic, storable
from routerops.workers.chaos import DelayedEndpoint

GREEDY = WorkerSpec(name="greedy", kind="llm", primitives=("answer",), model="echo", concurrency=4,
                    generation={"max_tokens": 16, "temperature": 0.0, "system": "Reply briefly."}, max_retries=0)
SAMPLING = dataclasses.replace(GREEDY, name="sampling", generation={**GREEDY.generation, "temperature": 0.7})
SYMPY = WorkerSpec(name="sympy", kind="sympy", primitives=("sympy",), concurrency=2, timeout_s=10)
POOL = Pool("cache-pool", (GREEDY, SAMPLING, SYMPY), dict(DEFAULT_PRIMITIVES))


def book(version: str = "v1", greedy_input: float = 1.0) -> PriceBook:
    return PriceBook(version, dt.date(2026, 11, 1), {
        "greedy": Price(greedy_input, 2.0), "sampling": Price(1.0, 2.0), "sympy": Price(0.0, 0.0, per_call=1e-5)})


class Counting:
    """A real worker that counts the calls that reach it."""

    def __init__(self, inner):
        self.inner, self.name, self.spec, self.calls = inner, inner.name, inner.spec, 0

    async def call(self, payload, max_tokens=None):
        self.calls += 1
        return await self.inner.call(payload, max_tokens=max_tokens)


@pytest.fixture(scope="module")
def endpoint():
    with DelayedEndpoint(delay_s=0.05) as base_url:
        yield base_url


@pytest.fixture
def workers(endpoint):
    return {"greedy": Counting(LLMWorker(GREEDY, endpoint)), "sampling": Counting(LLMWorker(SAMPLING, endpoint)),
            "sympy": Counting(SympyWorker(SYMPY))}


def subtask(model: str, primitive: str, instruction: str) -> Subtask:
    return Subtask(1, "the subtask", (), model, primitive, instruction)


async def run(runner: SubtaskRunner, model: str, primitive: str, instruction: str):
    outcome = await runner.run(subtask(model, primitive, instruction), model, {}, BudgetLedger(1.0))
    [call] = outcome.calls
    return call


async def test_a_deterministic_call_is_made_once_and_replayed_with_the_same_result(tmp_path, workers):
    cache = WorkerCache(tmp_path / "cache.sqlite")
    runner = SubtaskRunner(POOL, workers, book(), cache)
    first = await run(runner, "greedy", "answer", "What is 6*7?")
    second = await run(runner, "greedy", "answer", "What is 6*7?")
    assert workers["greedy"].calls == 1 and cache.stats.snapshot() == {"hits": 1, "misses": 1, "uncacheable": 0,
                                                                       "stored": 1}
    assert first.result.prompt_tokens > 0 and first.result.completion_tokens > 0
    assert second.result == first.result  # text, tokens (and the latency the call took)
    assert second.cost_usd == first.cost_usd
    # tools too, and the file outlives the process's cache object
    await run(runner, "sympy", "sympy", "6*7+1")
    reopened = SubtaskRunner(POOL, workers, book(), WorkerCache(tmp_path / "cache.sqlite"))
    again = await run(reopened, "sympy", "sympy", "6*7+1")
    assert workers["sympy"].calls == 1 and again.result.text.strip() == "43"
    assert reopened.cache.stats.hits == 1 and len(reopened.cache) == 2


async def test_a_replayed_result_is_priced_from_its_tokens_under_the_current_book(tmp_path, workers):
    cache = WorkerCache(tmp_path / "cache.sqlite")
    fresh = await run(SubtaskRunner(POOL, workers, book("v1", greedy_input=1.0), cache), "greedy", "answer", "hi")
    # The same book version with other prices (an edited file): the key matches, the cost follows the book.
    edited = book("v1", greedy_input=5.0)
    replayed = await run(SubtaskRunner(POOL, workers, edited, cache), "greedy", "answer", "hi")
    assert workers["greedy"].calls == 1 and replayed.result == fresh.result
    r = replayed.result
    assert replayed.cost_usd == pytest.approx(edited.cost("greedy", r.prompt_tokens, r.completion_tokens, r.cached_tokens))
    assert replayed.cost_usd > fresh.cost_usd


async def test_a_new_price_book_or_other_decoding_settings_miss(tmp_path, endpoint, workers):
    cache = WorkerCache(tmp_path / "cache.sqlite")
    await run(SubtaskRunner(POOL, workers, book("v1"), cache), "greedy", "answer", "hi")
    await run(SubtaskRunner(POOL, workers, book("v2"), cache), "greedy", "answer", "hi")  # new price book
    assert workers["greedy"].calls == 2
    # another system prompt, another completion cap, another seed: other requests, other results
    for generation in ({**GREEDY.generation, "system": "Be terse."}, {**GREEDY.generation, "max_tokens": 8},
                       {**GREEDY.generation, "seed": 3}):
        spec = dataclasses.replace(GREEDY, generation=generation)
        other = {**workers, "greedy": Counting(LLMWorker(spec, endpoint))}
        pool = Pool("cache-pool", (spec, SAMPLING, SYMPY), dict(DEFAULT_PRIMITIVES))
        await run(SubtaskRunner(pool, other, book("v1"), cache), "greedy", "answer", "hi")
        assert other["greedy"].calls == 1, generation
    assert cache.stats.misses == 5 and cache.stats.hits == 0
    payload = [{"role": "user", "content": "hi"}]
    keys = {cache_key(GREEDY, "answer", payload, 16, "v1"), cache_key(GREEDY, "answer", payload, 8, "v1"),
            cache_key(GREEDY, "reason", payload, 16, "v1"), cache_key(GREEDY, "answer", payload, 16, "v2"),
            cache_key(GREEDY, "answer", [{"role": "user", "content": "hi!"}], 16, "v1")}
    assert len(keys) == 5  # the call's cap, the primitive, the book and the payload are each in the key


async def test_a_sampling_worker_is_never_cached(tmp_path, workers):
    cache = WorkerCache(tmp_path / "cache.sqlite")
    runner = SubtaskRunner(POOL, workers, book(), cache)
    for _ in range(3):
        await run(runner, "sampling", "answer", "hi")
    assert workers["sampling"].calls == 3 and cache.stats.uncacheable == 3 and len(cache) == 0
    assert not is_deterministic(SAMPLING) and is_deterministic(GREEDY) and is_deterministic(SYMPY)
    unset = dataclasses.replace(GREEDY, generation={"max_tokens": 16})  # the server's default temperature samples
    assert not is_deterministic(unset)


async def test_concurrent_identical_calls_share_one_call_and_failures_are_not_stored(tmp_path, workers):
    cache = WorkerCache(tmp_path / "cache.sqlite")
    runner = SubtaskRunner(POOL, workers, book(), cache)
    calls = await asyncio.gather(*(run(runner, "greedy", "answer", "same") for _ in range(4)))
    assert workers["greedy"].calls == 1 and cache.stats.hits == 3 and len({c.result.text for c in calls}) == 1
    assert not storable(WorkerResult(text="", error="timeout: no answer"))
    assert not storable(WorkerResult(text="Error: sympy timed out after 10s"))
    assert not storable(WorkerResult(text="Error: the program was stopped by the sandbox wall_time limit"))
    assert not cache.put("k", GREEDY, "answer", "v1", WorkerResult(text="", error="connection: refused"))
    # two writers of one key (two stages at once): the first result stays, nothing raises
    other = WorkerCache(tmp_path / "cache.sqlite")
    assert other.put("k2", GREEDY, "answer", "v1", WorkerResult(text="first", prompt_tokens=1))
    assert cache.put("k2", GREEDY, "answer", "v1", WorkerResult(text="second", prompt_tokens=1))
    assert cache.get("k2").text == "first"
    with sqlite3.connect(tmp_path / "cache.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
