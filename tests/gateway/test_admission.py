"""gateway/admission.py and gateway/serving.py, driven deterministically: a fake clock for the waits and
the adaptive limit, a loop blocked on purpose for the kernel's queue (no assertion on speed)."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time

import pytest
import uvicorn

from gateway import admission
from gateway.admission import (ADMITTED, INITIAL_LIMIT, LATE_ALWAYS_FACTOR, MIN_LIMIT, OVERHEAD_MIN_SAMPLES,
                               OVERHEAD_WINDOW_S, WORKER_CALLED, Admission, AdmissionMiddleware)
from gateway.app import error_response
from gateway.errors import RequestError
from gateway.serving import ARRIVED, DOOR_CHECKED, StampedHttpToolsProtocol, kernel_wait_s


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def refused(door: Admission, arrived_at: float | None = None) -> RequestError:
    with pytest.raises(RequestError) as raised:
        asyncio.run(door.acquire(arrived_at))
    exc = raised.value
    response = error_response(exc)
    assert exc.status == 503 and exc.code == "overloaded" and response.status_code == 503
    assert response.headers["retry-after"] == "1" and response.headers["retry-after-ms"] == "1000"
    return exc


def test_behind_a_standing_queue_a_request_that_waited_past_the_bound_is_refused_at_the_door():
    clock = Clock()
    door = Admission(max_queue_wait_s=0.02, clock=clock)
    for _ in range(OVERHEAD_MIN_SAMPLES - 1):  # a burst that waited 30 ms each (the process descheduled): served
        asyncio.run(door.acquire(clock.t - 0.03))
    assert door.stats.admitted == OVERHEAD_MIN_SAMPLES - 1 and door.stats.shed == 0
    refused(door, arrived_at=clock.t - 0.03)  # every request of the window waited: a standing queue
    assert door.stats.shed_late == 1 and door.stats.admitted == OVERHEAD_MIN_SAMPLES - 1
    asyncio.run(door.acquire(clock.t - 0.01))  # 10 ms: within the bound
    refused(door, arrived_at=clock.t - 0.03)  # the window's smallest wait is 10 ms: still standing
    asyncio.run(door.acquire(None))  # no stamp (another server): counted from the door, 0 ms
    asyncio.run(door.acquire(clock.t - 0.03))  # a request that did not wait, in the window: no standing queue
    clock.t += OVERHEAD_WINDOW_S * 1.5  # a new window, one late request in it: a burst, served
    asyncio.run(door.acquire(clock.t - 0.03))
    assert door.stats.shed_late == 2 and door.stats.admitted == OVERHEAD_MIN_SAMPLES + 3


def test_a_request_that_waited_twice_the_bound_is_refused_even_without_a_standing_queue():
    """After a stall of the process the window before it has expired: the first requests read make no
    standing queue. One that waited 1.5x the bound is served (a burst); one that waited past
    LATE_ALWAYS_FACTOR times it is refused, its answer late whatever is done."""
    clock = Clock()
    door = Admission(max_queue_wait_s=0.02, clock=clock)
    asyncio.run(door.acquire(clock.t - 0.03))
    assert door.stats.admitted == 1
    refused(door, arrived_at=clock.t - 0.02 * LATE_ALWAYS_FACTOR - 0.005)
    assert door.stats.shed_late == 1 and door.stats.admitted == 1
    asyncio.run(door.acquire(clock.t - 0.02 * LATE_ALWAYS_FACTOR + 0.001))  # within it: served
    assert door.stats.admitted == 2


async def settle() -> None:
    """Let every ready task run (a handed slot reaches its waiter through shield and wait_for)."""
    for _ in range(20):
        await asyncio.sleep(0)


def feed(door: Admission, clock: Clock, overhead_s: float) -> int:
    """One full window of admitted requests with this overhead; the limit after it."""
    clock.t += OVERHEAD_WINDOW_S
    for _ in range(OVERHEAD_MIN_SAMPLES):
        door.observe(overhead_s)
    return door.limit


def test_the_limit_shrinks_while_the_gateway_queues_and_grows_back_only_when_reached():
    clock = Clock()
    door = Admission(max_in_flight=64, max_queue=0, max_overhead_ms=5.0, clock=clock)
    assert door.limit == INITIAL_LIMIT
    assert feed(door, clock, 0.002) == INITIAL_LIMIT  # unloaded (the baseline) and never reached: unchanged
    # 30 ms of overhead against a 2 + 5 ms target: the limit falls by at most half per window, to the floor
    assert [feed(door, clock, 0.030) for _ in range(4)] == [8, 4, 2, MIN_LIMIT]
    assert door.stats.overhead_ms == pytest.approx(30.0) and door.stats.baseline_overhead_ms == pytest.approx(2.0)

    async def fill():
        await door.acquire()
        await door.acquire()

    asyncio.run(fill())  # the limit's two slots taken; with no queue the third is refused
    refused(door)
    assert door.stats.shed_queue_full == 1 and door.stats.in_flight == 2
    assert feed(door, clock, 0.003) == MIN_LIMIT + 1  # fast again, and reached: it grows (by its square root)
    assert feed(door, clock, 0.003) == MIN_LIMIT + 1  # not reached since: it stays
    door.release()
    door.release()
    assert door.stats.in_flight == 0


def test_a_lagging_event_loop_shrinks_the_limit_though_the_overhead_before_the_call_is_small():
    """The answers wait through the loop's lag after the worker call: the limit's sample is the median
    overhead plus the window's median lag (ticks fed as the lag timer does)."""
    clock = Clock()
    door = Admission(max_in_flight=64, max_queue=0, max_overhead_ms=5.0, clock=clock)
    assert feed(door, clock, 0.001) == INITIAL_LIMIT  # the baseline: 1 ms, no lag
    for _ in range(20):
        door.observe_lag(0.0005)  # a loop that keeps up: within the 1 + 5 ms target
    assert feed(door, clock, 0.001) == INITIAL_LIMIT
    for _ in range(20):
        door.observe_lag(0.011)  # 11 ms late: 1 + 11 ms against 6 ms, the limit halves
    assert feed(door, clock, 0.001) == INITIAL_LIMIT // 2
    assert door.stats.window_loop_lag_ms == pytest.approx(11.0) and door.stats.overhead_ms == pytest.approx(1.0)
    assert feed(door, clock, 0.001) == INITIAL_LIMIT // 2  # the lag gone (no ticks): unchanged, not reached


