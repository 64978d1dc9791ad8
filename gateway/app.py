"""The OpenAI-compatible gateway (FastAPI): the champion routes, the pool answers, the key pays.

POST /v1/chat/completions   `model` = "router:<registered name>" or "auto"; `stream` supported (SSE in
                            the OpenAI format). Extra request fields: `budget_usd` (cap for this
                            request), `explain` (the decision's explanation in the answer),
                            `cost_weight` (λ of q̂ − λ·cost), `turns_left` (MTRouter's T_max − t). The
                            answer is the worker's, with `usage`, plus a `routerops` field and
                            `x-routerops-*` headers (worker, cost, scores). Single-turn routers and
                            MTRouter pick one worker per request (gateway/families.py reads the chat
                            for each); an orchestrator champion runs a whole controller episode
                            instead (gateway/orchestrated.py).
GET  /v1/models             the routed models, their champions and families (and refused champions).
GET  /v1/decisions/{id}     a decision's explanation (only to the key that made the request).
POST /v1/decisions/{id}/feedback   {"score": 0..1}: grade a decision (the log becomes training data).

A request: authenticate (401) → champion (404 unknown model, 503 none loaded) → decide under the key's
remaining budget (429 when no worker fits) → reserve the worst case (429 when a concurrent request took
the budget) → call the chosen worker, falling back down the decision's order on timeout, connection
error, 429 or 5xx → settle the real cost → log the decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.champion import Champion, Champions
from gateway.errors import RequestError
from gateway.critiqued import answer_critiqued
from gateway.families import CRITIQUE, ORCHESTRATOR, ChatMappingError, turns_left_of
from gateway.orchestrated import OrchestraRunner, answer_orchestrated
from gateway.routing import Decision, decide, prompt_token_bound
from gateway.store import BudgetRefused, KeyInfo, Reservation, Store
from routerops.errors import InputError, RouteropsError
from routerops.pricing import Pool, PriceBook, check_pool_priced, load_pool, load_price_book
from routerops.workers import build_workers
from routerops.workers.llm import api_key_for, chat_request

log = logging.getLogger(__name__)
AUTO = "auto"
ROUTER_PREFIX = "router:"
# Client sampling settings passed on to the worker (they override the worker's own generation settings).
PASSED_PARAMS = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "response_format")
FALLBACK_STATUS = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))
# The plain (not streamed) calls' HTTP client: one per gateway, its connections kept open between requests.
HTTP_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=60)


@dataclass(frozen=True)
class GatewayConfig:
    """What `routerops gateway serve` runs with (each field is a command-line flag of the same name)."""

    routers: tuple[str, ...]  # registered router names served, e.g. ("router-knn",); the first is "auto"
    pool_file: str = "configs/pool.yaml"  # the workers and their endpoints
    price_book: str = "configs/prices/current.yaml"  # costs, budgets and the cost headers use this book
    db_url: str = "sqlite:///gateway.db"  # keys, budgets, decisions; postgresql+psycopg://... works too
    local_base_url: str = ""  # where workers with endpoint "local" are served (the llama.cpp server)
    watch_interval_s: float = 10.0  # how often the registry alias is polled for a new champion
    default_max_tokens: int = 256  # when neither the request nor the worker sets max_tokens
    max_tokens_cap: int = 4096  # the most a request may ask for (it bounds the worst-case cost)
    cost_weight: float = 0.0  # λ: 0 = the best affordable worker; > 0 trades quality for cost
    epsilon: float = 0.0  # exploration: P(a uniformly drawn affordable worker), logged as propensity
    log_texts: bool = True  # keep the query and response texts in the decision log (training data)
    hold_lease_s: float = 3600.0  # a budget hold not settled by then is a dead process's: released (store.py)

    def __post_init__(self) -> None:
        if not self.routers:
            raise InputError("gateway config", "routers", "name at least one registered router")
        for name, value, low in (("watch_interval_s", self.watch_interval_s, 0.01), ("cost_weight", self.cost_weight, 0),
                                 ("default_max_tokens", self.default_max_tokens, 1),
                                 ("max_tokens_cap", self.max_tokens_cap, 1)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= low):
                raise InputError("gateway config", name, f"expected a number ≥ {low}, got {value!r}")
        if not 0 <= self.epsilon <= 1:
            raise InputError("gateway config", "epsilon", f"expected a probability, got {self.epsilon!r}")


def error_response(exc: RequestError) -> JSONResponse:
    # x-should-retry: false stops the openai SDK from retrying a 429 that waiting will not cure.
    headers = {"x-should-retry": "false"} if exc.status in (401, 429) else {}
    return JSONResponse({"error": {"message": exc.message, "type": exc.kind, "param": None, "code": exc.code}},
                        status_code=exc.status, headers=headers)


@dataclass
class Call:
    """One request in flight: who pays, what was decided, what is held."""

    key: KeyInfo
    champion: Champion
    decision: Decision
    held: Reservation
    body: dict[str, Any]
    started: float = field(default_factory=time.monotonic)


class WorkerStatusError(Exception):
    """A worker answered a plain call with an HTTP error status."""

    def __init__(self, worker: str, status: int, body: str):
        super().__init__(f"worker {worker!r} answered HTTP {status}: {body[:300]}")
        self.status_code = status


class WorkerAnswerError(Exception):
    """A worker's plain answer is not a JSON object (truncated, garbled)."""


