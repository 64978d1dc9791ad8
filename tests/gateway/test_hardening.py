"""Issue 25, the gateway as a hostile client finds it: budgets that cannot be dodged, no 500s, overload
refused rather than queued without bound.

A real gateway (uvicorn in a thread) in front of a real OpenAI-compatible endpoint
(routerops.workers.chaos.DelayedEndpoint) that bills like a multimodal worker: one prompt token per
UTF-8 byte of every string it is sent (no tokenizer bills more for text) plus IMAGE_TOKENS for each
image part, whatever its URL's length. The router is fitted in the test (no registry, no LLM).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from evaluation.serving.single_turn import ServedRouter
from gateway.app import Gateway, GatewayConfig, create_app
from gateway.champion import Champion, Champions
from gateway.store import period_start, read_decisions
from models.base import RoutingData
from models.baselines import LogisticRouter, QueryFeaturizer
from routerops.pricing import load_pool, load_price_book
from routerops.workers.chaos import DelayedEndpoint, _BackgroundServer

REPO = Path(__file__).resolve().parents[2]
POOL, BOOK = load_pool(REPO / "configs" / "pools" / "embedded-smollm2.yaml"), load_price_book(REPO / "configs" / "prices" / "current.yaml")
WORKERS = ["smol-direct", "smol-cot"]
NAME = "router-hardening"
IMAGE_TOKENS = 20_000
TEXT = [{"role": "user", "content": "What is 17 plus 25?"}]
IMAGE = [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                      {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]}]


def strings(value) -> list[str]:
    """Every string in a JSON value (keys of objects too: a template may render them)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def multimodal_usage(body: dict) -> dict:
    """What a multimodal worker bills: a token per byte of every message string (an image part's URL
    aside) and of the tool definitions, IMAGE_TOKENS per image part; 1 completion token."""
    prompt = 0
    for message in body["messages"]:
        content = message.get("content")
        parts = content if isinstance(content, list) else []
        images = [p for p in parts if isinstance(p, dict) and p.get("type") == "image_url"]
        rest = {k: v for k, v in message.items() if k not in ("role", "content")}
        texts = [content] if isinstance(content, str) else [p.get("text", "") for p in parts if p not in images]
        if isinstance(content, dict):  # content as an object: the worker reads its strings
            texts = strings(content)
        prompt += IMAGE_TOKENS * len(images) + sum(len(s.encode()) for s in texts + strings(rest))
    prompt += sum(len(s.encode()) for s in strings(body.get("tools") or []))
    return {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}


@pytest.fixture(scope="module")
def router() -> ServedRouter:
    queries = [f"What is {i} plus {i + 3}?" if i % 2 else f"Which city is the capital of country {i}?"
               for i in range(40)]
    scores = np.array([[1.0, 0.0] if "plus" in q else [0.0, 1.0] for q in queries])
    data = RoutingData([f"q{i}" for i in range(40)], queries, list(WORKERS), scores, np.tile([1e-5, 1e-4], (40, 1)))
    model = LogisticRouter(seed=0)
    model.featurizer = QueryFeaturizer(use_embedding=False)
    return ServedRouter.from_fitted(model.fit(data), data, BOOK.version, embedding=None, family="hardening-test")


