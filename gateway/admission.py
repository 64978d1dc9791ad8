"""Admission control: past what the gateway can serve in time, a request is refused at once (503 with
Retry-After, counted) rather than queued without bound.

Without it, an open-loop load above capacity (benchmarks/gateway_overhead.py: 200 req/s on two shared
cores) grew the queue without bound: added p50 446 ms, p99 11.8 s, and a dropped connection. Where an
admitted request's time goes under overload was then measured per request (the sweep's server-side
view: Server-Timing below): on a CPU-starved gateway it waits (1) in the kernel before the loop
reads it, (2) for a slot, (3) in the gateway's own work before the worker call (the loop, the GIL,
the database thread), shared with every request in flight. Each is bounded here:

- every wait is measured from the request's *arrival in the kernel* (gateway/serving.py reads it from
  TCP_INFO), the earliest timestamp there is, as CoDel measures sojourn from enqueue. While that queue
  stands (CoDel's test: every request at the door in the last OVERHEAD_WINDOW_S, at least
  OVERHEAD_MIN_SAMPLES of them, had waited more than STANDING_WAIT_S), a request that has waited
  `max_queue_wait_s` by the time the door sees it is refused at once (`late`); a burst (the process
  descheduled for a moment) is served, as refusing it would spare no one, unless a request of it
  waited LATE_ALWAYS_FACTOR times that bound (its answer is late whatever is done). A request that must wait
  for a slot waits only what is left of that bound (`queue_wait`), behind at most `max_queue` others
  (`queue_full`). Refusing costs a fraction of serving, so the kernel's queue drains.
  Once the waiters' queue has not been empty for OVERHEAD_WINDOW_S it is standing, and it is run as
  Facebook runs theirs (CoDel + adaptive LIFO: STANDING_WAIT_S below): a new waiter waits 5 ms at
  most, and a free slot goes to the newest waiter, so the requests served are the ones that waited least.
- the number served at once is a limit that adapts, as Envoy's adaptive concurrency filter and
  Netflix's concurrency-limits (Gradient) do: every OVERHEAD_WINDOW_S (with at least
  OVERHEAD_MIN_SAMPLES requests) the median *overhead* of the admitted requests (from the slot to the
  worker call: parsing, decision, reservation) is compared with the target, the unloaded overhead
  (the smallest of the last BASELINE_WINDOW_S: a remote database's round trips are not a queue) plus
  `max_overhead_ms`; the event loop's median lag in the window (the timer below) is added to the
  overhead, as the answers wait through it after the worker call. Above it the limit shrinks by
  their ratio (at most by half, never below MIN_LIMIT); at or below it, and only if the limit was
  reached in the window, it grows by its square root. With `max_overhead_ms` 0 the limit is
  `max_in_flight`, fixed.
- the event loop's lag (`max_loop_lag_ms`, 0: no refusal on it): a timer measures how late a
  `sleep(interval)` wakes up; while the lag of the last LAG_WINDOW ticks stays above it, new requests
  are refused too (`loop_lag`).

A refusal is an OpenAI-format error (type `server_error`, code `overloaded`) with `Retry-After`
(seconds) and `retry-after-ms`, which the openai SDK honours when it retries; the connection stays
open. Counts are in `AdmissionStats` (GET /metrics); an admitted answer carries a `Server-Timing`
header (W3C Server Timing: `wait`, `gateway`, `worker`, in ms) with the server's view of its time.
Each process of `gateway serve --workers N` admits for itself.
"""

from __future__ import annotations

import asyncio
import collections
import math
import statistics
import time
from dataclasses import dataclass

from gateway.errors import RequestError, error_response, http_error
from gateway.serving import ARRIVED, DOOR_CHECKED, KEY_ID

