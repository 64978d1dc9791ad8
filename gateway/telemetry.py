"""What a served gateway reports: Prometheus metrics and OpenTelemetry traces (`gateway serve`).

Metrics (GET /metrics, after the admission counters of gateway/app.py), one series per router and
worker, both bounded sets (the served names and the pool's workers; anything else reads `other`), and
per key only when `observability.key_labels` asks (a `key` label holding the key id: one series per
key, so keep it for deployments with few keys):

    routerops_gateway_routed_requests_total{router, worker, status}   settled requests (status: ok,
                                                                       worker_error, client_gone, ...)
    routerops_gateway_spend_usd_total{router, worker}                 USD charged under the price book
    routerops_gateway_tokens_total{router, worker, kind}              kind: prompt | completion
    routerops_gateway_request_seconds{router, worker}                 histogram: arrival to settlement
    routerops_gateway_fallbacks_total{router, worker}                 calls to `worker` that failed and
                                                                       fell back to the next worker

`worker` is the one that answered ("none" when none did). Every family settles through the store
(gateway/store.py: settle_later), so the series are recorded there, once per request.

Traces: one span per routed request (`chat.completions`, made by TracingMiddleware around the
route) with the router, version, chosen and answering worker, cost and tokens as attributes, and one
child span per worker call (`worker.call`, each fallback attempt its own) for single-turn and MTRouter
champions. The tracer provider is the gateway's own (MLflow's tracing keeps the global one); spans
are exported only when `observability.otlp_endpoint` is set (OTLP over HTTP, batched), so by
default nothing leaves the process.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.proxy import Gateway, GatewayConfig
from gateway.settings import Observability
from gateway.store import Store

OTHER = "other"
NONE = "none"
STATUSES = frozenset({"ok", "worker_error", "client_gone", "bad_request", "error", "budget_exceeded"})
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TRACED_PATHS = frozenset({"/v1/chat/completions"})


class Telemetry:
    """The gateway's Prometheus registry and tracer; `settled(record)` records one request."""

    def __init__(self, routers: tuple[str, ...] | list[str], settings: Observability | None = None,
                 span_processor: Any = None):
        self.settings = settings or Observability()
        self.routers = frozenset(routers)
        self.workers: frozenset[str] = frozenset()
        self.registry = CollectorRegistry()
        labels = ["router", "worker"] + (["key"] if self.settings.key_labels else [])
        self.requests = Counter("routerops_gateway_routed_requests", "settled routed requests", labels + ["status"],
                                registry=self.registry)
        self.spend = Counter("routerops_gateway_spend_usd", "USD charged under the price book", labels,
                             registry=self.registry)
        self.tokens = Counter("routerops_gateway_tokens", "tokens billed", labels + ["kind"], registry=self.registry)
        self.latency = Histogram("routerops_gateway_request_seconds", "arrival to settlement, seconds",
                                 ["router", "worker"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.fallbacks = Counter("routerops_gateway_fallbacks", "worker calls that failed and fell back",
                                 ["router", "worker"], registry=self.registry)
        self.provider = TracerProvider(resource=Resource.create({"service.name": self.settings.service_name}))
        if span_processor is not None:
            self.provider.add_span_processor(span_processor)
        if self.settings.otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=self.settings.otlp_endpoint)))
        self.tracer = self.provider.get_tracer("routerops.gateway")

    def bind_workers(self, workers: list[str]) -> None:
        self.workers = frozenset(workers)

    def _router(self, name: str) -> str:
        return name if name in self.routers else OTHER

    def _worker(self, name: str) -> str:
        return NONE if not name else name if name in self.workers else OTHER

    def settled(self, record: dict[str, Any]) -> None:
        """One request's settlement (a decision-log row, gateway/store.py): counters, histogram, and
        its attributes on the request's span."""
        router, worker = self._router(str(record.get("router", ""))), self._worker(str(record.get("worker", "")))
        base = {"router": router, "worker": worker}
        if self.settings.key_labels:
            base["key"] = str(record.get("key_id", ""))
        status = str(record.get("status", ""))
        self.requests.labels(**base, status=status if status in STATUSES else OTHER).inc()
        self.spend.labels(**base).inc(max(0.0, float(record.get("cost_usd") or 0.0)))
        for kind in ("prompt", "completion"):
            self.tokens.labels(**base, kind=kind).inc(int(record.get(f"{kind}_tokens") or 0))
        self.latency.labels(router=router, worker=worker).observe(float(record.get("latency_s") or 0.0))
        for attempt in attempts(record):
            if attempt.get("error") and not str(attempt["error"]).startswith("skipped"):
                self.fallbacks.labels(router=router, worker=self._worker(str(attempt.get("worker", "")))).inc()
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes({"routerops.router": str(record.get("router", "")),
                                 "routerops.router_version": str(record.get("router_version", "")),
                                 "routerops.chosen": str(record.get("chosen", "")), "routerops.worker": worker,
                                 "routerops.status": status, "routerops.cost_usd": float(record.get("cost_usd") or 0),
                                 "routerops.decision_id": str(record.get("decision_id", "")),
                                 "gen_ai.usage.input_tokens": int(record.get("prompt_tokens") or 0),
                                 "gen_ai.usage.output_tokens": int(record.get("completion_tokens") or 0)})

    @contextlib.contextmanager
    def worker_span(self, worker: str, stream: bool):
        with self.tracer.start_as_current_span("worker.call", kind=SpanKind.CLIENT,
                                               attributes={"routerops.worker": worker, "routerops.stream": stream},
                                               record_exception=True) as span:
            yield span

    def exposition(self) -> str:
        return generate_latest(self.registry).decode("utf-8")

    def shutdown(self) -> None:
        self.provider.shutdown()


