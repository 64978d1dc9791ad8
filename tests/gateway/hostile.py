"""A hostile upstream worker and a gateway in front of it (issue 42's tests and probes).

HostileUpstream is a real OpenAI-compatible HTTP server (uvicorn in a thread) that answers each chat
completion with the usage block it is told, as raw JSON text (NaN, 10**20, strings, a list: whatever a
broken or hostile worker can send), and streams `tokens_per_chunk` whitespace-separated tokens per SSE
chunk. `gateway_app()` builds the real gateway app (a fitted router, every LLM worker of the pool at
the upstream); `app_from_env` is the same app for a gateway process of its own (uvicorn --factory).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import threading
from pathlib import Path

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from routerops.workers.chaos import _BackgroundServer

REPO = Path(__file__).resolve().parents[2]
NAME = "router-hostile"
WORKERS = ["smol-direct", "smol-cot"]
GOOD_USAGE = '{"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}'
ENV = "ROUTEROPS_HOSTILE_GATEWAY"  # app_from_env's configuration (JSON)


class HostileUpstream:
    """Answers with the next usage text of `usages` (GOOD_USAGE when empty); streams `stream_tokens` tokens,
    `tokens_per_chunk` in each SSE chunk, then a usage chunk (`stream_usage`: None sends none)."""

    def __init__(self, stream_tokens: int = 40, tokens_per_chunk: int = 1, stream_usage: str | None = None,
                 chunk_delay_s: float = 0.0, delay_s: float = 0.0):
        self.delay_s = delay_s  # before a plain answer
        self.usages: collections.deque[str] = collections.deque()
        self.stream_tokens, self.tokens_per_chunk, self.stream_usage = stream_tokens, tokens_per_chunk, stream_usage
        self.chunk_delay_s = chunk_delay_s
        self.requests = 0
        self.chunks_sent = 0
        self._lock = threading.Lock()
        self.server = _BackgroundServer(Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])]))

    def __enter__(self) -> str:
        self.server.start()
        return f"http://127.0.0.1:{self.server.port}/v1"

    def __exit__(self, *exc) -> None:
        self.server.stop()

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        with self._lock:
            self.requests += 1
            usage = self.usages.popleft() if self.usages else GOOD_USAGE
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if body.get("stream"):
            return StreamingResponse(self.events(body, usage), media_type="text/event-stream")
        text = ('{"id": "chatcmpl-h", "object": "chat.completion", "created": 0, "model": "m", "choices": '
                '[{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}], '
                f'"usage": {usage}}}')
        return Response(text, media_type="application/json")

    async def events(self, body: dict, usage: str):
        head = '{"id": "chatcmpl-h", "object": "chat.completion.chunk", "created": 0, "model": "m", '
        for i in range(0, self.stream_tokens, self.tokens_per_chunk):
            piece = "".join(f" t{j % 10}" for j in range(i, min(i + self.tokens_per_chunk, self.stream_tokens)))
            delta = json.dumps({"index": 0, "delta": {"content": piece}, "finish_reason": None})
            yield f"data: {head}\"choices\": [{delta}]}}\n\n"
            self.chunks_sent += 1
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
        stop = json.dumps({"index": 0, "delta": {}, "finish_reason": "stop"})
        yield f"data: {head}\"choices\": [{stop}]}}\n\n"
        if self.stream_usage is not None or usage != GOOD_USAGE:
            yield f"data: {head}\"choices\": [], \"usage\": {self.stream_usage or usage}}}\n\n"
        yield "data: [DONE]\n\n"


def fitted_router():
    """tests/gateway/test_hardening.py's router: logistic regression on lexical features, two workers."""
    from evaluation.serving.single_turn import ServedRouter
    from models.base import RoutingData
    from models.baselines import LogisticRouter, QueryFeaturizer
    from routerops.pricing import load_price_book

    book = load_price_book(REPO / "configs" / "prices" / "current.yaml")
    queries = [f"What is {i} plus {i + 3}?" if i % 2 else f"Which city is the capital of country {i}?"
               for i in range(40)]
    scores = np.array([[1.0, 0.0] if "plus" in q else [0.0, 1.0] for q in queries])
    data = RoutingData([f"q{i}" for i in range(40)], queries, list(WORKERS), scores, np.tile([1e-5, 1e-4], (40, 1)))
    model = LogisticRouter(seed=0)
    model.featurizer = QueryFeaturizer(use_embedding=False)
    return ServedRouter.from_fitted(model.fit(data), data, book.version, embedding=None, family="hostile-test")


def gateway_for(upstream_url: str, db_url: str, router=None, **config):
    """The real Gateway over the pool, every LLM worker at `upstream_url`."""
    from gateway.app import Gateway, GatewayConfig
    from gateway.champion import Champion, Champions
    from routerops.pricing import load_pool, load_price_book

    pool = load_pool(REPO / "configs" / "pools" / "embedded-smollm2.yaml")  # smol-direct / smol-cot
    book = load_price_book(REPO / "configs" / "prices" / "current.yaml")
    pool = dataclasses.replace(pool, workers=tuple(dataclasses.replace(w, endpoint=upstream_url) if w.kind == "llm"
                                                   else w for w in pool.workers))
    champions = Champions([NAME], pool, book)
    champions._current[NAME] = Champion(NAME, "1", router or fitted_router(), "now")
    return Gateway(GatewayConfig(routers=(NAME,), db_url=db_url, **config), pool, book, champions=champions)


def app_from_env():
    """The gateway app of a process of its own: `ROUTEROPS_HOSTILE_GATEWAY` = {"upstream", "db_url", "config"}."""
    from gateway.app import create_app

    spec = json.loads(os.environ[ENV])
    return create_app(gateway_for(spec["upstream"], spec["db_url"], **spec.get("config", {})))


class ThreadServer:
    """`app` served by uvicorn in a daemon thread on a free loopback port with `gateway serve`'s protocol
    (gateway/serving.py: the arrival stamp, the door, the head's limits)."""

    def __init__(self, app):
        import socket

        import uvicorn

        from gateway.serving import StampedHttpToolsProtocol

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, http=StampedHttpToolsProtocol, log_level="warning",
                                                    access_log=False, timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True)

    def __enter__(self) -> str:
        import time

        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
