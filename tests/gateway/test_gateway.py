"""The gateway end to end: the official openai client → the gateway (uvicorn in a thread) → the real
llama.cpp server (SmolLM2), with a real router registered in a temp MLflow store (SQLite).

The registered router reads surface statistics of the query (no encoder to load): it learned that
the direct worker answers arithmetic and the chain-of-thought worker answers capitals, so which
worker a query reaches is known in advance. Generation is kept to a few tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from evaluation.registry import CHAMPION_ALIAS, register
from evaluation.serving.single_turn import ServedRouter
from gateway.app import Gateway, GatewayConfig
from gateway.routing import prompt_token_bound
from gateway.store import period_start, read_decisions
from models.base import RoutingData
from models.baselines import LogisticRouter, QueryFeaturizer
from routerops.pricing import load_pool, load_price_book
from routerops.workers.server import free_port

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
POOL, BOOK = load_pool(REPO / "configs" / "pools" / "embedded-smollm2.yaml"), load_price_book(REPO / "configs" / "prices" / "current.yaml")
WORKERS = ["smol-direct", "smol-cot"]
NAME = "router-gw-surface"
ARITH = [{"role": "user", "content": "What is 17 plus 25?"}]
CAPITAL = [{"role": "user", "content": "Which city is the capital of France?"}]
MAX_TOKENS = 8


def training_data(n: int = 80, shuffle: bool = False) -> RoutingData:
    """Arithmetic: only the direct worker is right; capitals: only the chain-of-thought one."""
    rng = np.random.default_rng(0)
    countries = ["France", "Japan", "Kenya", "Peru", "Canada", "Egypt", "Norway", "Chile"]
    queries, scores = [], []
    for i in range(n):
        if i % 2:
            queries.append(f"What is {rng.integers(10, 999)} plus {rng.integers(10, 999)} times {rng.integers(2, 9)}?")
            scores.append([1.0, 0.0])
        else:
            queries.append(f"Which city is the capital of {countries[i % len(countries)]}?")
            scores.append([0.0, 1.0])
    scores = np.array(scores)
    if shuffle:
        scores = scores[rng.permutation(n)]
    costs = np.tile([BOOK.cost("smol-direct", 30, 8), BOOK.cost("smol-cot", 30, 60)], (n, 1))
    return RoutingData([f"q{i}" for i in range(n)], queries, list(WORKERS), scores, costs)


def register_surface_router(workers: list[str] | None = None, shuffle: bool = False):
    router = LogisticRouter(seed=0)
    router.featurizer = QueryFeaturizer(use_embedding=False)
    router.name = "gw-surface"
    data = training_data(shuffle=shuffle)
    if workers is not None:
        data = dataclasses.replace(data, workers=list(workers))
    served = ServedRouter.from_fitted(router.fit(data), data, BOOK.version, embedding=None, family="gw-surface")
    return register(served, include_code=False)


def set_champion(version: str) -> None:
    import mlflow

    mlflow.MlflowClient().set_registered_model_alias(NAME, CHAMPION_ALIAS, version)


@pytest.fixture(scope="module")
def registry(mlflow_registry):
    """The module's MLflow registry (tests/gateway/conftest.py) holding version 1 of the router as champion."""
    first = register_surface_router()
    set_champion(first.version)
    return first


@pytest.fixture(scope="module")
def gateway(llm_url, registry, serve_gateway, tmp_path_factory):
    db = tmp_path_factory.mktemp("gateway") / "gateway.db"
    cfg = GatewayConfig(routers=(NAME,), db_url=f"sqlite:///{db}", local_base_url=llm_url, watch_interval_s=0.2,
                        log_texts=True)
    gw = Gateway(cfg, POOL, BOOK)
    return gw, serve_gateway(gw)


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)


def aclient(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=300)


def worst_cost(worker: str, messages: list[dict], max_tokens: int = MAX_TOKENS) -> float:
    system = POOL.worker(worker).generation.get("system", "")
    return BOOK.cost(worker, prompt_token_bound(messages, system), max_tokens)


# ---------------------------------------------------------------- completions


def test_plain_completion_carries_usage_cost_headers_and_scores(gateway):
    gw, url = gateway
    key, info = gw.store.create_key(1.0, "day")
    raw = client(url, key).chat.completions.with_raw_response.create(model="auto", messages=ARITH,
                                                                      max_tokens=MAX_TOKENS)
    completion = raw.parse()
    assert completion.choices[0].message.content.strip()
    assert 0 < completion.usage.completion_tokens <= MAX_TOKENS and completion.usage.prompt_tokens > 5
    assert raw.headers["x-routerops-worker"] == "smol-direct"  # the router's learned choice for arithmetic
    cost = float(raw.headers["x-routerops-cost-usd"])
    expected = BOOK.cost("smol-direct", completion.usage.prompt_tokens, completion.usage.completion_tokens)
    assert cost == pytest.approx(expected, rel=1e-6) and 0 < cost <= worst_cost("smol-direct", ARITH)
    extra = completion.model_extra["routerops"]
    assert extra["decision_id"] == raw.headers["x-routerops-decision-id"] and extra["router_version"] == "1"
    assert set(extra["scores"]) == set(WORKERS) and extra["scores"]["smol-direct"] > extra["scores"]["smol-cot"]
    assert completion.model == "auto"
    spent, reserved = gw.store.spend(info.key_id, period_start("day"))
    assert spent == pytest.approx(cost, abs=1e-9) and reserved == 0