class Served:
    """The gateway served in a thread over `pool` (every LLM worker at one billing endpoint)."""

    def __init__(self, router, tmp_path: Path, accepts: dict[str, dict] | None = None, delay_s: float = 0.0,
                 usage=multimodal_usage, budget_usd: float = 1.0, **config):
        self.endpoint = DelayedEndpoint(delay_s=delay_s, usage=usage)
        url = self.endpoint.__enter__()
        accepts = accepts or {}
        pool = dataclasses.replace(POOL, workers=tuple(
            dataclasses.replace(w, endpoint=url, **({"accepts": accepts[w.name]} if w.name in accepts else {}))
            if w.kind == "llm" else w
            for w in POOL.workers))
        self.db_url = f"sqlite:///{tmp_path / 'gw.db'}"
        champions = Champions([NAME], pool, BOOK)
        champions._current[NAME] = Champion(NAME, "1", router, "now")
        self.gw = Gateway(GatewayConfig(routers=(NAME,), db_url=self.db_url, **config), pool, BOOK,
                          champions=champions)
        self.server = _BackgroundServer(create_app(self.gw))
        self.server.start()
        self.url = f"http://127.0.0.1:{self.server.port}/v1"
        self.key, self.info = self.gw.store.create_key(budget_usd, "day")
        self.headers = {"Authorization": f"Bearer {self.key}"}

    def chat(self, messages, **extra) -> httpx.Response:
        return httpx.post(f"{self.url}/chat/completions", headers=self.headers, timeout=30,
                          json={"model": "auto", "messages": messages, "max_tokens": 8, **extra})

    def spent(self) -> float:
        self.gw.store.run(lambda conn: None)  # queued settlements are written first
        return self.gw.store.spend(self.info.key_id, period_start("day"))[0]

    def close(self) -> None:
        self.server.stop()
        self.endpoint.__exit__(None, None, None)


@pytest.fixture
def served(router, tmp_path):
    s = Served(router, tmp_path)
    yield s
    s.close()


def openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def billed_cost(body: dict, worker: str) -> float:
    usage = multimodal_usage(body)
    return BOOK.cost(worker, usage["prompt_tokens"], usage["completion_tokens"])


# ---------------------------------------------------------------- budgets from what is sent


def test_an_image_part_no_worker_accepts_is_refused_before_any_call_or_charge(served):
    # The reported bypass: this request was reserved and charged $1.13e-5 while the worker billed
    # 20,012 prompt tokens (the reservation's bound read the text parts only).
    error = openai_error(served.chat(IMAGE), 400)
    assert error["code"] == "unsupported_content" and "image_url" in error["message"]
    assert served.endpoint.requests == 0 and served.spent() == 0.0


def test_an_image_part_a_worker_accepts_is_reserved_at_its_bound_and_charged_what_was_billed(router, tmp_path):
    s = Served(router, tmp_path, accepts={"smol-direct": {"image_url": IMAGE_TOKENS}})
    try:
        response = s.chat(IMAGE)
        assert response.status_code == 200, response.text
        extra = response.json()["routerops"]
        assert extra["worker"] == "smol-direct"  # the only worker that accepts images
        sent = s.endpoint.received[-1]
        billed = billed_cost(sent, "smol-direct")
        assert multimodal_usage(sent)["prompt_tokens"] > IMAGE_TOKENS
        assert extra["cost_usd"] == pytest.approx(billed) and extra["cost_usd"] <= extra["worst_cost_usd"]
        assert s.spent() == pytest.approx(billed)
        assert not s.gw.store.overruns()
    finally:
        s.close()


def test_content_given_as_an_object_is_refused_in_openais_words(served):
    big = {"type": "text", "text": "word " * 4000}
    error = openai_error(served.chat([{"role": "user", "content": big}]), 400)
    assert error["param"] == "messages[0].content" and error["code"] == "invalid_type"
    assert "expected one of a string or array of objects, but got an object" in error["message"]
    assert served.endpoint.requests == 0 and served.spent() == 0.0


