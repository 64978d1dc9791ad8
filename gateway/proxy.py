"""The gateway itself, apart from its HTTP routes (gateway/app.py) and its answers (gateway/answers.py):
its configuration (`GatewayConfig`, what `routerops gateway serve` runs with), and `Gateway`, which holds
the champions, the pool and price book, the key store and the worker clients, and opens, bounds and
settles each call (reserve the worst case, charge the real cost, log the decision)."""

from __future__ import annotations

import asyncio
import functools
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
from fastapi import Request

from gateway.admission import Admission
from gateway.champion import Champion, Champions
from gateway.errors import RequestError
from gateway.families import ChatMappingError
from gateway.families.orchestra import OrchestraRunner
from gateway.parsing import SAMPLING_FIELDS, TOOL_FIELDS, ChatRequest, check_chat_request
from gateway.routing import Decision, decide, prompt_token_bound
from gateway.serving import KEY
from gateway.store import BudgetRefused, KeyInfo, Reservation, Store
from gateway.upstream import BadUsage, read_answer
from routerops.errors import InputError, RouteropsError
from routerops.pricing import Pool, PriceBook, check_pool_priced, load_pool, load_price_book
from routerops.workers import build_workers
from routerops.workers.endpoints import EndpointError, ServedEndpoints
from routerops.workers.llm import api_key_for, chat_request

log = logging.getLogger(__name__)
AUTO = "auto"
ROUTER_PREFIX = "router:"
PASSED_PARAMS = SAMPLING_FIELDS  # client sampling settings passed on to the worker (gateway/parsing.py)
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
    # Where the pool's `replay:<table>` endpoints are served: a JSON object endpoint -> base URL
    # (`--local-server` starts them and fills it; routerops/workers/endpoints.py).
    replay_urls: str = ""
    watch_interval_s: float = 10.0  # how often the registry alias is polled for a new champion
    default_max_tokens: int = 256  # when neither the request nor the worker sets max_tokens
    max_tokens_cap: int = 4096  # the most a request may ask for (it bounds the worst-case cost)
    cost_weight: float = 0.0  # λ: 0 = the best affordable worker; > 0 trades quality for cost
    epsilon: float = 0.0  # exploration: P(a uniformly drawn affordable worker), logged as propensity
    log_texts: bool = False  # keep the query and response texts in the decision log (only when told to)
    # Without texts, store the query's embedding (routers with an encoder): what off-policy evaluation
    # and retraining of routers that read only the embedding need (evaluation/ope.py; README privacy).
    log_embeddings: bool = True
    hold_lease_s: float = 3600.0  # a budget hold not settled by then is a dead process's: released (store.py)
    max_body_bytes: int = 8 * 2**20  # a larger request body is refused (413) before it is parsed
    # A request's intake, before it may take a slot (gateway/intake.py, gateway/serving.py): its body must
    # arrive within body_timeout_s of its headers (408), its head within header_timeout_s of its first byte
    # (408, `gateway serve`'s protocol) with at most max_headers fields and max_header_bytes (431); one key
    # may send key_requests_per_s (0: no limit; a burst of one second's worth) before a 429 with Retry-After;
    # the process keeps at most max_connections open (beyond: 503 and closed at once).
    body_timeout_s: float = 10.0
    header_timeout_s: float = 10.0
    max_headers: int = 100
    max_header_bytes: int = 32 * 2**10
    key_requests_per_s: float = 1000.0
    max_connections: int = 1000
    # Admission control (gateway/admission.py), per process: requests served at once (at most), requests
    # waiting for a slot, the longest a request may wait from its arrival in the kernel, and the
    # event-loop lag above which new requests are refused (503).
    max_in_flight: int = 256
    max_queue: int = 256
    max_queue_wait_s: float = 0.05
    max_loop_lag_ms: float = 0.0  # 0: the loop's lag is not watched
    # The adaptive limit's target: the median overhead this far above the unloaded one (0: the limit is
    # max_in_flight, fixed; `gateway serve` adapts it by default, gateway/cli.py).
    max_overhead_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.routers:
            raise InputError("gateway config", "routers", "name at least one registered router")
        for name, value, low in (("watch_interval_s", self.watch_interval_s, 0.01), ("cost_weight", self.cost_weight, 0),
                                 ("default_max_tokens", self.default_max_tokens, 1),
                                 ("max_tokens_cap", self.max_tokens_cap, 1), ("max_body_bytes", self.max_body_bytes, 1),
                                 ("body_timeout_s", self.body_timeout_s, 0.001),
                                 ("header_timeout_s", self.header_timeout_s, 0.001), ("max_headers", self.max_headers, 1),
                                 ("max_header_bytes", self.max_header_bytes, 64),
                                 ("key_requests_per_s", self.key_requests_per_s, 0),
                                 ("max_connections", self.max_connections, 1),
                                 ("max_in_flight", self.max_in_flight, 1), ("max_queue", self.max_queue, 0),
                                 ("max_queue_wait_s", self.max_queue_wait_s, 0),
                                 ("max_loop_lag_ms", self.max_loop_lag_ms, 0),
                                 ("max_overhead_ms", self.max_overhead_ms, 0)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= low):
                raise InputError("gateway config", name, f"expected a number ≥ {low}, got {value!r}")
        try:
            ServedEndpoints.from_settings(self.local_base_url, self.replay_urls)
        except EndpointError as exc:
            raise InputError("gateway config", "replay_urls", str(exc).removeprefix("replay_urls: ")) from None
        if not 0 <= self.epsilon <= 1:
            raise InputError("gateway config", "epsilon", f"expected a probability, got {self.epsilon!r}")


