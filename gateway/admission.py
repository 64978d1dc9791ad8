"""Admission control: past what the gateway can serve in time, a request is refused at once (503 with
Retry-After, counted) rather than queued without bound.

Without it, an open-loop load above capacity (benchmarks/gateway_overhead.py: 200 req/s on two shared
cores) grew the queue without bound: added p50 446 ms, p99 11.8 s, and a dropped connection. The
queues that fill under overload are bounded here:

- requests in the app: at most `max_in_flight` are served at once; up to `max_queue` more wait (FIFO)
  for a slot, each for at most `max_queue_wait_s`; beyond either bound: 503.
- the gateway's own work per request. When the CPU is the bottleneck, requests wait where no length
  can be counted: on the database thread's queue, for the GIL, as callbacks of a saturated loop. So
  the gateway judges its queue by sojourn time, as CoDel does, not by length: each admitted request
  reports its *overhead* (from arrival to the worker call: parsing, decision, budget reservation);
  while every request of the last `OVERHEAD_WINDOW_S` (at least `OVERHEAD_MIN_SAMPLES` of them) took
  more than `max_overhead_ms` beyond the unloaded overhead (the smallest of the last
  `BASELINE_WINDOW_S`: a remote database's round trips are not a queue), the queue is standing, not a
  burst, and new requests are refused at the door, which costs a fraction of serving one, so it
  drains. An empty window re-opens the door.
- the event loop's lag (`max_loop_lag_ms`): a timer measures how late a `sleep(interval)` wakes up;
  while the lag of the last `LAG_WINDOW` ticks stays above it, new requests are refused too (the
  queue before the app sees a request).

A refusal is an OpenAI-format error (type `server_error`, code `overloaded`) with `Retry-After`
(seconds) and `retry-after-ms`, which the openai SDK honours when it retries; the connection stays
open. Counts are in `AdmissionStats` (GET /metrics). Each process of `gateway serve --workers N`
admits for itself.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from dataclasses import dataclass

from gateway.errors import RequestError

LAG_INTERVAL_S = 0.005  # the loop-lag timer's period
LAG_WINDOW = 4  # ticks: the lag must stay high this long (≈ 20 ms) before the door closes
OVERHEAD_WINDOW_S = 0.1  # CoDel's interval: a standing queue outlasts it, a burst does not
OVERHEAD_MIN_SAMPLES = 8  # fewer requests in the window say nothing of a queue
BASELINE_WINDOW_S = 60.0  # the unloaded overhead: the smallest seen in this long


@dataclass
class AdmissionStats:
    admitted: int = 0
    queued: int = 0  # admitted after waiting for a slot
    shed_queue_full: int = 0
    shed_queue_wait: int = 0
    shed_loop_lag: int = 0
    shed_overhead: int = 0
    in_flight: int = 0
    waiting: int = 0
    loop_lag_ms: float = 0.0  # the latest window's smallest lag
    overhead_ms: float = 0.0  # the latest window's smallest request overhead
    baseline_overhead_ms: float = 0.0  # the smallest of the last minute: the unloaded overhead

    @property
    def shed(self) -> int:
        return self.shed_queue_full + self.shed_queue_wait + self.shed_loop_lag + self.shed_overhead


class Admission:
    """The gateway's door: `async with admission.slot(): ...` serves a request or raises RequestError(503)."""

    def __init__(self, max_in_flight: int = 256, max_queue: int = 256, max_queue_wait_s: float = 0.05,
                 max_loop_lag_ms: float = 0.0, retry_after_s: float = 1.0, max_overhead_ms: float = 0.0):
        self.max_in_flight, self.max_queue, self.max_queue_wait_s = max_in_flight, max_queue, max_queue_wait_s
        self.max_loop_lag_s = max_loop_lag_ms / 1000 if max_loop_lag_ms > 0 else math.inf
        self.max_overhead_s = max_overhead_ms / 1000 if max_overhead_ms > 0 else math.inf
        self._overheads: collections.deque[tuple[float, float]] = collections.deque()  # (when, seconds)
        self._baseline: collections.deque[tuple[float, float]] = collections.deque()  # window minima, increasing
        self.retry_after_s = retry_after_s
        self.stats = AdmissionStats()
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._lags: collections.deque[float] = collections.deque(maxlen=LAG_WINDOW)
        self._timer: asyncio.Task | None = None

    def overloaded(self, why: str, count: str) -> RequestError:
        setattr(self.stats, count, getattr(self.stats, count) + 1)
        return RequestError(503, f"the gateway is overloaded ({why}); retry after {self.retry_after_s:g} s",
                            "server_error", "overloaded", retry_after_s=self.retry_after_s)

    async def acquire(self) -> None:
        if self._timer is None and math.isfinite(self.max_loop_lag_s):
            self._timer = asyncio.get_running_loop().create_task(self._watch_lag())
        if len(self._lags) == LAG_WINDOW and min(self._lags) > self.max_loop_lag_s:
            raise self.overloaded(f"its event loop runs {min(self._lags) * 1000:.0f} ms late", "shed_loop_lag")
        standing = self.standing_overhead()
        if standing is not None:
            raise self.overloaded(f"each of its last requests waited ≥ {standing * 1000:.0f} ms in the gateway",
                                  "shed_overhead")
        if self.stats.in_flight < self.max_in_flight and not self._waiters:
            self.stats.in_flight += 1
            self.stats.admitted += 1
            return
        if len(self._waiters) >= self.max_queue:
            raise self.overloaded(f"{self.stats.in_flight} requests in flight and {len(self._waiters)} waiting",
                                  "shed_queue_full")
        slot = asyncio.get_running_loop().create_future()
        self._waiters.append(slot)
        self.stats.waiting = len(self._waiters)
        try:
            await asyncio.wait_for(asyncio.shield(slot), self.max_queue_wait_s)
        except asyncio.TimeoutError:
            if slot.done() and not slot.cancelled():  # handed a slot just as the wait ran out: take it
                pass
            else:
                slot.cancel()
                self._discard(slot)
                raise self.overloaded(f"no slot within {self.max_queue_wait_s * 1000:.0f} ms", "shed_queue_wait")
        except BaseException:
            if slot.done() and not slot.cancelled():
                self.release()  # the slot handed to us goes to the next one
            else:
                slot.cancel()
                self._discard(slot)
            raise
        self.stats.admitted += 1
        self.stats.queued += 1

    def observe(self, overhead_s: float) -> None:
        """An admitted request's overhead: from its arrival to its worker call."""
        if math.isfinite(self.max_overhead_s):
            now = time.monotonic()
            self._overheads.append((now, overhead_s))
            # a monotonic deque: its head is the smallest overhead of the last BASELINE_WINDOW_S
            while self._baseline and self._baseline[-1][1] >= overhead_s:
                self._baseline.pop()
            self._baseline.append((now, overhead_s))
            while self._baseline[0][0] < now - BASELINE_WINDOW_S:
                self._baseline.popleft()

    def standing_overhead(self) -> float | None:
        """The smallest overhead of the last window when all of it is above max_overhead_ms (a standing
        queue), else None."""
        if not self._overheads:
            return None
        horizon = time.monotonic() - OVERHEAD_WINDOW_S
        while self._overheads and self._overheads[0][0] < horizon:
            self._overheads.popleft()
        if len(self._overheads) < OVERHEAD_MIN_SAMPLES:
            return None
        smallest = min(v for _, v in self._overheads)
        baseline = self._baseline[0][1] if self._baseline else 0.0
        self.stats.overhead_ms, self.stats.baseline_overhead_ms = smallest * 1000, baseline * 1000
        return smallest if smallest - baseline > self.max_overhead_s else None

    def release(self) -> None:
        """A request is done: its slot goes to the first waiter, or back to the pool."""
        while self._waiters:
            slot = self._waiters.popleft()
            self.stats.waiting = len(self._waiters)
            if not slot.done():
                slot.set_result(None)  # in_flight unchanged: the slot moves on
                return
        self.stats.in_flight -= 1

    def _discard(self, slot: asyncio.Future) -> None:
        try:
            self._waiters.remove(slot)
        except ValueError:
            pass
        self.stats.waiting = len(self._waiters)

    async def _watch_lag(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(LAG_INTERVAL_S)
            lag = max(time.perf_counter() - start - LAG_INTERVAL_S, 0.0)
            self._lags.append(lag)
            self.stats.loop_lag_ms = min(self._lags) * 1000

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class AdmissionMiddleware:
    """Pure ASGI: admits each request to `paths` through `admission`, or answers the 503 itself."""

    def __init__(self, app, admission: Admission, paths: tuple[str, ...] = ("/v1/chat/completions",),
                 on_refused=None):
        self.app, self.admission, self.paths, self.on_refused = app, admission, paths, on_refused

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        try:
            await self.admission.acquire()
        except RequestError as exc:
            from gateway.app import error_response  # the one renderer of errors

            if self.on_refused is not None:
                self.on_refused(exc)
            return await error_response(exc)(scope, receive, send)
        scope.setdefault("state", {})["admitted_at"] = time.monotonic()  # the overhead's start (Gateway.observe)
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.release()