LAG_INTERVAL_S = 0.005  # the loop-lag timer's period
LAG_WINDOW = 4  # ticks: the lag must stay high this long (≈ 20 ms) before the door closes
OVERHEAD_WINDOW_S = 0.1  # CoDel's interval: the limit is revised at most this often
OVERHEAD_MIN_SAMPLES = 8  # fewer requests in a window say nothing of a queue
BASELINE_WINDOW_S = 60.0  # the unloaded overhead: the smallest seen in this long
INITIAL_LIMIT = 16  # the adaptive limit's start (Netflix's Gradient starts at 20): it grows when reached
MIN_LIMIT = 2  # the adaptive limit's floor: a gateway this slow still serves, two at a time
# Facebook's CoDel queue with adaptive LIFO (Maurer, "Fail at Scale", ACM Queue 13(8), 2015): a queue not
# empty for OVERHEAD_WINDOW_S is standing; then a new waiter waits at most STANDING_WAIT_S (M = 5 ms
# there) and a free slot goes to the newest waiter, not the oldest, which has the least time left.
STANDING_WAIT_S = 0.005
# A request that waited this many times max_queue_wait_s before the door saw it is refused even without a
# standing queue. After a stall of the process (150 ms at 600 req/s on the quiet machine), the window
# before it has expired and the few requests read first make no standing queue: they were admitted
# with 155 ms behind them, the p99 of all admitted requests. Its answer would be that late anyway.
LATE_ALWAYS_FACTOR = 2.0
# One key's share of the slots (issue 42): while another key is kept waiting for a slot (in the last
# CONTENTION_WINDOW_S: a refused client retries after Retry-After, 1 s), a key holding KEY_SHARE of the
# limit or more is refused (429, `key_concurrency`), even with a slot free, so the slots its requests
# give back go to the others. A key alone may take every slot.
KEY_SHARE = 0.5
CONTENTION_WINDOW_S = 2.0


@dataclass
class AdmissionStats:
    admitted: int = 0
    queued: int = 0  # admitted after waiting for a slot
    shed_queue_full: int = 0
    shed_queue_wait: int = 0
    shed_late: int = 0  # waited max_queue_wait_s before the door saw it (in the kernel, on the loop)
    shed_loop_lag: int = 0
    refused_key_share: int = 0  # 429: a key over its share of the slots while others waited (KEY_SHARE)
    in_flight: int = 0
    waiting: int = 0
    limit: int = 0  # requests served at once, now (adaptive with max_overhead_ms > 0)
    loop_lag_ms: float = 0.0  # the latest window's smallest lag
    overhead_ms: float = 0.0  # the latest window's median request overhead
    window_loop_lag_ms: float = 0.0  # the latest window's median loop lag (added to the overhead for the limit)
    baseline_overhead_ms: float = 0.0  # the smallest of the last minute: the unloaded overhead

    @property
    def shed(self) -> int:
        return self.shed_queue_full + self.shed_queue_wait + self.shed_late + self.shed_loop_lag