@dataclass
class Call:
    """One request in flight: who pays, what was decided, what is held."""

    key: KeyInfo
    champion: Champion
    decision: Decision
    held: Reservation
    request: ChatRequest
    started: float = field(default_factory=time.monotonic)
    called: str = ""  # the last worker sent the request (it may bill)
    closed: bool = False  # settled (or released) and logged: close_call runs once
    bad_answers_usd: float = 0.0  # the worst cases charged for answers with impossible usage (gateway/upstream.py)

    @property
    def body(self) -> dict[str, Any]:
        return self.request.body


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
        self.accepts = {w.name: dict(w.accepts) for w in self.pool.workers}
        self.admission = Admission(cfg.max_in_flight, cfg.max_queue, cfg.max_queue_wait_s, cfg.max_loop_lag_ms,
                                   max_overhead_ms=cfg.max_overhead_ms)
        self.counts: dict[str, int] = {}  # responses by status, overruns (GET /metrics)
        self.overrun_usd = 0.0
        self._clients: dict[str, openai.AsyncOpenAI] = {}
        self._http: httpx.AsyncClient | None = None
        self._workers: dict[str, Any] | None = None  # the executor's Worker objects (orchestrator champions)
        self._runners: dict[str, OrchestraRunner] = {}  # per served name: its current champion's
        self._rng = random.Random()

    # ---------------------------------------------------------------- checking a request

    async def authenticate(self, request: Request) -> KeyInfo:
        known = request.scope.get("state", {}).get(KEY)  # authenticated at the intake (gateway/intake.py)
        return known if known is not None else await self.key_for(request.headers.get("authorization", ""))

    async def key_for(self, header: str) -> KeyInfo:
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

    def max_tokens(self, req: ChatRequest, champion: Champion) -> int:
        """The request's limit (or the largest of its workers' own, or the default), within the cap. Each
        limit sent is within it, the one that wins or not (the schema, gateway/openapi.py, says so)."""
        for name in ("max_tokens", "max_completion_tokens"):
            sent = req.body.get(name)
            if sent is not None and sent > self.cfg.max_tokens_cap:  # an integer: check_chat_request
                raise RequestError(400, f"`{name}` {sent} is above this gateway's cap of {self.cfg.max_tokens_cap}",
                                   param=name)
        asked = req.max_tokens
        if asked is None:
            limits = [self.pool.worker(w).generation.get("max_tokens") for w in champion.router.workers]
            asked = max([int(x) for x in limits if x] or [self.cfg.default_max_tokens])
        if asked > self.cfg.max_tokens_cap:
            raise RequestError(400, f"`max_tokens` {asked} is above this gateway's cap of {self.cfg.max_tokens_cap}",
                               param="max_tokens")
        return asked

    def prompt_bounds(self, req: ChatRequest, workers: list[str]) -> dict[str, float]:
        """Each worker's bound on the prompt tokens it can bill for this request (gateway/routing.py);
        inf for a worker whose pool entry does not accept its media parts or tools. A request no
        worker accepts is refused (400) before any budget is touched."""
        bounds = {w: prompt_token_bound(req.messages, self.systems.get(w, ""), self.accepts.get(w, {}), req.body)
                  for w in workers}
        if not any(math.isfinite(b) for b in bounds.values()):
            sent = [f"{n} {kind} part(s)" for kind, n in sorted(req.media.items())] + (["tools"] if req.tools else [])
            accepted = {w: sorted(self.accepts.get(w, {})) for w in workers}
            raise RequestError(400, f"this request sends {', '.join(sent)}, which no worker of this router accepts "
                                    f"(pool entries' `accepts`: {accepted}); send text only",
                               code="unsupported_content", param="messages" if req.media else "tools")
        return bounds

    # ---------------------------------------------------------------- deciding and paying

    async def open_call(self, key: KeyInfo, req: ChatRequest | dict[str, Any], champion: Champion | None = None) -> Call:
        """Decide which worker answers (single-turn and MTRouter champions) and reserve its worst case."""
        req = req if isinstance(req, ChatRequest) else check_chat_request(req)
        champion = champion or self.resolve(req.model)
        messages = req.messages
        max_tokens = self.max_tokens(req, champion)
        request_budget = req.budget_usd
        cost_weight = self.cfg.cost_weight if req.cost_weight is None else req.cost_weight
        turns_left = req.turns_left
        bounds = self.prompt_bounds(req, list(champion.router.workers))
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
        decision = decide(estimate, champion.name, champion.version, self.book, bounds, max_tokens,
                          budget, remaining, cost_weight, self.cfg.epsilon, self._rng, uuid.uuid4().hex,
                          scorer.family)
        if decision is None:
            # A router that stops (MTRouter's STOP) is answered as when no worker is affordable.
            message = over_budget_message(key, remaining, request_budget, self, champion, bounds, max_tokens)
            raise RequestError(429, f"{estimate.stop}; {message}" if estimate.stop else message,
                               "insufficient_quota", "budget_exceeded")
        try:
            held = await self.store.areserve(key, decision.candidate(decision.chosen).worst_cost_usd)
        except BudgetRefused:
            raise RequestError(429, f"key {key.key_id}: concurrent requests used the remaining budget "
                                    f"(${await self.store.aremaining_usd(key):.6g} left of ${key.budget_usd:.6g} per "
                                    f"{key.period})", "insufficient_quota", "budget_exceeded") from None
        return Call(key, champion, decision, held, req)

    def orchestra_runner(self, champion: Champion) -> OrchestraRunner:
        """The executor's runner for an orchestrator champion, made once per champion version (only the
        latest is kept: a swapped-out controller is freed once its requests finish); the pool's Worker
        objects (LLM clients, the sandbox, sympy) are built once per gateway."""
        runner = self._runners.get(champion.name)
        if runner is None or runner.served is not champion.router:
            if self._workers is None:
                try:
                    self._workers = build_workers(self.pool, self.endpoints)
                except RouteropsError as exc:
                    raise RequestError(503, f"the orchestrator's workers cannot run here: {exc}", "server_error") from exc
            runner = self._runners[champion.name] = OrchestraRunner(champion.router, self.pool, self.book, self._workers)
        return runner

    def base_url(self, worker: str) -> str:
        spec = self.pool.worker(worker)
        if spec.endpoint == "local" and not self.cfg.local_base_url:
            raise RequestError(503, f"worker {worker!r} is served locally but the gateway has no --local-base-url",
                               "server_error")
        try:
            return self.endpoints.url_for(spec).rstrip("/")
        except EndpointError as exc:
            raise RequestError(503, str(exc), "server_error") from None

    @functools.cached_property
    def endpoints(self) -> ServedEndpoints:
        """Where the pool's LLM workers are served (`local_base_url`, `replay_urls`)."""
        return ServedEndpoints.from_settings(self.cfg.local_base_url, self.cfg.replay_urls)

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
            return read_answer(response.content)
        except BadUsage:
            raise
        except ValueError as exc:
            raise WorkerAnswerError(f"worker {worker!r} answered {exc}") from exc

    def worker_request(self, call: Call, worker: str) -> dict[str, Any]:
        """What `worker` is sent: nothing its reservation does not bound (gateway/routing.py)."""
        request = chat_request(self.pool.worker(worker), call.body["messages"], call.decision.max_tokens)
        request.update({k: call.body[k] for k in PASSED_PARAMS if call.body.get(k) is not None})
        if call.request.tools:  # only a worker that accepts tools is ever affordable for such a request
            request.update({k: call.body[k] for k in TOOL_FIELDS if call.body.get(k) is not None})
        return request

    async def switch_to(self, call: Call, worker: str) -> bool:
        """Move the reservation to a fallback worker's worst case; False if the budget cannot cover it."""
        if worker == call.decision.chosen:
            return True
        try:
            # the worst cases charged for impossible answers stay held beside the new worker's
            call.held = await self.store.aresize(call.held, call.decision.candidate(worker).worst_cost_usd
                                                 + call.bad_answers_usd, call.key.budget_usd)
        except BudgetRefused:
            call.decision.attempts.append({"worker": worker, "error": "skipped: its worst case is over the budget"})
            return False
        return True

    def close_call(self, call: Call, worker: str, status: str, usage: dict[str, int], response: str,
                   usage_source: str = "worker") -> float:
        """Settle the reservation with the real cost and log the decision; returns the cost charged.
        The cost is what the worker's reported usage costs, even above the reservation (the worker has
        billed it): the overrun is charged, logged, counted and recorded (gateway/store.py), and the
        key's next reservation sees it. The settlement is queued, not awaited (gateway/store.py: the
        store's thread writes it in order, and the app's shutdown waits for it). Runs once per call; the
        worst cases of answers with impossible usage (gateway/upstream.py) are charged with it."""
        if call.closed:
            return 0.0
        call.closed = True
        cost = (self.book.cost(worker, usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                               usage.get("cached_tokens", 0)) if worker else 0.0)
        cost = max(cost, 0.0) + call.bad_answers_usd  # never below zero: a charge only ever adds to spend
        d = call.decision
        reserved = call.held.nusd / 1e9
        if cost > reserved + 1e-12:
            d.attempts.append({"worker": worker, "overrun_usd": cost - reserved, "reserved_usd": reserved,
                               "usage": dict(usage)})
            self.count("overruns")
            self.overrun_usd += cost - reserved
            log.warning("worker %s billed $%.9f, above the $%.9f reserved for decision %s (key %s): charged",
                        worker, cost, reserved, d.decision_id, call.key.key_id)
        query = d.query_text if self.cfg.log_texts else ""  # what the router read (families.py)
        self.store.settle_later(call.held, cost, {
            "decision_id": d.decision_id, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "key_id": call.key.key_id, "router": d.router, "router_version": d.router_version,
            "price_book_version": self.book.version, "query_id": d.query_id, "query": query, "chosen": d.chosen,
            "worker": worker, "propensity": d.propensity, "explanation": explanation(d, worker, cost),
            "status": status, "prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0), "cost_usd": cost, "usage_source": usage_source,
            "response": response if self.cfg.log_texts else "", "latency_s": time.monotonic() - call.started,
            "embedding": self.logged_embedding(call)})
        return cost

    def close_unsettled(self, call: Call) -> None:
        """Settle a call an unforeseen error ended (no-op once closed): its worst case if a worker was
        called (it may have billed), else nothing."""
        if not call.closed:
            worker = call.called
            usage = bounded_usage(self, call, worker, call.decision.max_tokens) if worker else {}
            self.close_call(call, worker, "error", usage, "", "worst_case" if worker else "worker")

    def logged_embedding(self, call: Call) -> str:
        """The query's embedding as JSON when texts are not kept and the champion reads one (its LRU holds
        the vector the decision used: no second encoding), else ""."""
        embed = call.champion.embed
        if self.cfg.log_texts or not self.cfg.log_embeddings or embed is None or not call.decision.query_text:
            return ""
        return json.dumps([round(float(x), 6) for x in embed(call.decision.query_text)])

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
        self.admission.close()
        await asyncio.to_thread(self.store.close)

    def count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def metrics(self) -> str:
        """Prometheus text format: admission (gateway/admission.py), responses by status, overruns."""
        a = self.admission.stats
        lines = ["# TYPE routerops_gateway_admitted_total counter", f"routerops_gateway_admitted_total {a.admitted}",
                 "# TYPE routerops_gateway_queued_total counter", f"routerops_gateway_queued_total {a.queued}",
                 "# TYPE routerops_gateway_shed_total counter"]
        lines += [f'routerops_gateway_shed_total{{reason="{r}"}} {getattr(a, "shed_" + r)}'
                  for r in ("queue_full", "queue_wait", "late", "loop_lag")]
        lines += ["# TYPE routerops_gateway_in_flight gauge", f"routerops_gateway_in_flight {a.in_flight}",
                  "# TYPE routerops_gateway_waiting gauge", f"routerops_gateway_waiting {a.waiting}",
                  "# TYPE routerops_gateway_limit gauge", f"routerops_gateway_limit {a.limit}",
                  "# TYPE routerops_gateway_loop_lag_ms gauge", f"routerops_gateway_loop_lag_ms {a.loop_lag_ms:.3f}",
                  "# TYPE routerops_gateway_overhead_ms gauge", f"routerops_gateway_overhead_ms {a.overhead_ms:.3f}",
                  "# TYPE routerops_gateway_window_loop_lag_ms gauge",
                  f"routerops_gateway_window_loop_lag_ms {a.window_loop_lag_ms:.3f}",
                  "# TYPE routerops_gateway_baseline_overhead_ms gauge",
                  f"routerops_gateway_baseline_overhead_ms {a.baseline_overhead_ms:.3f}",
                  "# TYPE routerops_gateway_responses_total counter"]
        lines += [f'routerops_gateway_responses_total{{status="{k[7:]}"}} {v}'
                  for k, v in sorted(self.counts.items()) if k.startswith("status_")]
        lines += ["# TYPE routerops_gateway_overruns_total counter",
                  f"routerops_gateway_overruns_total {self.counts.get('overruns', 0)}",
                  "# TYPE routerops_gateway_overrun_usd_total counter",
                  f"routerops_gateway_overrun_usd_total {self.overrun_usd:.9f}"]
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- request checks


def over_budget_message(key: KeyInfo, remaining: float, request_budget: float, gw: Gateway, champion: Champion,
                        bounds: dict[str, float], max_tokens: int) -> str:
    cheapest = min(gw.book.cost(w, bounds[w], max_tokens) for w in champion.router.workers
                   if math.isfinite(bounds[w]))
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


def bounded_usage(gw: Gateway, call: Call, worker: str, completion_tokens: int) -> dict[str, int]:
    """Token counts for a worker that reported none: the prompt's bound and the tokens counted (or
    max_tokens), so the charge never falls below the real cost nor rises above the reservation."""
    bound = prompt_token_bound(call.request.messages, gw.systems.get(worker, ""), gw.accepts.get(worker, {}),
                               call.body)
    return {"prompt_tokens": int(bound), "completion_tokens": completion_tokens}
