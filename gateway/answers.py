"""A routed request's answer (gateway/app.py's chat route): the chosen worker called, falling back down
the decision's order on failures the next worker may cure, the answer whole or streamed as server-sent
events, each with its `routerops` field and `x-routerops-*` headers, and the call settled however the
response ends."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any

import httpx
import openai
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.errors import RequestError
from gateway.proxy import (FALLBACK_STATUS, Call, Gateway, WorkerAnswerError, WorkerStatusError, bounded_usage,
                           explanation)
from gateway.upstream import BadUsage, Delivered, usage_in, usage_of_chunk

log = logging.getLogger(__name__)


def routerops_field(call: Call, worker: str, cost: float | None, explain: bool) -> dict[str, Any]:
    d = call.decision
    extra = {"decision_id": d.decision_id, "router": d.router, "router_version": d.router_version,
             "chosen": d.chosen, "worker": worker, "cost_usd": cost, "propensity": d.propensity,
             "worst_cost_usd": d.candidate(worker).worst_cost_usd if worker else None,
             "scores": {c.worker: c.quality for c in d.candidates}, "fallbacks": d.attempts,
             "price_book_version": None}
    if explain:
        extra["explanation"] = explanation(d, worker, cost or 0.0)
    return extra


def headers_for(call: Call, worker: str, cost: float | None) -> dict[str, str]:
    d = call.decision
    headers = {"x-routerops-decision-id": d.decision_id, "x-routerops-worker": worker,
               "x-routerops-router": f"{d.router}@{d.router_version}",
               "x-routerops-scores": ",".join(f"{c.worker}={c.quality:.4f}" for c in d.candidates),
               "x-routerops-reserved-usd": f"{d.candidate(worker).worst_cost_usd:.9f}",
               "x-routerops-fallbacks": str(len(d.attempts))}
    if cost is not None:
        headers["x-routerops-cost-usd"] = f"{cost:.9f}"
    return headers


def worker_failure(exc: BaseException) -> str | None:
    """Why a worker call failed in a way the next worker may cure (timeout, connection, 429, 5xx, an
    answer that is not JSON), or None (the request itself is wrong)."""
    if isinstance(exc, (openai.APITimeoutError, httpx.TimeoutException)):
        return "timeout"
    if isinstance(exc, (openai.APIConnectionError, httpx.TransportError)):
        return "connection"
    if isinstance(exc, (openai.APIStatusError, WorkerStatusError)) and exc.status_code in FALLBACK_STATUS:
        return f"status {exc.status_code}"
    if isinstance(exc, WorkerAnswerError):
        return "bad answer"
    return None


# ---------------------------------------------------------------- calling the workers


async def first_answer(gw: Gateway, call: Call, stream: bool) -> tuple[str, Any, dict[str, int] | None]:
    """(worker, completion or stream, its checked usage) from the first worker in the decision's order
    that answers. A plain answer whose usage no real call has (gateway/upstream.py) is a worker error:
    its worst case is charged (it may have billed that) and the next worker is tried."""
    for worker in call.decision.order:
        if not await gw.switch_to(call, worker):
            continue
        request = gw.worker_request(call, worker)
        try:
            call.called = worker
            if stream:
                request.update(stream=True, stream_options={"include_usage": True})
                return worker, await gw.client(worker).chat.completions.create(**request), None
            answer = await gw.post_chat(worker, request)
            return worker, answer, usage_in(answer)
        except BadUsage as exc:
            worst = call.decision.candidate(worker).worst_cost_usd
            call.bad_answers_usd += worst
            call.decision.attempts.append({"worker": worker, "error": f"bad usage: {exc}", "charged_usd": worst})
            log.warning("worker %s answered an impossible usage (%s): charged its worst case, falling back", worker, exc)
        except (openai.APIError, httpx.HTTPError, WorkerStatusError, WorkerAnswerError) as exc:
            reason = worker_failure(exc)
            if reason is None:  # the request itself is wrong: the next worker would refuse it too
                gw.close_call(call, "", "bad_request", {}, "")
                status = getattr(exc, "status_code", 400)
                raise RequestError(status, f"worker {worker!r} refused the request: {exc}") from exc
            call.decision.attempts.append({"worker": worker, "error": f"{reason}: {str(exc)[:200]}"})
            log.warning("worker %s failed (%s); falling back", worker, reason)
    gw.close_call(call, "", "worker_error", {}, "")
    raise RequestError(502, f"every affordable worker failed: {call.decision.attempts}", "server_error",
                       "workers_failed")


async def complete(gw: Gateway, call: Call) -> JSONResponse:
    worker, body, usage = await first_answer(gw, call, stream=False)
    source = "worker"
    if usage is None:  # no token counts: charge the worst case rather than nothing
        usage, source = bounded_usage(gw, call, worker, call.decision.max_tokens), "estimated"
    cost = gw.close_call(call, worker, "ok", usage, answer_text(body), source)
    body["model"] = call.body["model"]
    body["routerops"] = routerops_field(call, worker, cost, bool(call.body.get("explain")))
    body["routerops"]["price_book_version"] = gw.book.version
    return JSONResponse(body, headers=headers_for(call, worker, cost))


def answer_text(answer: dict[str, Any]) -> str:
    choices = answer.get("choices")
    message = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    return str(message.get("content") or "") if isinstance(message, dict) else ""


class SettledStream(StreamingResponse):
    """A streamed answer whose call is settled however the response ends: a client gone before the
    first chunk leaves the stream's generator never started (its `finally` never runs), so the
    worker's stream is closed and the call settled here, after the response, in every case."""

    def __init__(self, content: Any, on_end, **kwargs):
        super().__init__(content, **kwargs)
        self.on_end = on_end

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.on_end()


