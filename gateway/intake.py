"""A request's intake, before it may take an in-flight slot (issue 42, items 3 and 4): its headers
bounded, its key authenticated, its key's rate checked, its body read whole under a deadline and a
size cap. Only then does admission (gateway/admission.py) give it a slot.

Before this, admission counted a request as soon as its headers were parsed: 16 connections that sent
headers and 10 bytes of body (or `Expect: 100-continue` and no body), with a key worth $0, held all 16
slots for as long as they kept the connections open, and a legitimate client got 20 of 20 requests
answered 503. Now a slow or silent client holds a connection and a task, never a slot, and is cut at
`body_timeout_s` (408, the connection closed); an unknown key is a 401 before its body is read (an
`Expect: 100-continue` client is refused before it sends one); a key past its request rate is a 429
with Retry-After (`rate_limited`).

Limits (each refused early, with memory bounded by the limit, in the OpenAI error format):
- header fields and bytes: 431, at the HTTP protocol for `gateway serve`'s httptools protocol
  (gateway/serving.py: before a header is parsed whole) and here again for any other server (h11
  caps a request's head at 16 KiB itself: uvicorn's `h11_max_incomplete_event_size`);
- body bytes: 413 (a Content-Length over the cap at once, else as the bytes arrive);
- body time: 408 past `body_timeout_s` from the end of the headers;
- bodies being read at once, all connections together: MAX_READING_BYTES (503 past it);
- JSON depth: 400 (gateway/parsing.py, on a body already capped in bytes).

The body is handed on to the app as one message; the app's later `receive()` calls go to the server
(a streamed answer listens there for the client's disconnect).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from gateway.errors import RequestError, error_response
from gateway.serving import ARRIVED, KEY, KEY_ID

# Key lookups the database is asked for at once (a verified key is cached: gateway/store.py; an unknown
# one is asked every time). Admission no longer bounds them, as they come before a slot: a flood of
# made-up keys waits here instead of queueing without bound on the store's thread, ahead of reservations.
MAX_LOOKUPS = 32
# Bytes of bodies being read at once, all connections together. Bodies are read before a slot now, so
# the slots no longer bound them (uvicorn buffers ~64 KiB per connection until the app reads): without
# this, 1,000 slow connections could hold 1,000 x max_body_bytes. Past it a body is refused, 503.
MAX_READING_BYTES = 256 * 2**20


@dataclass(frozen=True)
class IntakeLimits:
    """What a request may send (GatewayConfig's fields of the same names)."""

    max_body_bytes: int = 8 * 2**20
    body_timeout_s: float = 10.0
    max_headers: int = 100
    max_header_bytes: int = 32 * 2**10
    key_requests_per_s: float = 1000.0  # 0: no per-key rate limit; a key may send one second's worth at once (≥ 1)


def intake_limits(cfg) -> IntakeLimits:
    """The intake's limits from a GatewayConfig (gateway/proxy.py)."""
    return IntakeLimits(cfg.max_body_bytes, cfg.body_timeout_s, cfg.max_headers, cfg.max_header_bytes,
                        cfg.key_requests_per_s)


def too_large(cap: int) -> RequestError:
    return RequestError(413, f"the body is over this gateway's limit of {cap} bytes", code="body_too_large")


def too_slow(timeout_s: float) -> RequestError:
    return RequestError(408, f"the request's body did not arrive within {timeout_s:g} s", code="request_timeout")


def check_head(headers: list[tuple[bytes, bytes]], limits: IntakeLimits) -> None:
    """Header fields and bytes within the limits, or RequestError(431)."""
    size = sum(len(name) + len(value) + 4 for name, value in headers)
    if len(headers) > limits.max_headers or size > limits.max_header_bytes:
        raise RequestError(431, f"the request's headers ({len(headers)} fields, {size} bytes) are over this "
                                f"gateway's limits ({limits.max_headers} fields, {limits.max_header_bytes} bytes)",
                           code="headers_too_large")


class Reading:
    """The bytes of the bodies being read now, against MAX_READING_BYTES (or `limit`)."""

    def __init__(self, limit: int = MAX_READING_BYTES):
        self.limit, self.bytes = limit, 0

    def take(self, n: int) -> None:
        if self.bytes + n > self.limit:
            raise RequestError(503, f"the gateway is reading {self.bytes} bytes of bodies, its limit; retry after 1 s",
                               "server_error", "overloaded", retry_after_s=1.0)
        self.bytes += n


async def read_body(receive, cap: int, timeout_s: float, declared: str = "", reading: Reading | None = None) -> bytes:
    """The whole body, at most `cap` bytes (413) within `timeout_s` (408), counted in `reading` while read."""
    if declared.isdigit() and int(declared) > cap:
        raise too_large(cap)
    raw = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone
                chunk = message.get("body", b"")
                if reading is not None:
                    reading.take(len(chunk))
                raw += chunk
                if len(raw) > cap:
                    raise too_large(cap)
                if not message.get("more_body", False):
                    return bytes(raw)
    except TimeoutError:
        raise too_slow(timeout_s) from None
    finally:
        if reading is not None:
            reading.bytes -= len(raw)


class ClientGone(Exception):
    """The client closed the connection before its body arrived: nothing to answer."""


class KeyRates:
    """A token bucket per key (requests per second, a burst): `take(key)` is None, or the seconds to
    wait before the key's next request is accepted."""

    def __init__(self, per_s: float, burst: float, clock=time.monotonic):
        self.per_s, self.burst, self.clock = per_s, max(burst or per_s, 1.0), clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key → (tokens, when)

    def take(self, key: str) -> float | None:
        if self.per_s <= 0:
            return None
        now = self.clock()
        tokens, when = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.per_s)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            return (1 - tokens) / self.per_s
        self._buckets[key] = (tokens - 1, now)
        if len(self._buckets) > 100_000:  # full buckets say nothing: forget them (bounded memory)
            self._buckets = {k: v for k, v in self._buckets.items() if v[0] < self.burst - 1}
        return None