def test_capital_queries_go_to_the_other_worker_under_router_name(gateway):
    gw, url = gateway
    key, _ = gw.store.create_key(1.0, "day")
    raw = client(url, key).chat.completions.with_raw_response.create(model=f"router:{NAME}", messages=CAPITAL,
                                                                      max_tokens=MAX_TOKENS)
    assert raw.headers["x-routerops-worker"] == "smol-cot"


def test_streaming_sends_chunks_then_usage_and_the_decision(gateway):
    gw, url = gateway
    key, info = gw.store.create_key(1.0, "day")
    with client(url, key).chat.completions.with_streaming_response.create(
            model="auto", messages=ARITH, max_tokens=MAX_TOKENS, stream=True) as raw:
        worker = raw.headers["x-routerops-worker"]
        chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    final = chunks[-1]
    assert text.strip() and worker == "smol-direct"
    assert final.usage.completion_tokens <= MAX_TOKENS and final.usage.prompt_tokens > 0
    extra = final.model_extra["routerops"]
    spent, reserved = gw.store.spend(info.key_id, period_start("day"))
    assert extra["cost_usd"] == pytest.approx(spent, abs=1e-9) and 0 < spent <= worst_cost(worker, ARITH) + 1e-12
    # llama.cpp's server sends no usage in streams: completion tokens are bounded from the bytes received
    # (at least one per chunk, at most max_tokens: gateway/upstream.py), the prompt is charged at its
    # bound, and the decision says so
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert extra["usage_source"] == "estimated" and final.usage.completion_tokens == min(
        max(len("".join(pieces).encode()), len(pieces)), MAX_TOKENS)
    assert reserved == 0


def test_a_request_without_a_valid_key_is_401(gateway):
    _, url = gateway
    for key in ("not-a-key", "rk-0000-forged"):
        with pytest.raises(openai.AuthenticationError):
            client(url, key).chat.completions.create(model="auto", messages=ARITH, max_tokens=MAX_TOKENS)
    assert httpx.post(f"{url}/chat/completions", json={"model": "auto", "messages": ARITH}).status_code == 401


def test_over_budget_is_429_with_a_clear_message(gateway):
    gw, url = gateway
    key, _ = gw.store.create_key(worst_cost("smol-direct", ARITH) / 2, "day")
    with pytest.raises(openai.RateLimitError, match="over budget") as info:
        client(url, key).chat.completions.create(model="auto", messages=ARITH, max_tokens=MAX_TOKENS)
    assert "left of its" in str(info.value) and "max_tokens=8" in str(info.value)


def test_fifty_concurrent_requests_never_overspend_a_budget_for_ten(gateway):
    gw, url = gateway
    budget = 10 * worst_cost("smol-direct", ARITH)
    key, info = gw.store.create_key(budget, "day")

    async def one(c: openai.AsyncOpenAI):
        try:
            await c.chat.completions.create(model="auto", messages=ARITH, max_tokens=MAX_TOKENS)
            return "ok"
        except openai.RateLimitError:
            return "429"

    async def burst():
        c = aclient(url, key)
        try:
            return await asyncio.gather(*(one(c) for _ in range(50)))
        finally:
            await c.close()

    outcomes = asyncio.run(burst())
    spent, reserved = gw.store.spend(info.key_id, period_start("day"))
    assert outcomes.count("ok") + outcomes.count("429") == 50
    assert 10 <= outcomes.count("ok") < 50, outcomes  # the worst case is reserved: at least 10 fit
    assert spent <= budget and reserved == 0
    logged = read_decisions(gw.cfg.db_url)
    assert (logged.key_id == info.key_id).sum() == outcomes.count("ok")


# ---------------------------------------------------------------- explanations and the decision log


