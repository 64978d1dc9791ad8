"""LLM workers: any OpenAI-compatible chat-completions endpoint (llama.cpp, vLLM, API providers).

Retries are done here rather than by the SDK (`max_retries=0`): the SDK retries connection errors,
timeouts, 408/409/429 and 5xx, but not a 200 whose body is truncated or is not a chat completion, and
it does not tell us how many attempts a call took. Those counts (`LLMWorker.stats`) are what the
rollout engine and the fault-injection tests look at.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import dataclass, field

import openai

from routerops.errors import RouteropsError
from routerops.pricing import WorkerSpec
from routerops.types import Payload, WorkerResult
from routerops.workers.concurrency import ConcurrencyLimit
from routerops.workers.usage import BadUsage, checked_sdk_usage

LOCAL_API_KEY = "sk-local"  # llama.cpp's server accepts any key unless started with --api_key
RETRYABLE_STATUS = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))
# spec.generation keys passed to the API as they are; "system" and "max_tokens" are handled apart.
REQUEST_PARAMS = frozenset({"temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty"})


class MalformedResponse(Exception):
    """The server answered 200 but the body is not a usable chat completion."""


@dataclass
class CallStats:
    """What the worker has done since it was built (all calls, all attempts)."""

    calls: int = 0
    attempts: int = 0
    failures: int = 0  # calls that returned WorkerResult.error
    failed_attempts: dict[str, int] = field(default_factory=dict)  # failure kind -> attempts that failed so
    in_flight: int = 0
    max_in_flight: int = 0


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: sleep U(0, min(cap, base * 2**retry))."""

    base_s: float = 0.25
    cap_s: float = 8.0

    def delay(self, retry: int, rng: random.Random, retry_after_s: float | None = None) -> float:
        ceiling = min(self.cap_s, self.base_s * 2**retry)
        wait = rng.uniform(0.0, ceiling)
        if retry_after_s is not None:  # the server said how long; honour it up to the cap
            wait = max(wait, min(retry_after_s, self.cap_s))
        return wait


def api_key_for(spec: WorkerSpec) -> str:
    if not spec.api_key_env:
        return LOCAL_API_KEY
    key = os.environ.get(spec.api_key_env)
    if not key:
        raise RouteropsError(f"worker {spec.name!r}: environment variable {spec.api_key_env} (api_key_env) is not set")
    return key


class LLMWorker:
    """One worker of the pool behind an OpenAI-compatible endpoint."""

    def __init__(self, spec: WorkerSpec, base_url: str, backoff: Backoff = Backoff(), seed: int | None = None):
        unknown = set(spec.generation) - REQUEST_PARAMS - {"system", "max_tokens"}
        if unknown:
            raise ValueError(f"worker {spec.name!r}: unknown generation key {sorted(unknown)[0]!r}")
        self.name = spec.name
        self.spec = spec
        self.base_url = base_url
        self.backoff = backoff
        self.stats = CallStats()
        self._rng = random.Random(seed)
        self._api_key = api_key_for(spec)
        self._slots = ConcurrencyLimit(spec.concurrency)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: openai.AsyncOpenAI | None = None

    async def call(self, payload: Payload, max_tokens: int | None = None) -> WorkerResult:
        """One chat completion; retried on transient failures, never raises for a failed call."""
        request = self._request(payload, max_tokens)
        self.stats.calls += 1
        started = time.monotonic()
        last_error, last_exc = "", None
        for attempt in range(self.spec.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff.delay(attempt - 1, self._rng, _retry_after(last_exc)))
            self.stats.attempts += 1
            try:
                result = await self._attempt(request)
            except Exception as exc:  # noqa: BLE001 - classified just below
                kind = failure_kind(exc)
                last_exc, last_error = exc, f"{kind}: {_describe(exc)}"
                self.stats.failed_attempts[kind] = self.stats.failed_attempts.get(kind, 0) + 1
                if kind == "fatal":
                    break
                continue
            result.latency_s = time.monotonic() - started  # what the caller waited, retries included
            return result
        self.stats.failures += 1
        attempts = attempt + 1
        return WorkerResult(
            text="", latency_s=time.monotonic() - started, error=f"{last_error} (after {attempts} attempts)"
        )

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.close()
        self._client = self._loop = None

    def _client_for_running_loop(self) -> openai.AsyncOpenAI:
        # The SDK's HTTP connection pool belongs to one event loop: make a client per loop.
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._loop = loop
            self._client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=self._api_key, timeout=self.spec.timeout_s, max_retries=0
            )
        return self._client

    def _request(self, payload: Payload, max_tokens: int | None) -> dict:
        return chat_request(self.spec, payload, max_tokens)

    async def _attempt(self, request: dict) -> WorkerResult:
        async with self._slots:
            self.stats.in_flight += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
            try:
                completion = await self._client_for_running_loop().chat.completions.create(**request)
            finally:
                self.stats.in_flight -= 1
        return _to_result(completion)


def chat_request(spec: WorkerSpec, payload: Payload, max_tokens: int | None = None) -> dict:
    """The chat-completions request for `payload` on worker `spec`: its system prompt first (merged
    into the caller's system message), its model name, its generation settings, `max_tokens` if given
    (else the worker's). Shared by LLMWorker and the gateway, so both call a worker the same way."""
    gen = spec.generation
    messages = [{"role": "user", "content": payload}] if isinstance(payload, str) else list(payload)
    system = gen.get("system")
    if system:
        if messages and messages[0].get("role") == "system":  # one system message: chat templates expect that
            content = messages[0].get("content")
            merged = ([{"type": "text", "text": system}, *content] if isinstance(content, list)  # content parts
                      else f"{system}\n\n{content or ''}")
            messages[0] = {**messages[0], "content": merged}
        else:
            messages.insert(0, {"role": "system", "content": system})
    request = {"model": spec.model or spec.name, "messages": messages}
    limit = max_tokens if max_tokens is not None else gen.get("max_tokens")
    if limit is not None:
        request["max_tokens"] = int(limit)
    request.update({k: v for k, v in gen.items() if k in REQUEST_PARAMS})
    return request


def _to_result(completion) -> WorkerResult:
    choices = getattr(completion, "choices", None)
    usage = getattr(completion, "usage", None)
    if not isinstance(choices, list) or not choices or getattr(choices[0], "message", None) is None:
        raise MalformedResponse(f"no choices in the response: {str(completion)[:200]!r}")
    # The counts price the trajectory (and the orchestrator's eq. 5 cost term), so they are checked as
    # the gateway checks what bills a key: a negative, absurd or non-integer count is no real call.
    try:
        counts = checked_sdk_usage(usage)
    except BadUsage as exc:
        raise MalformedResponse(f"usage the server sent is not a real call's: {exc}") from exc
    if counts is None or getattr(usage, "prompt_tokens", None) is None:
        raise MalformedResponse("no usage in the response: token counts must come from the server")
    return WorkerResult(text=choices[0].message.content or "", **counts)


def failure_kind(exc: BaseException) -> str:
    """'timeout' | 'connection' | 'rate_limit' | 'server' | 'malformed' are retried; 'fatal' is not."""
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connection"
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code == 429:
            return "rate_limit"
        return "server" if exc.status_code in RETRYABLE_STATUS else "fatal"
    if isinstance(exc, (MalformedResponse, json.JSONDecodeError, openai.APIResponseValidationError)):
        return "malformed"
    return "fatal"


def _retry_after(exc: BaseException | None) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]
