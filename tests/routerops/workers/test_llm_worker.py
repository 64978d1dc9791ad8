"""LLMWorker against real HTTP servers: a delayed OpenAI-compatible endpoint and a fault-injecting
proxy in front of it (routerops.workers.chaos)."""

from __future__ import annotations

import asyncio
import time

import pytest

from routerops.pricing import WorkerSpec
from routerops.workers.chaos import FAULT_KINDS, DelayedEndpoint, FaultProxy
from routerops.workers.llm import Backoff, LLMWorker

QUICK_BACKOFF = Backoff(base_s=0.01, cap_s=0.05)


def llm_spec(**overrides) -> WorkerSpec:
    fields = dict(
        name="echo", kind="llm", primitives=("answer",), model="delayed-echo", concurrency=4, timeout_s=5.0,
        max_retries=4, generation={"max_tokens": 16, "temperature": 0.0},
    )
    return WorkerSpec(**{**fields, **overrides})


def ask(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"question number {i} about routing"}]


@pytest.fixture(scope="module")
def endpoint():
    server = DelayedEndpoint(delay_s=0.2)
    with server:
        yield server


async def test_usage_and_text_come_from_the_server(endpoint):
    worker = LLMWorker(llm_spec(generation={"system": "answer in one word", "max_tokens": 3}), endpoint.base_url)
    result = await worker.call(ask(1))
    await worker.aclose()
    assert result.error == "" and result.text == "echo: question number"  # max_tokens=3 reached the server
    # the server counts words: 4 of the system message it was sent + 5 of the question
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (9, 3, 0)
    assert result.latency_s >= 0.2


async def test_per_call_max_tokens_overrides_the_spec(endpoint):
    worker = LLMWorker(llm_spec(), endpoint.base_url)
    result = await worker.call("plain text payload here", max_tokens=2)
    await worker.aclose()
    assert result.text == "echo: plain" and result.prompt_tokens == 4


async def test_concurrency_limit_is_honoured_at_the_server(endpoint):
    endpoint.max_in_flight = 0
    worker = LLMWorker(llm_spec(concurrency=3), endpoint.base_url)
    started = time.monotonic()
    results = await asyncio.gather(*(worker.call(ask(i)) for i in range(12)))
    elapsed = time.monotonic() - started
    await worker.aclose()
    assert all(r.error == "" for r in results)
    assert endpoint.max_in_flight == 3 and worker.stats.max_in_flight == 3
    assert elapsed >= 4 * 0.2  # 12 calls, 3 at a time, 0.2 s each


@pytest.mark.slow
async def test_every_call_succeeds_or_fails_cleanly_through_heavy_faults(endpoint):
    spec = llm_spec(timeout_s=0.5, max_retries=3, concurrency=8)
    proxy = FaultProxy(endpoint.base_url, fault_rate=0.6, seed=7)
    with proxy as proxy_url:
        worker = LLMWorker(spec, proxy_url, backoff=QUICK_BACKOFF, seed=1)
        results = await asyncio.gather(*(worker.call(ask(i)) for i in range(30)))
        await worker.aclose()
    ok = [r for r in results if not r.error]
    failed = [r for r in results if r.error]
    assert set(proxy.faults) == set(FAULT_KINDS)  # hang, 429, 500 and truncated body all happened
    # one HTTP request per attempt; every intact answer is a success, every success an intact answer
    assert worker.stats.attempts == sum(proxy.faults.values()) + proxy.forwarded
    assert len(ok) == proxy.forwarded and worker.stats.calls == 30
    assert worker.stats.attempts == len(ok) + sum(worker.stats.failed_attempts.values())
    assert set(worker.stats.failed_attempts) == {"timeout", "rate_limit", "server", "malformed"}
    assert all(r.text and r.prompt_tokens > 0 for r in ok)
    assert all("after 4 attempts" in r.error and r.text == "" for r in failed)
    assert worker.stats.failures == len(failed)