class Gateway:
    """Pool, prices, champions, the store, one HTTP client for plain calls (all workers) and one
    OpenAI client per worker for streams. Plain calls skip the OpenAI SDK: it builds and validates
    a typed object model per call, which cost the event loop more than the HTTP exchange itself
    (benchmarks/gateway_overhead.py's profile); the gateway passes the worker's JSON on as it is."""

    def __init__(self, cfg: GatewayConfig, pool: Pool | None = None, book: PriceBook | None = None,
                 store: Store | None = None, champions: Champions | None = None):
        self.cfg = cfg
        self.pool = pool or load_pool(cfg.pool_file)
        self.book = book or load_price_book(cfg.price_book)
        check_pool_priced(self.pool, self.book, cfg.price_book)
        self.store = store or Store(cfg.db_url, hold_lease_s=cfg.hold_lease_s)
        self.champions = champions or Champions(list(cfg.routers), self.pool, self.book)
        self.systems = {w.name: str(w.generation.get("system", "")) for w in self.pool.workers}
        self._clients: dict[str, openai.AsyncOpenAI] = {}
        self._http: httpx.AsyncClient | None = None
        self._workers: dict[str, Any] | None = None  # the executor's Worker objects (orchestrator champions)
        self._runners: dict[str, OrchestraRunner] = {}  # per served name: its current champion's
        self._rng = random.Random()

    # ---------------------------------------------------------------- checking a request

    async def authenticate(self, request: Request) -> KeyInfo:
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else ""
        key = await self.store.alookup(token) if token else None
        if key is None:
            raise RequestError(401, "missing or invalid API key: send `Authorization: Bearer rk-...` with a key from "
                                    "`routerops gateway keys create`", "authentication_error", "invalid_api_key")
        return key

    def resolve(self, model: Any) -> Champion:
        if not isinstance(model, str) or not model:
            raise RequestError(400, "`model` must be 'auto' or 'router:<registered name>'")
        name = self.cfg.routers[0] if model == AUTO else model.removeprefix(ROUTER_PREFIX)
        if not model.startswith(ROUTER_PREFIX) and model != AUTO or name not in self.cfg.routers:
            served = ", ".join([AUTO] + [ROUTER_PREFIX + n for n in self.cfg.routers])
            raise RequestError(404, f"model {model!r} is not routed here; use one of: {served}", code="model_not_found")
        champion = self.champions.current(name)
        if champion is None:
            raise RequestError(503, f"{name} has no servable champion yet (see GET /v1/models)", "server_error")
        return champion

    def max_tokens(self, body: dict[str, Any], champion: Champion) -> int:
        """The request's limit (or the largest of its workers' own, or the default), within the cap."""
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        if asked is None:
            limits = [self.pool.worker(w).generation.get("max_tokens") for w in champion.router.workers]
            asked = max([int(x) for x in limits if x] or [self.cfg.default_max_tokens])
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
            raise RequestError(400, f"`max_tokens` must be a positive integer, got {asked!r}")
        if asked > self.cfg.max_tokens_cap:
            raise RequestError(400, f"`max_tokens` {asked} is above this gateway's cap of {self.cfg.max_tokens_cap}")
        return asked

    # ---------------------------------------------------------------- deciding and paying

    async def open_call(self, key: KeyInfo, body: dict[str, Any], champion: Champion | None = None) -> Call:
        """Decide which worker answers (single-turn and MTRouter champions) and reserve its worst case."""
        champion = champion or self.resolve(body.get("model"))
        messages = check_messages(body.get("messages"))
        max_tokens = self.max_tokens(body, champion)
        request_budget = optional_number(body, "budget_usd", math.inf)
        cost_weight = optional_number(body, "cost_weight", self.cfg.cost_weight)
        try:
            turns_left = turns_left_of(body)
        except ChatMappingError as exc:
            raise RequestError(400, exc.message) from None
        remaining = await self.store.aremaining_usd(key)
        budget = min(remaining, request_budget)
        scorer = champion.scorer
        try:
            if scorer.is_quick(messages):
                estimate = scorer.estimate(messages, budget, turns_left)
            else:  # the encoder (torch) or a router of unknown cost: off the event loop
                estimate = await asyncio.to_thread(scorer.estimate, messages, budget, turns_left)
        except ChatMappingError as exc:
            raise RequestError(400, exc.message) from None
        decision = decide(estimate, champion.name, champion.version, self.book, messages, self.systems, max_tokens,
                          budget, remaining, cost_weight, self.cfg.epsilon, self._rng, uuid.uuid4().hex,
                          scorer.family)
        if decision is None:
            # A router that stops (MTRouter's STOP) is answered as when no worker is affordable.
            message = over_budget_message(key, remaining, request_budget, self, champion, messages, max_tokens)
            raise RequestError(429, f"{estimate.stop}; {message}" if estimate.stop else message,
                               "insufficient_quota", "budget_exceeded")
        try:
            held = await self.store.areserve(key, decision.candidate(decision.chosen).worst_cost_usd)
        except BudgetRefused:
            raise RequestError(429, f"key {key.key_id}: concurrent requests used the remaining budget "
                                    f"(${await self.store.aremaining_usd(key):.6g} left of ${key.budget_usd:.6g} per "
                                    f"{key.period})", "insufficient_quota", "budget_exceeded") from None
        return Call(key, champion, decision, held, body)

    def orchestra_runner(self, champion: Champion) -> OrchestraRunner:
        """The executor's runner for an orchestrator champion, made once per champion version (only the
        latest is kept: a swapped-out controller is freed once its requests finish); the pool's Worker
        objects (LLM clients, the sandbox, sympy) are built once per gateway."""
        runner = self._runners.get(champion.name)
        if runner is None or runner.served is not champion.router:
            if self._workers is None:
                try:
                    self._workers = build_workers(self.pool, self.cfg.local_base_url or None)
                except RouteropsError as exc:
                    raise RequestError(503, f"the orchestrator's workers cannot run here: {exc}", "server_error") from exc
            runner = self._runners[champion.name] = OrchestraRunner(champion.router, self.pool, self.book, self._workers)
        return runner

    def base_url(self, worker: str) -> str:
        spec = self.pool.worker(worker)
        base_url = self.cfg.local_base_url if spec.endpoint == "local" else spec.endpoint
        if not base_url:
            raise RequestError(503, f"worker {worker!r} is served locally but the gateway has no --local-base-url",
                               "server_error")
        return base_url.rstrip("/")

    def client(self, worker: str) -> openai.AsyncOpenAI:
        """The worker's OpenAI client (streams), made once."""
        if worker not in self._clients:
            spec = self.pool.worker(worker)
            self._clients[worker] = openai.AsyncOpenAI(base_url=self.base_url(worker), api_key=api_key_for(spec),
                                                       timeout=spec.timeout_s, max_retries=0)
        return self._clients[worker]

    @property
    def http(self) -> httpx.AsyncClient:
        """The plain calls' HTTP client, made once (its pool keeps connections to the workers open)."""
        if self._http is None:
            self._http = httpx.AsyncClient(limits=HTTP_LIMITS)
        return self._http

    async def post_chat(self, worker: str, request: dict[str, Any]) -> dict[str, Any]:
        """A plain chat completion from `worker`: its JSON answer, or WorkerStatusError / httpx errors."""
        spec = self.pool.worker(worker)
        response = await self.http.post(f"{self.base_url(worker)}/chat/completions", json=request,
                                        headers={"Authorization": f"Bearer {api_key_for(spec)}"},
                                        timeout=spec.timeout_s)
        if response.status_code >= 400:
            raise WorkerStatusError(worker, response.status_code, response.text)
        try:
            answer = response.json()
        except ValueError as exc:
            raise WorkerAnswerError(f"worker {worker!r} answered no JSON: {exc}") from exc
        if not isinstance(answer, dict):
            raise WorkerAnswerError(f"worker {worker!r} answered {type(answer).__name__}, not a JSON object")
        return answer

    def worker_request(self, call: Call, worker: str) -> dict[str, Any]:
        request = chat_request(self.pool.worker(worker), call.body["messages"], call.decision.max_tokens)
        request.update({k: call.body[k] for k in PASSED_PARAMS if k in call.body})
        return request

    async def switch_to(self, call: Call, worker: str) -> bool:
        """Move the reservation to a fallback worker's worst case; False if the budget cannot cover it."""
        if worker == call.decision.chosen:
            return True
        try:
            call.held = await self.store.aresize(call.held, call.decision.candidate(worker).worst_cost_usd,
                                          call.key.budget_usd)
        except BudgetRefused:
            call.decision.attempts.append({"worker": worker, "error": "skipped: its worst case is over the budget"})
            return False
        return True

    def close_call(self, call: Call, worker: str, status: str, usage: dict[str, int], response: str,
                   usage_source: str = "worker") -> float:
        """Settle the reservation with the real cost and log the decision; returns the cost charged.
        The settlement is queued, not awaited (gateway/store.py: the store's thread writes it in order,
        and the app's shutdown waits for it)."""
        cost = (self.book.cost(worker, usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                               usage.get("cached_tokens", 0)) if worker else 0.0)
        cost = min(cost, call.held.nusd / 1e9)  # never above what was reserved (store.settle caps it too)
        d = call.decision
        query = d.query_text if self.cfg.log_texts else ""  # what the router read (families.py)
        self.store.settle_later(call.held, cost, {
            "decision_id": d.decision_id, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "key_id": call.key.key_id, "router": d.router, "router_version": d.router_version,
            "price_book_version": self.book.version, "query_id": d.query_id, "query": query, "chosen": d.chosen,
            "worker": worker, "propensity": d.propensity, "explanation": explanation(d, worker, cost),
            "status": status, "prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0), "cost_usd": cost, "usage_source": usage_source,
            "response": response if self.cfg.log_texts else "", "latency_s": time.monotonic() - call.started})
        return cost

    async def aclose(self) -> None:
        """Close the worker clients and write every queued settlement and decision."""
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        for worker in (self._workers or {}).values():
            if hasattr(worker, "aclose"):
                await worker.aclose()
        self._workers = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        await asyncio.to_thread(self.store.close)