async def stream(gw: Gateway, call: Call) -> StreamingResponse:
    worker, chunks, _ = await first_answer(gw, call, stream=True)
    delivered = Delivered()

    async def on_end() -> None:
        with contextlib.suppress(Exception):
            await chunks.close()  # the worker stops generating for a client that is gone
        if not call.closed:
            usage = bounded_usage(gw, call, worker, delivered.completion_bound(call.decision.max_tokens))
            gw.close_call(call, worker, "client_gone", usage, "".join(delivered.pieces), "estimated")

    return SettledStream(sse(gw, call, worker, chunks, delivered), on_end, media_type="text/event-stream",
                         headers=headers_for(call, worker, None))


async def sse(gw: Gateway, call: Call, worker: str, chunks: Any, delivered: Delivered):
    """The worker's chunks as server-sent events, then one chunk with `usage` and `routerops`.
    Without a usage block from the worker (llama.cpp's server sends none in streams; a client that
    disconnects leaves before it) the completion is bounded from what was received (gateway/upstream.py:
    its bytes, at least a token per chunk, at most max_tokens) and the prompt by its bound, marked
    usage_source=estimated. A usage no real call has is charged the worst case (usage_source=worst_case)."""
    usage, status, last, source = None, "client_gone", None, "worker"
    try:
        async for chunk in chunks:
            last = chunk
            try:
                usage = usage_of_chunk(chunk) or usage
            except BadUsage as exc:
                source = "worst_case"
                call.decision.attempts.append({"worker": worker, "error": f"bad usage: {exc}"})
            if chunk.choices:
                delivered.add(chunk.choices[0].delta)
                data = chunk.model_dump(exclude_unset=True, warnings=False)
                data["model"] = call.body["model"]
                yield f"data: {json.dumps(data)}\n\n"
        status = "ok" if source == "worker" else "worker_error"
    except openai.APIError as exc:
        status = "worker_error"
        call.decision.attempts.append({"worker": worker, "error": f"stream broke: {str(exc)[:200]}"})
    finally:
        if source == "worst_case":  # the worker's report is no real count: its worst case
            usage = bounded_usage(gw, call, worker, call.decision.max_tokens)
        elif usage is None:
            usage, source = bounded_usage(gw, call, worker, delivered.completion_bound(call.decision.max_tokens)), "estimated"
        cost = gw.close_call(call, worker, status, usage, "".join(delivered.pieces), source)
    final = {"id": getattr(last, "id", call.decision.decision_id), "object": "chat.completion.chunk",
             "created": getattr(last, "created", int(time.time())), "model": call.body["model"], "choices": [],
             "usage": {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
                       "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]},
             "routerops": {**routerops_field(call, worker, cost, bool(call.body.get("explain"))),
                           "usage_source": source, "price_book_version": gw.book.version}}
    yield f"data: {json.dumps(final)}\n\n"
    yield "data: [DONE]\n\n"
