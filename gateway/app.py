"""The OpenAI-compatible gateway (FastAPI): the champion routes, the pool answers, the key pays.

POST /v1/chat/completions   `model` = "router:<registered name>" or "auto"; `stream` supported (SSE in
                            the OpenAI format). Extra request fields: `budget_usd` (cap for this
                            request), `explain` (the decision's explanation in the answer),
                            `cost_weight` (λ of q̂ − λ·cost), `turns_left` (MTRouter's T_max − t). The
                            answer is the worker's, with `usage`, plus a `routerops` field and
                            `x-routerops-*` headers (worker, cost, scores). Single-turn routers and
                            MTRouter pick one worker per request (gateway/families reads the chat
                            for each); an orchestrator champion runs a whole controller episode
                            instead (gateway/families/orchestra.py).
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
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway import openapi
from gateway.admission import ADMITTED, ADMITTED_PATHS, WORKER_CALLED, AdmissionMiddleware, EarlyDoor
from gateway.answers import complete, stream
from gateway.errors import RequestError, error_response
from gateway.intake import ClientGone, IntakeMiddleware, intake_limits, read_body
from gateway.ops import add_operations
from gateway.parsing import check_chat_request, read_feedback, read_json_object
from gateway.serving import server_limits
from gateway.proxy import AUTO, ROUTER_PREFIX, Gateway
from gateway.store import KeyInfo
# Imported from here by the tests, gateway/cli.py and gateway/telemetry.py (they live in gateway/proxy.py).
from gateway.proxy import GatewayConfig, explanation  # noqa: F401, E402

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- the app


def create_app(gw: Gateway) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        await gw.aclose()  # on shutdown: nothing queued for the database is lost

    app = FastAPI(title="routerops gateway", description="OpenAI-compatible routing gateway", lifespan=lifespan,
                  version="1", docs_url=None, redoc_url=None)
    app.state.gateway = gw

    def on_refused(exc: RequestError) -> None:
        gw.count(f"status_{exc.status}")

    app.add_middleware(AdmissionMiddleware, admission=gw.admission, paths=ADMITTED_PATHS, on_refused=on_refused)
    # outside admission: the head, the key and the body come first, a slot after (gateway/intake.py)
    app.add_middleware(IntakeMiddleware, limits=intake_limits(gw.cfg), authenticate=gw.key_for, paths=ADMITTED_PATHS,
                       on_refused=on_refused)
    app.routerops_limits = server_limits(gw.cfg)  # what `gateway serve`'s protocol bounds (gateway/serving.py)
    # `gateway serve`'s protocol makes the door's first checks as a request's headers are parsed, and
    # writes a refusal itself (gateway/serving.py): it finds them here.
    app.routerops_door = EarlyDoor(gw.admission, ADMITTED_PATHS, on_refused)

    # Every error is an OpenAI-format body {"error": {message, type, param, code}}: ours, the
    # framework's (unknown path, wrong method), and anything unforeseen (a 500 without a traceback).
    @app.exception_handler(RequestError)
    async def on_request_error(request: Request, exc: RequestError) -> JSONResponse:
        gw.count(f"status_{exc.status}")
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return await on_request_error(request, RequestError(exc.status_code, str(exc.detail), kind))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await on_request_error(request, RequestError(400, f"invalid request: {exc.errors()[:3]}"))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return await on_request_error(request, RequestError(500, "internal error (logged by the gateway)",
                                                            "server_error"))

    async def body_of(request: Request) -> dict[str, Any]:
        return read_json_object(await body_bytes(request))

    async def body_bytes(request: Request) -> bytes:
        """The body, up to max_body_bytes (413 past it, whatever Content-Length says) within body_timeout_s (408)."""
        try:
            return await read_body(request.receive, gw.cfg.max_body_bytes, gw.cfg.body_timeout_s,
                                   request.headers.get("content-length", ""))
        except ClientGone:
            raise RequestError(400, "the client closed the connection before its body arrived") from None

    @app.post("/v1/chat/completions", **openapi.CHAT)
    async def chat_completions(request: Request):
        key = await gw.authenticate(request)
        req = check_chat_request(await body_of(request))
        champion = gw.resolve(req.model)
        episode = champion.adapter.answer  # an episode family answers the whole request (gateway/families)
        if episode is not None:
            if req.media or req.tools:
                raise RequestError(400, f"an {champion.family} champion reads the chat's text: it takes no media parts "
                                        "and no tools", code="unsupported_content")
            response = await episode(gw, key, req.body, champion, req.messages, req.budget_usd)
        else:
            call = await gw.open_call(key, req, champion)
            state = request.scope.get("state", {})
            if ADMITTED in state:  # the gateway's part before the worker call (gateway/admission.py)
                state[WORKER_CALLED] = gw.admission.clock()
                gw.admission.observe(state[WORKER_CALLED] - state[ADMITTED])
            try:
                response = await (stream(gw, call) if req.stream else complete(gw, call))
            except BaseException:
                gw.close_unsettled(call)  # whatever went wrong, the hold is not left reserved
                raise
        gw.count(f"status_{response.status_code}")
        return response

    @app.get("/v1/models", **openapi.MODELS)
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

    @app.get("/v1/decisions/{decision_id}", **openapi.DECISION)
    async def get_decision(decision_id: str, request: Request):
        return await own_decision(gw, await gw.authenticate(request), decision_id)

    @app.post("/v1/decisions/{decision_id}/feedback", **openapi.FEEDBACK)
    async def feedback(decision_id: str, request: Request):
        key = await gw.authenticate(request)
        score = read_feedback(await body_bytes(request))  # first: a fuzzer's bodies reach the parser
        await own_decision(gw, key, decision_id)
        await asyncio.to_thread(gw.store.record_score, decision_id, score)
        return {"decision_id": decision_id, "score": score}

    @app.get("/metrics", include_in_schema=False)
    async def metrics():
        return PlainTextResponse(gw.metrics(), media_type="text/plain; version=0.0.4")

    add_operations(app, gw)  # GET /health, /ready; request traces (gateway/ops.py)

    accepted = {kind for w in gw.pool.workers if w.kind == "llm" for kind in w.accepts}
    openapi.install(app, gw.cfg.max_tokens_cap, [AUTO] + [ROUTER_PREFIX + n for n in gw.cfg.routers], accepted)
    return app


async def own_decision(gw: Gateway, key: KeyInfo, decision_id: str) -> dict[str, Any]:
    record = await asyncio.to_thread(gw.store.decision, decision_id)
    if record is None or record["key_id"] != key.key_id:  # another key's decision is not even acknowledged
        raise RequestError(404, f"no decision {decision_id!r} for this key", code="decision_not_found")
    return record