@pytest.mark.parametrize("messages, extra", [
    ([{"role": "user", "content": [{"type": "text", "text": "a " * 3000}, {"type": "text", "text": "b " * 3000}]}], {}),
    ([{"role": "user", "name": "n" * 5000, "content": "What is 2 plus 2?"}], {}),
    ([{"role": "system", "content": [{"type": "text", "text": "Be brief. " * 300}]},
      {"role": "developer", "content": "Answer in French. " * 100}, *TEXT], {}),
    ([*TEXT, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"x": "1" * 4000})}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42 " * 1000}, *TEXT], {}),
    (TEXT, {"tools": [{"type": "function", "function": {"name": "add", "description": "d" * 6000,
                                                        "parameters": {"type": "object"}}}]}),
])
def test_every_part_of_a_message_is_within_the_reservation(router, tmp_path, messages, extra):
    s = Served(router, tmp_path, accepts={w: {"tools": 64} for w in WORKERS})
    try:
        response = s.chat(messages, **extra)
        assert response.status_code == 200, response.text
        routed = response.json()["routerops"]
        sent = s.endpoint.received[-1]
        if "tools" in extra:  # passed on to a worker that accepts tools
            assert sent["tools"] == extra["tools"]
        billed = billed_cost(sent, routed["worker"])
        assert multimodal_usage(sent)["prompt_tokens"] > 1000  # the parts the old bound left out were sent
        assert routed["cost_usd"] == pytest.approx(billed) and billed <= routed["worst_cost_usd"]
        assert not s.gw.store.overruns()
    finally:
        s.close()


def test_tools_are_refused_when_no_worker_accepts_them(served):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    error = openai_error(served.chat(TEXT, tools=tools), 400)
    assert error["param"] == "tools" and served.endpoint.requests == 0


def test_a_worker_billing_past_its_reservation_is_charged_and_the_overrun_recorded(router, tmp_path):
    def overbilling(body):  # a server whose template adds far more than the bound's allowance
        usage = multimodal_usage(body)
        return {**usage, "prompt_tokens": usage["prompt_tokens"] + 5000}

    budget = 3 * BOOK.cost("smol-direct", 5000, 8)
    s = Served(router, tmp_path, usage=overbilling, budget_usd=budget)
    try:
        first = s.chat(TEXT)
        extra = first.json()["routerops"]
        assert first.status_code == 200 and extra["cost_usd"] > extra["worst_cost_usd"]
        [overrun] = s.gw.store.overruns(s.info.key_id)
        assert overrun["decision_id"] == extra["decision_id"]
        assert overrun["overrun_usd"] == pytest.approx(extra["cost_usd"] - extra["worst_cost_usd"], rel=1e-6)
        record = s.gw.store.decision(extra["decision_id"])
        assert record["cost_usd"] == pytest.approx(extra["cost_usd"])
        assert any("overrun_usd" in a for a in record["explanation"]["attempts"])
        # requests go on until the budget is spent, and past it by at most one request's overrun
        statuses = [s.chat(TEXT).status_code for _ in range(8)]
        assert 429 in statuses
        spent = s.spent()
        overruns = s.gw.store.overruns(s.info.key_id)
        assert spent <= budget + max(o["overrun_usd"] for o in overruns) + 1e-12
        logged = read_decisions(s.db_url)
        assert spent == pytest.approx(logged.cost_usd.sum())
        metrics = httpx.get(f"{s.url[:-3]}/metrics").text
        assert f"routerops_gateway_overruns_total {len(overruns)}" in metrics
    finally:
        s.close()


# ---------------------------------------------------------------- no 500s


def raw_post(s: Served, path: str, content: bytes) -> httpx.Response:
    return httpx.post(f"{s.url}{path}", headers={**s.headers, "content-type": "application/json"}, content=content,
                      timeout=30)


@pytest.mark.parametrize("content", [
    b'{"model": "auto", "messages": [{"role": "user", "content": "caf\xe9"}]}',  # Latin-1, not UTF-8
    b"\xff\xfe\x00",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"model": "auto", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b"{", b"[1]", b"", b"null", b'"text"', b'{"model": "auto", "messages": [{"role": "user", "content": "x"}], '
                                           b'"max_tokens": 1e400}',
    b'{"model": "auto", "messages": [{"role": "user", "content": "x"}], "budget_usd": NaN}',
])
def test_bodies_that_broke_the_chat_route_are_400s(served, content):
    error = openai_error(raw_post(served, "/chat/completions", content), 400)
    assert error["type"] == "invalid_request_error"
    assert served.endpoint.requests == 0