def test_a_fixed_limit_without_a_target():
    door = Admission(max_in_flight=3, max_queue=0)
    for _ in range(3 * OVERHEAD_MIN_SAMPLES):
        door.observe(1.0)
    assert door.limit == 3


def test_a_standing_queue_hands_slots_newest_first_and_waits_briefly():
    clock = Clock()

    async def scenario():
        door = Admission(max_in_flight=1, max_queue=8, max_queue_wait_s=60.0, clock=clock)
        await door.acquire()
        order: list[str] = []

        async def waiter(name: str):
            await door.acquire()
            order.append(name)

        old, new = asyncio.create_task(waiter("old")), asyncio.create_task(waiter("new"))
        await settle()
        assert door.stats.waiting == 2
        door.release()  # the queue formed just now: first in, first out
        await settle()
        assert order == ["old"]
        newest = asyncio.create_task(waiter("newest"))
        await settle()
        clock.t += OVERHEAD_WINDOW_S  # not empty for a whole window: standing
        door.release()
        await settle()
        assert order == ["old", "newest"]  # LIFO: the newest waiter, which has the most time left
        # a new waiter on a standing queue waits a few ms at most, not max_queue_wait_s (60 s)
        with pytest.raises(RequestError) as late:
            await door.acquire()
        assert late.value.status == 503 and door.stats.shed_queue_wait == 1
        door.release()
        await new
        door.release()
        assert door.stats.in_flight == 0 and door.stats.waiting == 0 and door.stats.queued == 3
        await asyncio.gather(old, newest)

    asyncio.run(scenario())


def test_kernel_wait_is_read_from_tcp_info_and_zero_where_there_is_none():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    client.sendall(b"hello")
    time.sleep(0.2)  # the bytes sit unread in the kernel for at least this long
    assert kernel_wait_s(server) >= 0.15  # the kernel's clock ticks in jiffies: a tick's rounding allowed
    a, b = socket.socketpair()  # a Unix socket: no TCP_INFO
    assert kernel_wait_s(a) == 0.0
    for s in (listener, client, server, a, b):
        s.close()