# ---------------------------------------------------------------- request checks


def check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "`messages` must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(400, f"`messages[{i}]` must be an object with a `role`")
    return messages


def optional_number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise RequestError(400, f"`{name}` must be a number ≥ 0, got {value!r}")
    return float(value)


def over_budget_message(key: KeyInfo, remaining: float, request_budget: float, gw: Gateway, champion: Champion,
                        messages: list, max_tokens: int) -> str:
    cheapest = min(gw.book.cost(w, prompt_token_bound(messages, gw.systems.get(w, "")), max_tokens)
                   for w in champion.router.workers)
    limit = (f"this request's budget_usd ${request_budget:.6g}" if request_budget < remaining else
             f"key {key.key_id} has ${remaining:.6g} left of its ${key.budget_usd:.6g} per-{key.period} budget")
    return (f"over budget: {limit}, and the cheapest worker may cost up to ${cheapest:.6g} for this request "
            f"(max_tokens={max_tokens}); lower max_tokens or wait for the next {key.period}")


def explanation(decision: Decision, worker: str, cost: float) -> dict[str, Any]:
    """The decision's explanation plus who was paid what: the chosen worker's share of the cost."""
    record = decision.explanation()
    record.update({"worker": worker, "cost_usd": cost,
                   "cost_share": {worker: 1.0} if worker and cost > 0 else {},
                   "fell_back": bool(worker) and worker != decision.chosen})
    return record


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