def test_feedback_bodies_that_were_500s_are_400s(served):
    decision_id = served.chat(TEXT).json()["routerops"]["decision_id"]
    for content in (b"{", b"[1]", b"\xff", b"[" * 100_000, b'{"score": 2}', b'{"score": true}', b""):
        error = openai_error(raw_post(served, f"/decisions/{decision_id}/feedback", content), 400)
        assert error["type"] == "invalid_request_error", content
    assert raw_post(served, f"/decisions/{decision_id}/feedback", b'{"score": 1}').status_code == 200
    assert openai_error(raw_post(served, "/decisions/nope/feedback", b'{"score": 1}'), 404)


def test_unknown_paths_methods_and_large_bodies_answer_in_the_openai_format(router, tmp_path):
    s = Served(router, tmp_path, max_body_bytes=1000)
    try:
        assert openai_error(httpx.get(f"{s.url}/nothing-here"), 404)
        assert openai_error(httpx.get(f"{s.url}/chat/completions"), 405)
        assert openai_error(s.chat([{"role": "user", "content": "x" * 2000}]), 413)["code"] == "body_too_large"
    finally:
        s.close()


# ---------------------------------------------------------------- overload


def test_past_the_queue_bound_requests_get_503_with_retry_after_and_are_counted(router, tmp_path):
    s = Served(router, tmp_path, delay_s=0.5, max_in_flight=2, max_queue=2, max_queue_wait_s=0.1)
    try:
        async def burst():
            async with httpx.AsyncClient(timeout=30) as c:
                return await asyncio.gather(*(c.post(f"{s.url}/chat/completions", headers=s.headers,
                                                     json={"model": "auto", "messages": TEXT, "max_tokens": 8})
                                              for _ in range(10)))

        responses = asyncio.run(burst())  # no connection error: every request gets an answer
        codes = [r.status_code for r in responses]
        assert codes.count(200) == 2 and codes.count(503) == 8, codes
        shed = [r for r in responses if r.status_code == 503]
        assert all(r.headers["retry-after"] == "1" and int(r.headers["retry-after-ms"]) > 0 for r in shed)
        assert {openai_error(r, 503)["code"] for r in shed} == {"overloaded"}
        stats = s.gw.admission.stats
        assert stats.shed_queue_full == 6 and stats.shed_queue_wait == 2 and stats.admitted == 2
        # A slot is given back after the answer's last byte is written, which the client may read first
        # (seen on a busy machine): wait for it, generously, rather than read the count at once.
        deadline = time.monotonic() + 30
        while (stats.in_flight or stats.waiting) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stats.in_flight == 0 and stats.waiting == 0
        metrics = httpx.get(f"{s.url[:-3]}/metrics").text
        assert 'routerops_gateway_shed_total{reason="queue_full"} 6' in metrics
        assert 'routerops_gateway_responses_total{status="503"}' in metrics
        assert s.chat(TEXT).status_code == 200  # the slots came back
    finally:
        s.close()


def test_a_waiting_request_takes_the_first_free_slot(router, tmp_path):
    s = Served(router, tmp_path, delay_s=0.2, max_in_flight=1, max_queue=4, max_queue_wait_s=5.0)
    try:
        async def burst():
            async with httpx.AsyncClient(timeout=30) as c:
                return await asyncio.gather(*(c.post(f"{s.url}/chat/completions", headers=s.headers,
                                                     json={"model": "auto", "messages": TEXT, "max_tokens": 8})
                                              for _ in range(4)))

        assert [r.status_code for r in asyncio.run(burst())] == [200] * 4
        assert s.endpoint.max_in_flight == 1 and s.gw.admission.stats.queued == 3
    finally:
        s.close()