def test_a_request_left_in_the_kernel_by_a_blocked_loop_is_refused_with_retry_after_on_an_open_connection(
        monkeypatch):
    """The first request blocks the server's event loop (as a starved process does not run it) while the
    second one's bytes arrive: the second waits in the kernel, and the door sees that wait (TCP_INFO).
    One request is taken as a window (the standing-queue test itself is the fake-clock test's)."""
    monkeypatch.setattr(admission, "OVERHEAD_MIN_SAMPLES", 1)
    door = Admission(max_queue_wait_s=0.1)
    blocking, go = threading.Event(), threading.Event()
    seen: dict[str, dict] = {}

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        state = scope["state"]
        if scope["path"] == "/block":
            blocking.set()
            go.wait(30)  # blocks the loop: nothing is read meanwhile
        state[WORKER_CALLED] = door.clock()
        seen[scope["path"]] = dict(state)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(AdmissionMiddleware(app, door, paths=("/block", "/next")), http=StampedHttpToolsProtocol,
                            log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    first, second = http.client.HTTPConnection("127.0.0.1", port), http.client.HTTPConnection("127.0.0.1", port)
    try:
        first.request("GET", "/block")
        assert blocking.wait(30)
        second.request("GET", "/next")  # connected by the kernel's backlog; its bytes wait in the kernel
        time.sleep(0.2)  # at least this long: past the 0.1 s bound
        go.set()
        answer = first.getresponse()
        assert answer.status == 200 and "wait;dur=" in answer.getheader("server-timing")
        answer.read()
        assert seen["/block"][ARRIVED] <= seen["/block"][ADMITTED]
        shed = second.getresponse()
        body = json.loads(shed.read())
        assert shed.status == 503 and shed.getheader("retry-after") == "1" and body["error"]["code"] == "overloaded"
        assert "waited" in body["error"]["message"] and door.stats.shed_late == 1
        second.request("GET", "/next")  # the same connection, still open: now served
        assert second.getresponse().status == 200 and door.stats.admitted == 2
    finally:
        go.set()
        first.close()
        second.close()
        server.should_exit = True
        thread.join(timeout=10)


class Spy:
    """The served app: counts the requests uvicorn hands to the app (a task each), wraps the door's middleware."""

    def __init__(self, app):
        self.app, self.calls = app, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.calls += 1
        await self.app(scope, receive, send)


def serve(app) -> tuple[uvicorn.Server, threading.Thread, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http=StampedHttpToolsProtocol, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, sock.getsockname()[1]


def read_answers(sock: socket.socket, n: int) -> tuple[list[tuple[int, dict[str, str], bytes]], bytes]:
    """`n` whole HTTP/1.1 answers (Content-Length bodies) from `sock`, and what followed them."""
    buffer, answers = b"", []
    while len(answers) < n:
        while b"\r\n\r\n" not in buffer:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(answers)} answers"
            buffer += chunk
        head, buffer = buffer.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        fields = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        while len(buffer) < int(fields["content-length"]):
            buffer += sock.recv(65536)
        size = int(fields["content-length"])
        answers.append((int(lines[0].split()[1]), fields, buffer[:size]))
        buffer = buffer[size:]
    return answers, buffer


def chat_post(body: bytes, version: str = "1.1") -> bytes:
    return (f"POST /v1/chat/completions HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def test_a_refusal_is_written_by_the_protocol_before_the_app_and_the_connection_serves_on():
    """With every slot taken and no queue, a chat request is refused as its headers are parsed: the app
    is never called (no task, no framework), its body is dropped unread, and the next request on the
    same connection, sent in the same write, is parsed whole; once a slot is free it is served."""
    door = Admission(max_in_flight=1, max_queue=0)

    async def app(scope, receive, send):
        assert scope["state"].get(DOOR_CHECKED) is True  # the protocol's checks are not repeated
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    refused_seen: list[RequestError] = []
    spy = Spy(AdmissionMiddleware(app, door, on_refused=refused_seen.append))
    server, thread, port = serve(spy)
    asyncio.run(door.acquire())  # the one slot, taken
    conn = socket.create_connection(("127.0.0.1", port))
    try:
        # the first body is not a request: were it parsed as one, the connection would answer 400
        conn.sendall(chat_post(b"GET / HTTP/1.1\r\n\r\n") + chat_post(b'{"model": "auto"}'))
        answers, rest = read_answers(conn, 2)
        assert rest == b""
        for status, fields, body in answers:
            error = json.loads(body)["error"]
            assert status == 503 and fields["retry-after"] == "1" and fields["retry-after-ms"] == "1000"
            assert fields["content-type"] == "application/json" and error["code"] == "overloaded"
            assert error["type"] == "server_error" and "server" not in fields  # not uvicorn's response path
        assert spy.calls == 0 and door.stats.shed_queue_full == 2 and door.stats.shed == 2
        assert [e.status for e in refused_seen] == [503, 503]
        door.release()
        conn.sendall(chat_post(b"{}"))
        [(status, _, body)], _ = read_answers(conn, 1)
        assert (status, body) == (200, b"ok") and spy.calls == 1 and door.stats.admitted == 2
        assert door.stats.shed == 2  # the door counted each request once
        for _ in range(1000):  # the middleware gives the slot back just after the answer is written
            if door.stats.in_flight == 0:
                break
            time.sleep(0.01)
        # HTTP/1.0 (no keep-alive): refused, then the connection is closed
        asyncio.run(door.acquire())
        old = socket.create_connection(("127.0.0.1", port))
        old.sendall(chat_post(b"{}", version="1.0"))
        [(status, fields, _)], _ = read_answers(old, 1)
        assert status == 503 and fields["connection"] == "close" and old.recv(1) == b""
        old.close()
    finally:
        conn.close()
        server.should_exit = True
        thread.join(timeout=10)