def test_explain_and_the_decision_endpoint_show_candidates_budget_and_share(gateway):
    gw, url = gateway
    key, info = gw.store.create_key(1.0, "day")
    completion = client(url, key).chat.completions.create(
        model="auto", messages=CAPITAL, max_tokens=MAX_TOKENS, extra_body={"explain": True, "budget_usd": 0.5})
    explained = completion.model_extra["routerops"]["explanation"]
    assert explained["budget_usd"] == 0.5 and explained["key_remaining_usd"] == pytest.approx(1.0)
    assert {c["worker"] for c in explained["candidates"]} == set(WORKERS)
    assert all(c["affordable"] and c["worst_cost_usd"] > 0 for c in explained["candidates"])
    assert explained["cost_share"] == {"smol-cot": 1.0} and explained["propensity"] == 1.0

    decision_id = completion.model_extra["routerops"]["decision_id"]
    headers = {"Authorization": f"Bearer {key}"}
    record = httpx.get(f"{url}/decisions/{decision_id}", headers=headers).json()
    assert record["worker"] == "smol-cot" and record["explanation"]["candidates"] == explained["candidates"]
    assert record["query"] == CAPITAL[0]["content"] and record["cost_usd"] > 0
    other, _ = gw.store.create_key(1.0, "day")
    assert httpx.get(f"{url}/decisions/{decision_id}", headers={"Authorization": f"Bearer {other}"}).status_code == 404

    assert httpx.post(f"{url}/decisions/{decision_id}/feedback", json={"score": 1}, headers=headers).status_code == 200
    graded = read_decisions(gw.cfg.db_url, graded_only=True)
    row = graded[graded.decision_id == decision_id].iloc[0]
    assert row.score == 1.0 and row.propensity == 1.0 and row.worker == "smol-cot" and row.dataset == "gateway"


def test_a_tight_request_budget_routes_to_the_cheaper_worker(gateway):
    gw, url = gateway
    key, _ = gw.store.create_key(1.0, "day")
    between = (worst_cost("smol-direct", CAPITAL) + worst_cost("smol-cot", CAPITAL)) / 2
    raw = client(url, key).chat.completions.with_raw_response.create(
        model="auto", messages=CAPITAL, max_tokens=MAX_TOKENS, extra_body={"budget_usd": between})
    assert raw.headers["x-routerops-worker"] == "smol-direct"


# ---------------------------------------------------------------- fallback and hot-swap


def test_a_dead_worker_falls_back_to_the_next_best_and_is_recorded(llm_url, registry, serve_gateway, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there: connection refused
    pool = dataclasses.replace(POOL, workers=tuple(
        dataclasses.replace(w, endpoint=dead, timeout_s=5) if w.name == "smol-cot" else w for w in POOL.workers))
    cfg = GatewayConfig(routers=(NAME,), db_url=f"sqlite:///{tmp_path / 'gw.db'}", local_base_url=llm_url)
    gw = Gateway(cfg, pool, BOOK)
    url = serve_gateway(gw)
    key, _ = gw.store.create_key(1.0, "day")
    raw = client(url, key).chat.completions.with_raw_response.create(model="auto", messages=CAPITAL,
                                                                      max_tokens=MAX_TOKENS)
    extra = raw.parse().model_extra["routerops"]
    assert raw.headers["x-routerops-worker"] == "smol-direct" and extra["chosen"] == "smol-cot"
    assert extra["fallbacks"][0]["worker"] == "smol-cot" and "connection" in extra["fallbacks"][0]["error"]
    record = gw.store.decision(extra["decision_id"])
    assert record["explanation"]["fell_back"] and record["worker"] == "smol-direct"


def test_swapping_the_champion_under_load_drops_no_request_and_refuses_a_misfit(gateway):
    gw, url = gateway
    key, _ = gw.store.create_key(10.0, "day")
    second = register_surface_router(shuffle=True)
    misfit = register_surface_router(workers=["smol-direct", "gpt-9"])

    async def load():
        c = aclient(url, key)
        versions = []

        async def one(i: int):
            await asyncio.sleep(0.1 * i)  # spread out: some decided before the swap, some after
            raw = await c.chat.completions.with_raw_response.create(
                model="auto", messages=ARITH if i % 2 else CAPITAL, max_tokens=4)
            versions.append(raw.parse().model_extra["routerops"]["router_version"])

        async def swap():
            while not versions:  # move the alias once requests are flowing
                await asyncio.sleep(0.05)
            await asyncio.to_thread(set_champion, second.version)

        try:
            await asyncio.gather(swap(), *(one(i) for i in range(16)))
            await wait_for(lambda: gw.champions.current(NAME).version == second.version)
            await one(0)
        finally:
            await c.close()
        return versions

    versions = asyncio.run(load())
    assert len(versions) == 17 and versions[-1] == second.version and versions[0] == "1"

    set_champion(misfit.version)
    asyncio.run(wait_for(lambda: gw.champions.refusals[NAME]))
    refusal = gw.champions.refusals[NAME][0]
    assert refusal["version"] == misfit.version and "gpt-9" in refusal["reason"]
    models = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}).json()["data"]
    assert models[0]["id"] == "auto" and models[0]["routerops"]["version"] == second.version
    assert models[0]["routerops"]["refused"][0]["version"] == misfit.version
    set_champion(second.version)


async def wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)
