"""Real HTTP servers for testing and benchmarking workers under latency and faults (not mocks).

- `DelayedEndpoint`: an OpenAI-compatible chat-completions server that answers every request after a
  fixed delay with a short deterministic completion and a usage block computed from the request, and
  records how many requests were in flight at once and the request bodies it received.
- `FaultProxy`: a reverse proxy in front of any OpenAI-compatible server that, on a seeded fraction of
  calls, hangs past the client's timeout, answers 429 or 500, or cuts the JSON body in half.

Both run uvicorn + starlette (installed with llama-cpp-python[server]) on 127.0.0.1 in a background
thread with their own event loop, and are context managers giving their base URL ("http://host:port/v1").
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

FAULT_KINDS = ("timeout", "rate_limit", "server_error", "truncated")


class _BackgroundServer:
    """Serve a starlette app with uvicorn on a free 127.0.0.1 port, in a daemon thread."""

    START_TIMEOUT_S = 10.0

    def __init__(self, app: Starlette):
        self.app = app
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.closing = threading.Event()  # set at stop(); long-running handlers should return then

    def start(self) -> None:
        # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
        # and without it every keep-alive answer (headers and body written apart) waited ~40 ms for
        # the client's delayed ACK (Nagle): a 20 ms DelayedEndpoint answered in 60 ms.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))  # the kernel picks the port: no race with other servers
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[sock])), name=f"uvicorn-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"test server on port {self.port} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.closing.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


def completion_body(request: dict, model: str) -> dict:
    """A deterministic chat completion for `request`; token counts are whitespace word counts."""
    messages = request.get("messages") or []
    last_user = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
    words = ["echo:", *str(last_user).split()]
    limit = request.get("max_tokens")
    if isinstance(limit, int) and limit > 0:
        words = words[:limit]
    prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in messages)
    return {
        "id": "chatcmpl-delayed",
        "object": "chat.completion",
        "created": 0,
        "model": request.get("model") or model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": " ".join(words)}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(words),
            "total_tokens": prompt_tokens + len(words),
        },
    }


class DelayedEndpoint:
    """OpenAI-compatible server answering after `delay_s`; counts requests and peak concurrency."""

    def __init__(self, delay_s: float = 0.2, model: str = "delayed-echo", usage=None):
        self.delay_s = delay_s
        self.model = model
        self.usage = usage  # request body -> the usage block to bill (None: completion_body's word counts)
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.received: list[dict] = []  # every chat request body, in arrival order
        self.peers: list[tuple[str, int]] = []  # each chat request's client (host, port): one port = one connection
        self._lock = threading.Lock()
        app = Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ])
        self._server = _BackgroundServer(app)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}/v1"

    def __enter__(self) -> str:
        self._server.start()
        return self.base_url

    def __exit__(self, *exc) -> None:
        self._server.stop()

    async def _chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        with self._lock:
            self.requests += 1
            self.received.append(body)
            self.peers.append((request.client.host, request.client.port) if request.client else ("", 0))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            with self._lock:
                self.in_flight -= 1
        answer = completion_body(body, self.model)
        if self.usage is not None:
            answer["usage"] = self.usage(body)
        return JSONResponse(answer)

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "test"}]})


class FaultProxy:
    """Reverse proxy to `upstream_base_url` that injects faults on `fault_rate` of calls (seeded).

    Faults: "timeout" (hang `hang_s` - by default until the proxy stops, longer than any client
    timeout - then answer 504), "rate_limit" (HTTP 429),
    "server_error" (HTTP 500), "truncated" (the upstream's status with its JSON body cut in half).
    `faults` counts injected faults by kind; `forwarded` counts calls passed through intact.
    """

    def __init__(self, upstream_base_url: str, fault_rate: float = 0.2, seed: int = 0,
                 kinds: tuple[str, ...] = FAULT_KINDS, hang_s: float = 3600.0):
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError(f"fault_rate must be in [0, 1], got {fault_rate}")
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown or not kinds:
            raise ValueError(f"fault kinds must be a non-empty subset of {FAULT_KINDS}, got {kinds}")
        parts = urlsplit(upstream_base_url)
        self.upstream_origin = f"{parts.scheme}://{parts.netloc}"
        self.base_path = parts.path.rstrip("/")
        self.fault_rate, self.kinds, self.hang_s = fault_rate, tuple(kinds), hang_s
        self.faults: Counter[str] = Counter()
        self.forwarded = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None
        app = Starlette(
            routes=[Route("/{path:path}", self._proxy, methods=["GET", "POST"])], lifespan=self._lifespan
        )
        self._server = _BackgroundServer(app)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}{self.base_path}"

    def __enter__(self) -> str:
        self._server.start()
        return self.base_url

    def __exit__(self, *exc) -> None:
        self._server.stop()

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        async with httpx.AsyncClient(base_url=self.upstream_origin, timeout=None) as client:
            self._client = client
            yield

    def _draw_fault(self) -> str | None:
        with self._lock:
            if self._rng.random() >= self.fault_rate:
                return None
            kind = self._rng.choice(self.kinds)
            self.faults[kind] += 1
            return kind

    async def _hang(self) -> None:
        """Hold the request for `hang_s` (the client gives up first), or until the proxy stops."""
        deadline = time.monotonic() + self.hang_s
        while time.monotonic() < deadline and not self._server.closing.is_set():
            await asyncio.sleep(0.05)

    async def _proxy(self, request: Request) -> Response:
        fault = self._draw_fault()
        if fault == "timeout":
            await self._hang()
            return Response(status_code=504)
        if fault in ("rate_limit", "server_error"):
            status = 429 if fault == "rate_limit" else 500
            return JSONResponse({"error": {"message": f"injected {fault}", "type": fault}}, status_code=status)
        upstream = await self._client.request(
            request.method, request.url.path, params=request.query_params, content=await request.body(),
            headers={"content-type": request.headers.get("content-type", "application/json")},
        )
        body = upstream.content
        if fault == "truncated":
            body = body[: len(body) // 2]
        else:
            with self._lock:
                self.forwarded += 1
        return Response(body, status_code=upstream.status_code, media_type=upstream.headers.get("content-type"))