def rate_limited(key_id: str, wait_s: float, per_s: float) -> RequestError:
    return RequestError(429, f"key {key_id} is over its rate of {per_s:g} requests per second; retry after "
                             f"{wait_s:.3g} s", "requests", "rate_limit_exceeded", retry_after_s=max(wait_s, 0.001))


class IntakeMiddleware:
    """Pure ASGI, outside admission: for the admitted paths, the head checked, the key authenticated
    (`authenticate(authorization header) -> KeyInfo`, RequestError(401)), its rate taken, the body
    read (module docstring); then the request goes on to admission with its body. The time the body
    took to arrive is not a wait in the gateway's queue: the arrival stamp (gateway/serving.py) is
    moved by it, so admission's bounds count only the gateway's own waits."""

    def __init__(self, app, limits: IntakeLimits, authenticate: Callable[[str], Awaitable[Any]],
                 paths: tuple[str, ...], on_refused=None):
        self.app, self.limits, self.authenticate, self.paths, self.on_refused = app, limits, authenticate, paths, on_refused
        self.rates = KeyRates(limits.key_requests_per_s, limits.key_requests_per_s)
        self.lookups: asyncio.Semaphore | None = None  # made on the serving loop
        self.reading = Reading()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in self.paths or scope["method"] != "POST":
            return await self.app(scope, receive, send)  # (a wrong method is the router's 405)
        headers = dict(scope["headers"][:self.limits.max_headers + 1])
        started = time.monotonic()
        try:
            check_head(scope["headers"], self.limits)
            self.lookups = self.lookups or asyncio.Semaphore(MAX_LOOKUPS)
            async with self.lookups:
                key = await self.authenticate(headers.get(b"authorization", b"").decode("latin-1"))
            wait = self.rates.take(key.key_id)
            if wait is not None:
                raise rate_limited(key.key_id, wait, self.limits.key_requests_per_s)
            body = await read_body(receive, self.limits.max_body_bytes, self.limits.body_timeout_s,
                                   headers.get(b"content-length", b"").decode("latin-1"), self.reading)
        except ClientGone:
            return None
        except RequestError as exc:
            return await self.refuse(exc, scope, receive, send)
        state = scope.setdefault("state", {})
        state[KEY], state[KEY_ID] = key, key.key_id
        if state.get(ARRIVED) is not None:
            state[ARRIVED] += time.monotonic() - started
        return await self.app(scope, replay(body, receive), send)

    async def refuse(self, exc: RequestError, scope, receive, send) -> None:

        if self.on_refused is not None:
            self.on_refused(exc)
        response = error_response(exc)
        if exc.status in (408, 413, 431):  # the rest of the request is not read: the connection ends with it
            response.headers["connection"] = "close"
        await response(scope, receive, send)


def replay(body: bytes, receive):
    """A `receive` that gives `body` once, then defers to the server's."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replayed