class Admission:
    """The gateway's door: `await acquire(arrived_at)` ... `release()` serves a request, or acquire raises
    RequestError(503). `clock` (time.monotonic) is what `arrived_at` and the windows are read on."""

    def __init__(self, max_in_flight: int = 256, max_queue: int = 256, max_queue_wait_s: float = 0.05,
                 max_loop_lag_ms: float = 0.0, retry_after_s: float = 1.0, max_overhead_ms: float = 0.0,
                 clock=time.monotonic):
        self.max_in_flight, self.max_queue, self.max_queue_wait_s = max_in_flight, max_queue, max_queue_wait_s
        self.max_loop_lag_s = max_loop_lag_ms / 1000 if max_loop_lag_ms > 0 else math.inf
        self.max_overhead_s = max_overhead_ms / 1000 if max_overhead_ms > 0 else math.inf
        self.adaptive = math.isfinite(self.max_overhead_s)
        self.clock = clock
        self.retry_after_s = retry_after_s
        self.stats = AdmissionStats(limit=min(max_in_flight, INITIAL_LIMIT) if self.adaptive else max_in_flight)
        self._window: list[float] = []  # the overheads observed since _window_start
        self._window_start = clock()
        self._limit_reached = False  # in this window: whether a request found every slot taken
        self._baseline: collections.deque[tuple[float, float]] = collections.deque()  # window minima, increasing
        self._waiters: collections.deque[tuple[float, asyncio.Future]] = collections.deque()  # (arrived, slot)
        self._empty_at = clock()  # when the waiters' queue was last empty
        self._door_waits: collections.deque[tuple[float, float]] = collections.deque()  # (when, waited), window minima
        self._door_count: collections.deque[float] = collections.deque()  # when each request reached the door
        self._lags: collections.deque[float] = collections.deque(maxlen=LAG_WINDOW)
        self._window_lags: list[float] = []  # the loop's lag, tick by tick, since _window_start
        self._timer: asyncio.Task | None = None
        self._by_key: dict[str, int] = {}  # slots held per key (requests admitted with a key)
        self._contending: dict[str, float] = {}  # key below its share that had to wait → until when it counts

    @property
    def limit(self) -> int:
        return self.stats.limit

    def overloaded(self, why: str, count: str) -> RequestError:
        setattr(self.stats, count, getattr(self.stats, count) + 1)
        return RequestError(503, f"the gateway is overloaded ({why}); retry after {self.retry_after_s:g} s",
                            "server_error", "overloaded", retry_after_s=self.retry_after_s)

    def door(self, arrived_at: float | None = None) -> RequestError | None:
        """The checks a request meets as it reaches the door, before it could wait: the loop's lag, a late
        request behind a standing queue, a full queue, no time left to wait for a slot. Returns the
        refusal (counted), or None. Synchronous, so that the HTTP protocol can make them as soon as a
        request's headers are parsed (gateway/serving.py): refused there, a request costs no task, no
        framework and no body. `acquire(checked=True)` then does not repeat them."""
        if self.adaptive or math.isfinite(self.max_loop_lag_s):
            self._watch_lag_on(asyncio.get_running_loop())
        if len(self._lags) == LAG_WINDOW and min(self._lags) > self.max_loop_lag_s:
            return self.overloaded(f"its event loop runs {min(self._lags) * 1000:.0f} ms late", "shed_loop_lag")
        now = self.clock()
        waited = now - (now if arrived_at is None else min(arrived_at, now))
        standing = self._door_queue_standing(now, waited)
        if waited > self.max_queue_wait_s and (standing or waited > LATE_ALWAYS_FACTOR * self.max_queue_wait_s):
            return self.overloaded(f"the request waited {waited * 1000:.0f} ms before it was read", "shed_late")
        if self._waiters or self.stats.in_flight >= self.limit:  # it would wait for a slot
            self._limit_reached = True
            if len(self._waiters) >= self.max_queue:
                return self.overloaded(f"{self.stats.in_flight} requests in flight and {len(self._waiters)} waiting",
                                       "shed_queue_full")
            if self._wait_left(now, waited) <= 0:
                return self.overloaded(f"no slot within {waited * 1000:.0f} ms of its arrival", "shed_queue_wait")
        return None

    def _wait_left(self, now: float, waited: float) -> float:
        """How long a request that has waited `waited` may still wait for a slot."""
        wait = self.max_queue_wait_s - waited
        return min(wait, STANDING_WAIT_S) if self.standing(now) else wait

    async def acquire(self, arrived_at: float | None = None, checked: bool = False, key: str | None = None) -> None:
        """Admit a request that reached the kernel at `arrived_at` (default: now), or raise the 503 (the
        429 of a key over its share: KEY_SHARE). `checked`: the door's checks were made already (`door`,
        at the HTTP protocol). A slot taken with a `key` is given back with `release(key)`."""
        if not checked and (refusal := self.door(arrived_at)) is not None:
            raise refusal
        if key is None:
            return await self._acquire(arrived_at)
        held, now = self._by_key.get(key, 0), self.clock()
        share = max(1, math.floor(self.limit * KEY_SHARE))
        if held >= share and self._others_contend(key, now):
            self.stats.refused_key_share += 1
            raise RequestError(429, f"this key holds {held} of the gateway's {self.limit} slots while other keys "
                                    f"wait; retry after {self.retry_after_s:g} s", "requests", "key_concurrency",
                               retry_after_s=self.retry_after_s)
        if held < share and (self._waiters or self.stats.in_flight >= self.limit) and any(k != key for k in self._by_key):
            self._contending[key] = now + CONTENTION_WINDOW_S  # it must wait on other keys: those over their share yield
        await self._acquire(arrived_at)
        self._by_key[key] = self._by_key.get(key, 0) + 1

    def _others_contend(self, key: str, now: float) -> bool:
        """Whether a key other than `key` has had to wait for a slot within CONTENTION_WINDOW_S."""
        if self._contending:
            self._contending = {k: until for k, until in self._contending.items() if until > now}
        return any(k != key for k in self._contending)

    async def _acquire(self, arrived_at: float | None) -> None:
        now = self.clock()
        arrived = now if arrived_at is None else min(arrived_at, now)
        waited = now - arrived
        if not self._waiters:
            self._empty_at = now
            if self.stats.in_flight < self.limit:
                self.stats.in_flight += 1
                self.stats.admitted += 1
                return
        self._limit_reached = True
        if len(self._waiters) >= self.max_queue:
            raise self.overloaded(f"{self.stats.in_flight} requests in flight and {len(self._waiters)} waiting",
                                  "shed_queue_full")
        wait = self._wait_left(now, waited)
        slot = asyncio.get_running_loop().create_future()
        self._waiters.append((arrived, slot))
        self.stats.waiting = len(self._waiters)
        try:
            await asyncio.wait_for(asyncio.shield(slot), wait)
        except asyncio.TimeoutError:
            if slot.done() and not slot.cancelled():  # handed a slot just as the wait ran out: take it
                pass
            else:
                slot.cancel()
                self._discard(slot)
                raise self.overloaded(f"no slot within {(waited + wait) * 1000:.0f} ms of its arrival",
                                      "shed_queue_wait")
        except BaseException:
            if slot.done() and not slot.cancelled():
                self.release()  # the slot handed to us goes to the next one
            else:
                slot.cancel()
                self._discard(slot)
            raise
        self.stats.admitted += 1
        self.stats.queued += 1

    def _door_queue_standing(self, now: float, waited: float) -> bool:
        """Records this request's wait at the door; whether the last window's smallest was above
        STANDING_WAIT_S with at least OVERHEAD_MIN_SAMPLES requests (a standing queue before the door)."""
        horizon = now - OVERHEAD_WINDOW_S
        while self._door_waits and self._door_waits[-1][1] >= waited:  # monotonic: the head is the window's minimum
            self._door_waits.pop()
        self._door_waits.append((now, waited))
        while self._door_waits[0][0] < horizon:
            self._door_waits.popleft()
        self._door_count.append(now)
        while self._door_count[0] < horizon:
            self._door_count.popleft()
        return len(self._door_count) >= OVERHEAD_MIN_SAMPLES and self._door_waits[0][1] > STANDING_WAIT_S

    def standing(self, now: float) -> bool:
        """Whether the waiters' queue has not been empty for a whole OVERHEAD_WINDOW_S."""
        return bool(self._waiters) and now - self._empty_at >= OVERHEAD_WINDOW_S

    def observe(self, overhead_s: float) -> None:
        """An admitted request's overhead: from its slot to its worker call. Revises the limit once a
        window is full (module docstring)."""
        if not self.adaptive:
            return
        now = self.clock()
        # a monotonic deque: its head is the smallest overhead of the last BASELINE_WINDOW_S
        while self._baseline and self._baseline[-1][1] >= overhead_s:
            self._baseline.pop()
        self._baseline.append((now, overhead_s))
        while self._baseline[0][0] < now - BASELINE_WINDOW_S:
            self._baseline.popleft()
        self._window.append(overhead_s)
        if now - self._window_start >= OVERHEAD_WINDOW_S and len(self._window) >= OVERHEAD_MIN_SAMPLES:
            self._revise_limit(now)

    def _revise_limit(self, now: float) -> None:
        # The sample is the gateway's own queueing: the median overhead before the worker call, plus the
        # median lag of its event loop in the window, which every step after the call waits through too
        # (reading the worker's answer, writing the response). Measured on the overhead alone, the limit
        # stayed high at 2x capacity while the answers waited on the loop: p99 108 ms from worker call
        # to response (benchmarks/gateway_overhead.py, quiet machine, 400 req/s).
        overhead = statistics.median(self._window)
        lag = statistics.median(self._window_lags) if self._window_lags else 0.0
        sample, baseline = overhead + lag, self._baseline[0][1]
        target = baseline + self.max_overhead_s
        limit = self.limit
        if sample > target:  # a queue inside the gateway: serve fewer at once (Gradient: limit * target/sample)
            limit = max(MIN_LIMIT, math.floor(limit * max(0.5, target / sample)))
        elif self._limit_reached:  # fast, and more would have come in: room to grow
            limit = min(self.max_in_flight, limit + max(1, math.isqrt(limit)))
        self.stats.limit = limit
        self.stats.overhead_ms, self.stats.baseline_overhead_ms = overhead * 1000, baseline * 1000
        self.stats.window_loop_lag_ms = lag * 1000
        self._window, self._window_lags, self._window_start, self._limit_reached = [], [], now, False
        while self._waiters and self.stats.in_flight < self.limit:  # a larger limit: hand out the new slots
            self.stats.in_flight += 1
            self._hand_slot()

    def release(self, key: str | None = None) -> None:
        """A request is done: its slot goes to the first waiter (unless the limit has shrunk below the
        requests in flight), or back to the pool."""
        if key is not None:
            held = self._by_key.pop(key, 0) - 1
            if held > 0:
                self._by_key[key] = held
        if self.stats.in_flight <= self.limit and self._hand_slot():
            return  # in_flight unchanged: the slot moves on
        self.stats.in_flight -= 1

    def _hand_slot(self) -> bool:
        """Hand a slot to a waiter: the oldest (FIFO), or the newest while the queue stands (LIFO)."""
        lifo = self.standing(self.clock())
        while self._waiters:
            _, slot = self._waiters.pop() if lifo else self._waiters.popleft()
            self._queue_changed()
            if not slot.done():
                slot.set_result(None)
                return True
        return False

    def _discard(self, slot: asyncio.Future) -> None:
        for i, (_, waiting) in enumerate(self._waiters):
            if waiting is slot:
                del self._waiters[i]
                break
        self._queue_changed()

    def _queue_changed(self) -> None:
        self.stats.waiting = len(self._waiters)
        if not self._waiters:
            self._empty_at = self.clock()

    def _watch_lag_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """The lag timer runs on the loop that serves (a new one where an earlier loop has ended: tests)."""
        if self._timer is None or self._timer.get_loop() is not loop:
            self._timer = loop.create_task(self._watch_lag())

    async def _watch_lag(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(LAG_INTERVAL_S)
            self.observe_lag(max(time.perf_counter() - start - LAG_INTERVAL_S, 0.0))

    def observe_lag(self, lag_s: float) -> None:
        """One tick of the lag timer: how late a LAG_INTERVAL_S sleep of the event loop woke up."""
        self._lags.append(lag_s)
        self._window_lags.append(lag_s)
        self.stats.loop_lag_ms = min(self._lags) * 1000

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


ADMITTED, WORKER_CALLED = "admitted_at", "worker_called_at"  # scope["state"] keys (the app sets the second)
ADMITTED_PATHS = ("/v1/chat/completions",)  # the requests admission control applies to


class EarlyDoor:
    """The door's first checks (`Admission.door`), made by the HTTP protocol as soon as a request's headers
    are parsed (gateway/serving.py finds this object as the `routerops_door` attribute of the app it
    serves). A refusal there is written as bytes, before uvicorn makes the request's task and before
    the framework sees it, and the body is read and dropped: half the CPU of a refusal through the
    framework (45 against 103 µs, benchmarks/gateway_refusal_cost.py), and no task in the loop."""

    def __init__(self, admission: Admission, paths: tuple[str, ...] = ADMITTED_PATHS, on_refused=None):
        self.admission, self.paths, self.on_refused = admission, paths, on_refused

    def check(self, path: str, arrived_at: float) -> bytes | bool:
        """False: not a path admission applies to; True: the checks passed (the middleware takes the slot);
        else the whole refusal (503, Retry-After) to write."""
        if path not in self.paths:
            return False
        refusal = self.admission.door(arrived_at)
        if refusal is None:
            return True
        if self.on_refused is not None:
            self.on_refused(refusal)
        return http_error(refusal)


class AdmissionMiddleware:
    """Pure ASGI: admits each request to `paths` through `admission`, or answers the 503 itself. An
    admitted request's response carries `Server-Timing: wait;dur=…, gateway;dur=…, worker;dur=…` (ms:
    arrival to slot, slot to worker call, worker call to response)."""

    def __init__(self, app, admission: Admission, paths: tuple[str, ...] = ADMITTED_PATHS, on_refused=None):
        self.app, self.admission, self.paths, self.on_refused = app, admission, paths, on_refused
        self.routerops_door = EarlyDoor(admission, paths, on_refused)  # served as the outermost app itself

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        arrived = state.get(ARRIVED)  # from the kernel (gateway/serving.py); absent on other servers
        key = state.get(KEY_ID)  # authenticated before admission (gateway/intake.py)
        try:
            await self.admission.acquire(arrived, checked=state.get(DOOR_CHECKED, False), key=key)
        except RequestError as exc:

            if self.on_refused is not None:
                self.on_refused(exc)
            return await error_response(exc)(scope, receive, send)
        state[ADMITTED] = admitted = self.admission.clock()  # the overhead's start (Gateway.observe)
        arrived = admitted if arrived is None else arrived

        async def timed_send(message):
            if message["type"] == "http.response.start" and WORKER_CALLED in state:
                called = state[WORKER_CALLED]
                timing = (f"wait;dur={(admitted - arrived) * 1000:.2f}, gateway;dur={(called - admitted) * 1000:.2f}, "
                          f"worker;dur={(self.admission.clock() - called) * 1000:.2f}")
                message = {**message, "headers": [*message.get("headers", []), (b"server-timing", timing.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            self.admission.release(key)