async def test_all_attempts_failing_returns_an_error_instead_of_raising(endpoint):
    with FaultProxy(endpoint.base_url, fault_rate=1.0, seed=0, kinds=("server_error",)) as proxy_url:
        worker = LLMWorker(llm_spec(max_retries=2), proxy_url, backoff=QUICK_BACKOFF)
        result = await worker.call(ask(0))
        await worker.aclose()
    assert result.error.startswith("server:") and "after 3 attempts" in result.error
    assert worker.stats.attempts == 3 and worker.stats.failed_attempts == {"server": 3}


async def test_client_errors_are_not_retried(endpoint):
    worker = LLMWorker(llm_spec(), endpoint.base_url.replace("/v1", "/no-such-api"), backoff=QUICK_BACKOFF)
    result = await worker.call(ask(0))
    await worker.aclose()
    assert result.error.startswith("fatal:") and "404" in result.error
    assert worker.stats.attempts == 1


async def test_connection_refused_is_retried_then_reported():
    from routerops.workers.server import free_port

    worker = LLMWorker(llm_spec(max_retries=2), f"http://127.0.0.1:{free_port()}/v1", backoff=QUICK_BACKOFF)
    result = await worker.call(ask(0))
    await worker.aclose()
    assert result.error.startswith("connection:") and worker.stats.attempts == 3


def test_unknown_generation_keys_are_rejected():
    with pytest.raises(ValueError, match="top_k"):
        LLMWorker(llm_spec(generation={"top_k": 5}), "http://127.0.0.1:9/v1")


def test_a_worker_can_be_used_from_successive_event_loops(endpoint):
    # Callers may asyncio.run() batch after batch with the same workers.
    worker = LLMWorker(llm_spec(concurrency=1), endpoint.base_url)

    async def batch(i: int):
        return await asyncio.gather(worker.call(ask(i)), worker.call(ask(i)))

    for i in range(2):
        assert [r.error for r in asyncio.run(batch(i))] == ["", ""]


def test_a_missing_api_key_is_reported_by_name(monkeypatch):
    from routerops.errors import RouteropsError

    monkeypatch.delenv("ROUTEROPS_TEST_KEY", raising=False)
    with pytest.raises(RouteropsError, match="ROUTEROPS_TEST_KEY"):
        LLMWorker(llm_spec(api_key_env="ROUTEROPS_TEST_KEY"), "https://api.example.invalid/v1")


class LyingEndpoint:
    """A real OpenAI-compatible HTTP server whose every answer reports the usage it is given."""

    def __init__(self, usage):
        import http.server
        import json
        import threading

        body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "liar",
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": "42"}}],
                           "usage": usage}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": -10_000_000, "completion_tokens": -10_000_000},  # a negative charge (issue 42)
    {"prompt_tokens": 10**20, "completion_tokens": 1},
    {"prompt_tokens": "many", "completion_tokens": 1},
    {"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 9}},
])
async def test_usage_no_real_call_has_is_a_failed_call_not_a_price(usage):
    server = LyingEndpoint(usage)
    try:
        worker = LLMWorker(llm_spec(max_retries=1), server.base_url, backoff=QUICK_BACKOFF)
        result = await worker.call(ask(0))
        await worker.aclose()
    finally:
        server.close()
    # the trajectory never carries the counts: the call failed as malformed after its retries
    assert result.error.startswith("malformed:") and "not a real call's" in result.error
    assert (result.prompt_tokens, result.completion_tokens) == (0, 0)
    assert worker.stats.failed_attempts == {"malformed": 2}


async def test_honest_usage_from_the_same_server_is_believed():
    server = LyingEndpoint({"prompt_tokens": 7, "completion_tokens": 1,
                            "prompt_tokens_details": {"cached_tokens": 3}})
    try:
        worker = LLMWorker(llm_spec(), server.base_url)
        result = await worker.call(ask(0))
        await worker.aclose()
    finally:
        server.close()
    assert (result.text, result.prompt_tokens, result.completion_tokens, result.cached_tokens) == ("42", 7, 1, 3)
