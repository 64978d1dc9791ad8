"""Issue 42, items 3 and 4: a request's head, key and body come before its slot (gateway/intake.py), a key
cannot take every slot (gateway/admission.py), and a request's size is bounded at the protocol
(gateway/serving.py). A real gateway (uvicorn in a thread, `gateway serve`'s protocol) over a real upstream."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from gateway.admission import Admission
from gateway.app import create_app
from gateway.errors import RequestError
from gateway.intake import KeyRates, Reading, read_body
from tests.gateway.hostile import HostileUpstream, ThreadServer, fitted_router, gateway_for

TEXT = [{"role": "user", "content": "What is 17 plus 25?"}]


class Live:
    def __init__(self, tmp_path, upstream: HostileUpstream | None = None, **config):
        self.upstream = upstream or HostileUpstream()
        self.gw = gateway_for(self.upstream.__enter__(), f"sqlite:///{tmp_path / 'gw.db'}", fitted_router(), **config)
        self.server = ThreadServer(create_app(self.gw))
        self.url = self.server.__enter__()
        self.port = self.server.port
        self.key, self.info = self.gw.store.create_key(1e6, "total")
        self.headers = {"Authorization": f"Bearer {self.key}"}

    def chat(self, key: str | None = None) -> httpx.Response:
        return httpx.post(f"{self.url}/chat/completions", timeout=30, headers={"Authorization": f"Bearer {key or self.key}"},
                          json={"model": "auto", "messages": TEXT, "max_tokens": 8})

    def close(self) -> None:
        self.server.__exit__(None, None, None)
        self.upstream.__exit__(None, None, None)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """One gateway for the attacks that need no rate limit: 16 slots, a 5 s body deadline, small heads."""
    s = Live(tmp_path_factory.mktemp("intake"), max_in_flight=16, body_timeout_s=5.0, max_headers=20,
             max_header_bytes=4096)
    yield s
    s.close()


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """A gateway whose keys may send a request every 2 s, and whose heads must arrive within 1 s."""
    s = Live(tmp_path_factory.mktemp("limited"), key_requests_per_s=0.5, header_timeout_s=1.0)
    yield s
    s.close()


def raw(port: int, head: bytes, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(head)
    return sock


def answer(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (or the socket's timeout)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def post_head(key: str, length: int, *extra: str) -> bytes:
    lines = ["POST /v1/chat/completions HTTP/1.1", "Host: x", f"Authorization: Bearer {key}",
             "Content-Type: application/json", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.slow
def test_slow_clients_with_a_zero_budget_key_hold_no_slot_and_are_cut_at_the_deadline(live):
    # The reported failure: 16 connections sending headers and 10 bytes of body (or Expect: 100-continue
    # and no body) with a $0 key held all 16 slots; a legitimate client got 20 of 20 requests answered 503.
    s = live
    zero, _ = s.gw.store.create_key(0.0, "day")
    slow = [raw(s.port, post_head(zero, 1000) + b'{"model": ', timeout=15) for _ in range(8)]
    slow += [raw(s.port, post_head(zero, 1000, "Expect: 100-continue"), timeout=15) for _ in range(8)]
    time.sleep(0.3)
    started = time.monotonic()
    with httpx.Client(timeout=30, headers=s.headers) as client:
        codes = [client.post(f"{s.url}/chat/completions", json={"model": "auto", "messages": TEXT,
                                                                 "max_tokens": 8}).status_code for _ in range(20)]
    assert codes.count(200) >= 19, codes
    assert time.monotonic() - started < 5.0  # served during the attack, not after it
    for sock in slow:  # each is answered 408 at the deadline and its connection closed
        data = answer(sock)
        assert data.startswith(b"HTTP/1.1 408") or b"\r\n\r\nHTTP/1.1 408" in data, data[:200]
        assert b"request_timeout" in data
        sock.close()
    assert s.gw.admission.stats.in_flight == 0


@pytest.mark.slow
def test_an_unknown_key_is_refused_before_its_body_is_read(live):
    s = live
    sock = raw(s.port, post_head("rk-nope-nope", 5000, "Expect: 100-continue"))
    data = answer_head(sock)
    assert data.startswith(b"HTTP/1.1 401") and b"100 Continue" not in data  # no body was asked for
    sock.close()
    big = raw(s.port, post_head(s.key, 100 * 2**20))  # a Content-Length over the cap: refused at once
    assert answer_head(big).startswith(b"HTTP/1.1 413")
    big.close()


def answer_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.slow
def test_a_request_head_is_bounded_in_fields_and_bytes(live):
    s = live
    many = "".join(f"X-{i}: {i}\r\n" for i in range(30)).encode()
    sock = raw(s.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    data = answer(sock)
    assert data.startswith(b"HTTP/1.1 431") and b"headers_too_large" in data
    sock = raw(s.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ")
    sent = 0
    try:  # an endless header: refused once past the limit, the connection closed
        for _ in range(1000):
            sock.sendall(b"a" * 65536)
            sent += 65536
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert sent < 64 * 2**20
    data = answer(sock)
    assert data == b"" or data.startswith(b"HTTP/1.1 431")
    assert s.chat().status_code == 200  # the gateway goes on serving


@pytest.mark.slow
def test_a_head_that_never_ends_is_cut_at_its_deadline(limited):
    sock = raw(limited.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # and never ends its head
    started = time.monotonic()
    data = answer(sock)
    assert data.startswith(b"HTTP/1.1 408") and b"request_timeout" in data and time.monotonic() - started < 6.0


@pytest.mark.slow
def test_a_key_over_its_request_rate_gets_429_with_retry_after(limited):
    s = limited
    first, refused = s.chat(), s.chat()
    assert first.status_code == 200
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.headers["retry-after"]) >= 1 and "x-should-retry" not in refused.headers
    other, _ = s.gw.store.create_key(1.0, "day")
    assert s.chat(other).status_code == 200  # another key is not limited by it


def test_key_rates_refill_at_their_rate():
    now = [0.0]
    rates = KeyRates(per_s=2.0, burst=2.0, clock=lambda: now[0])
    assert rates.take("a") is None and rates.take("a") is None
    assert rates.take("a") == pytest.approx(0.5)
    now[0] += 0.5
    assert rates.take("a") is None and rates.take("b") is None
    slow = KeyRates(per_s=0.5, burst=0.5, clock=lambda: now[0])  # below one a second: still one at once
    assert slow.take("a") is None and slow.take("a") == pytest.approx(2.0)


def test_a_key_holding_the_slots_yields_them_to_another_key_that_waits():
    async def run():
        door = Admission(max_in_flight=4, max_queue=4, max_queue_wait_s=0.01)
        for _ in range(4):
            await door.acquire(key="greedy")  # alone, a key may take every slot
        with pytest.raises(RequestError) as waited:
            await door.acquire(key="other")  # no slot within the bound: 503, and the greedy key must yield
        assert waited.value.status == 503
        with pytest.raises(RequestError) as over:
            await door.acquire(key="greedy")
        assert over.value.status == 429 and over.value.code == "key_concurrency" and over.value.retry_after_s
        door.release("greedy")
        with pytest.raises(RequestError):  # a slot is free, but the greedy key is over its share
            await door.acquire(key="greedy")
        await door.acquire(key="other")  # the free slot is the other key's
        assert door.stats.refused_key_share == 2 and door.stats.in_flight == 4
        for _ in range(3):
            door.release("greedy")
        door.release("other")
        assert door.stats.in_flight == 0

    asyncio.run(run())


def test_bodies_read_at_once_are_bounded_in_bytes_and_time():
    async def run():
        async def slow_receive():  # 10 bytes, then nothing more
            if not chunks:
                await asyncio.sleep(3600)
            return {"type": "http.request", "body": chunks.pop(), "more_body": True}

        reading = Reading(limit=25)
        chunks = [b"x" * 10]
        first = asyncio.create_task(read_body(slow_receive, 100, 0.3, reading=reading))
        await asyncio.sleep(0.05)
        assert reading.bytes == 10
        chunks.append(b"y" * 20)  # a second body would take the bytes being read past the limit
        with pytest.raises(RequestError) as over:
            await read_body(slow_receive, 100, 1.0, reading=reading)
        assert over.value.status == 503 and over.value.retry_after_s
        with pytest.raises(RequestError) as late:
            await first
        assert late.value.status == 408 and reading.bytes == 0  # cut at its deadline, its bytes given back

    asyncio.run(run())