def attempts(record: dict[str, Any]) -> list[dict[str, Any]]:
    explanation = record.get("explanation") or {}
    if isinstance(explanation, str):
        try:
            explanation = json.loads(explanation)
        except ValueError:
            return []
    found = explanation.get("attempts") if isinstance(explanation, dict) else None
    return [a for a in found or [] if isinstance(a, dict)]


class ObservedStore(Store):
    """The gateway's store, telling the telemetry of every settlement (in the request's context, so
    the attributes land on its span)."""

    def __init__(self, url: str, telemetry: Telemetry, **kwargs: Any):
        super().__init__(url, **kwargs)
        self.telemetry = telemetry

    def settle_later(self, held, cost_usd: float, decision: dict[str, Any] | None = None):
        if decision is not None:
            self.telemetry.settled(decision)
        return super().settle_later(held, cost_usd, decision)


class _TracedCompletions:
    """`client.chat.completions.create` of one worker's OpenAI client inside a `worker.call` span
    (the stream's span ends when the worker's headers arrive: the rest is the request span's)."""

    def __init__(self, client: Any, worker: str, telemetry: Telemetry):
        self._client, self._worker, self._telemetry = client, worker, telemetry
        self.chat = self
        self.completions = self

    async def create(self, **request: Any) -> Any:
        with self._telemetry.worker_span(self._worker, bool(request.get("stream"))):
            return await self._client.chat.completions.create(**request)

    async def close(self) -> None:
        await self._client.close()


class ObservedGateway(Gateway):
    """A Gateway whose settlements feed `telemetry` and whose worker calls are spans (what `gateway
    serve` runs; a Gateway made in code has neither unless it is made this way)."""

    def __init__(self, cfg: GatewayConfig, telemetry: Telemetry, **kwargs: Any):
        kwargs.setdefault("store", ObservedStore(cfg.db_url, telemetry, hold_lease_s=cfg.hold_lease_s))
        super().__init__(cfg, **kwargs)
        self.telemetry = telemetry
        telemetry.bind_workers([w.name for w in self.pool.workers])

    def instrument(self, app) -> None:
        """Each request a span (gateway/ops.py calls this as it assembles the app)."""
        app.add_middleware(TracingMiddleware, telemetry=self.telemetry)

    async def post_chat(self, worker: str, request: dict[str, Any]) -> dict[str, Any]:
        with self.telemetry.worker_span(worker, False):
            return await super().post_chat(worker, request)

    def client(self, worker: str) -> Any:
        return _TracedCompletions(super().client(worker), worker, self.telemetry)

    def metrics(self) -> str:
        return super().metrics() + self.telemetry.exposition()

    async def aclose(self) -> None:
        await super().aclose()
        self.telemetry.shutdown()


class TracingMiddleware:
    """ASGI: a server span around each chat completion (the route's worker spans are its children);
    pure ASGI, so a streamed answer is inside the span until its last chunk."""

    def __init__(self, app: Any, telemetry: Telemetry):
        self.app, self.telemetry = app, telemetry

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") not in TRACED_PATHS:
            await self.app(scope, receive, send)
            return
        with self.telemetry.tracer.start_as_current_span("chat.completions", kind=SpanKind.SERVER) as span:
            async def traced_send(message: dict) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", int(message["status"]))
                    if message["status"] >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, traced_send)