def usage_in(answer: dict[str, Any]) -> dict[str, int] | None:
    """usage_of() for a worker's JSON answer."""
    usage = answer.get("usage")
    if not isinstance(usage, dict) or usage.get("prompt_tokens") is None:
        return None
    details = usage.get("prompt_tokens_details")
    return {"prompt_tokens": int(usage["prompt_tokens"]), "completion_tokens": int(usage.get("completion_tokens") or 0),
            "cached_tokens": int((details or {}).get("cached_tokens") or 0) if isinstance(details, dict) else 0}


def usage_of(obj: Any) -> dict[str, int] | None:
    usage = getattr(obj, "usage", None)
    if usage is None or getattr(usage, "prompt_tokens", None) is None:
        return None
    details = getattr(usage, "prompt_tokens_details", None)
    return {"prompt_tokens": int(usage.prompt_tokens), "completion_tokens": int(usage.completion_tokens or 0),
            "cached_tokens": int(getattr(details, "cached_tokens", None) or 0)}


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


async def first_answer(gw: Gateway, call: Call, stream: bool) -> tuple[str, Any]:
    """(worker, completion or stream) from the first worker in the decision's order that answers."""
    for worker in call.decision.order:
        if not await gw.switch_to(call, worker):
            continue
        request = gw.worker_request(call, worker)
        try:
            if stream:
                request.update(stream=True, stream_options={"include_usage": True})
                return worker, await gw.client(worker).chat.completions.create(**request)
            return worker, await gw.post_chat(worker, request)
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
    worker, body = await first_answer(gw, call, stream=False)
    usage = usage_in(body)
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


def bounded_usage(gw: Gateway, call: Call, worker: str, completion_tokens: int) -> dict[str, int]:
    """Token counts for a worker that reported none: the prompt's bound and the tokens counted (or
    max_tokens), so the charge never falls below the real cost nor rises above the reservation."""
    return {"prompt_tokens": prompt_token_bound(call.body["messages"], gw.systems.get(worker, "")),
            "completion_tokens": completion_tokens}


async def stream(gw: Gateway, call: Call) -> StreamingResponse:
    worker, chunks = await first_answer(gw, call, stream=True)
    return StreamingResponse(sse(gw, call, worker, chunks), media_type="text/event-stream",
                             headers=headers_for(call, worker, None))


async def sse(gw: Gateway, call: Call, worker: str, chunks: Any):
    """The worker's chunks as server-sent events, then one chunk with `usage` and `routerops`.
    Workers that send no usage in streams (llama.cpp's server): completion tokens are counted as
    content chunks (one token each there) and prompt tokens bounded, marked usage_source=estimated."""
    usage, pieces, status, last = None, [], "client_gone", None
    try:
        async for chunk in chunks:
            usage = usage_of(chunk) or usage
            last = chunk
            if chunk.choices:
                piece = chunk.choices[0].delta.content if chunk.choices[0].delta else None
                if piece:
                    pieces.append(piece)
                data = chunk.model_dump(exclude_unset=True)
                data["model"] = call.body["model"]
                yield f"data: {json.dumps(data)}\n\n"
        status = "ok"
    except openai.APIError as exc:
        status = "worker_error"
        call.decision.attempts.append({"worker": worker, "error": f"stream broke: {str(exc)[:200]}"})
    finally:
        source = "worker" if usage else "estimated"
        if usage is None:
            usage = bounded_usage(gw, call, worker, len(pieces))
        cost = gw.close_call(call, worker, status, usage, "".join(pieces), source)
    final = {"id": getattr(last, "id", call.decision.decision_id), "object": "chat.completion.chunk",
             "created": getattr(last, "created", int(time.time())), "model": call.body["model"], "choices": [],
             "usage": {"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
                       "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]},
             "routerops": {**routerops_field(call, worker, cost, bool(call.body.get("explain"))),
                           "usage_source": source, "price_book_version": gw.book.version}}
    yield f"data: {json.dumps(final)}\n\n"
    yield "data: [DONE]\n\n"


# ---------------------------------------------------------------- the app


def create_app(gw: Gateway) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        await gw.aclose()  # on shutdown: nothing queued for the database is lost

    app = FastAPI(title="routerops gateway", description="OpenAI-compatible routing gateway", lifespan=lifespan)
    app.state.gateway = gw

    @app.exception_handler(RequestError)
    async def on_request_error(request: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        key = await gw.authenticate(request)
        try:
            body = await request.json()
        except json.JSONDecodeError:
            raise RequestError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        if body.get("n", 1) != 1:
            raise RequestError(400, "`n` must be 1: one routed answer per request")
        champion = gw.resolve(body.get("model"))
        if champion.family == ORCHESTRATOR:
            return await answer_orchestrated(gw, key, body, champion, check_messages(body.get("messages")),
                                             optional_number(body, "budget_usd", math.inf))
        if champion.family == CRITIQUE:
            return await answer_critiqued(gw, key, body, champion, check_messages(body.get("messages")),
                                          optional_number(body, "budget_usd", math.inf))
        call = await gw.open_call(key, body, champion)
        return await (stream(gw, call) if body.get("stream") else complete(gw, call))

    @app.get("/v1/models")
    async def models(request: Request):
        await gw.authenticate(request)
        data = []
        for model, name in [(AUTO, gw.cfg.routers[0])] + [(ROUTER_PREFIX + n, n) for n in gw.cfg.routers]:
            champion = gw.champions.current(name)
            data.append({"id": model, "object": "model", "created": 0, "owned_by": "routerops",
                         "routerops": {"router": name, "family": champion.family if champion else None,
                                       "router_family": getattr(champion.router, "family", None) if champion else None,
                                       "version": champion.version if champion else None,
                                       "workers": champion.router.workers if champion else [],
                                       "loaded_at": champion.loaded_at if champion else None,
                                       "refused": gw.champions.refusals.get(name, [])}})
        return {"object": "list", "data": data}

    @app.get("/v1/decisions/{decision_id}")
    async def get_decision(decision_id: str, request: Request):
        return await own_decision(gw, await gw.authenticate(request), decision_id)

    @app.post("/v1/decisions/{decision_id}/feedback")
    async def feedback(decision_id: str, request: Request):
        await own_decision(gw, await gw.authenticate(request), decision_id)
        score = (await request.json()).get("score")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 1:
            raise RequestError(400, f"`score` must be a number in [0, 1], got {score!r}")
        await asyncio.to_thread(gw.store.record_score, decision_id, float(score))
        return {"decision_id": decision_id, "score": float(score)}

    return app


async def own_decision(gw: Gateway, key: KeyInfo, decision_id: str) -> dict[str, Any]:
    record = await asyncio.to_thread(gw.store.decision, decision_id)
    if record is None or record["key_id"] != key.key_id:  # another key's decision is not even acknowledged
        raise RequestError(404, f"no decision {decision_id!r} for this key", code="decision_not_found")
    return record

