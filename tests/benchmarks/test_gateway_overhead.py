"""benchmarks/gateway_overhead.py's load generator, against a tiny server in the test's own loop: the
prebuilt request bytes, the answers read whole (Content-Length and chunked), statuses, Server-Timing,
a connection that closes without answering counted as dropped, keep-alive reuse. No timing asserted."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest


async def read_request(reader: asyncio.StreamReader) -> tuple[list[str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    lines = head.strip().split("\r\n")
    size = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length"))
    return lines, await reader.readexactly(size)


def answer(status: int, body: bytes, extra: str = "", chunked: bool = False) -> bytes:
    if chunked:
        half = len(body) // 2
        payload = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:])) + b"0\r\n\r\n"
        return f"HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\n{extra}\r\n".encode() + payload
    return f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def test_open_loop_reads_statuses_timings_and_drops_over_keep_alive_connections(bench):
    seen: list[tuple[list[str], dict]] = []
    connections = 0

    async def handle(reader, writer):
        nonlocal connections
        connections += 1
        try:
            while True:
                lines, body = await read_request(reader)
                request = json.loads(body)
                seen.append((lines, request))
                text = request["messages"][0]["content"]
                if text == "drop":  # closes without an answer
                    writer.close()
                    return
                if text == "busy":
                    writer.write(answer(503, b'{"error": {}}', "Retry-After: 1\r\n"))
                else:
                    timing = "Server-Timing: wait;dur=1.50, gateway;dur=2.25, worker;dur=20.00\r\n"
                    writer.write(answer(200, b'{"ok": true}', timing, chunked=text == "chunked"))
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    async def scenario():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        payloads = [bench.request_bytes(url, {"Authorization": "Bearer k"}, "auto", text)
                    for text in ("ok", "busy", "chunked", "drop")]
        async with server:
            return await bench.open_loop(url, payloads, rate=200.0, n=8)

    out = asyncio.run(scenario())
    assert out["codes"].tolist() == [200, 503, 200, 0, 200, 503, 200, 0]
    answered = out["codes"] == 200
    assert np.array_equal(out["timing_ms"][answered], np.tile([1.5, 2.25, 20.0], (4, 1)))
    assert np.isnan(out["timing_ms"][~answered]).all()
    assert (out["latency_ms"] > 0).all() and len(out["late_ms"]) == 8 and len(out["loop_lag_ms"]) >= 1
    lines, request = seen[0]
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1" and "Authorization: Bearer k" in lines
    assert request == {"model": "auto", "messages": [{"role": "user", "content": "ok"}], "max_tokens": 8}
    assert len(seen) == 8 and connections < 8  # answered connections are reused; a dropped one is not


def test_run_arm_requires_every_answer_to_be_a_200_unless_statuses_are_kept(bench):
    class Generator:  # the load generator's interface, its processes left out
        def run(self, url, headers, model, texts, rate, n):
            return {"codes": np.array([200, 503, 0]), "latency_ms": np.array([25.0, 2.0, 1.0]),
                    "late_ms": np.zeros(3), "timing_ms": np.array([[1.0, 2.0, 20.0]] + [[np.nan] * 3] * 2),
                    "loop_lag_ms": np.zeros(1)}

    statuses: list[int] = []
    views: dict = {}
    kept = bench.run_arm(Generator(), "http://h:1/v1", {}, "auto", ["q"], 10, 3, statuses, views)
    assert kept.tolist() == [25.0] and statuses == [200, 503, 0]
    assert views["server_timing_ms"].tolist() == [[1.0, 2.0, 20.0]]
    with pytest.raises(RuntimeError, match=r"\[0, 200, 503\]"):
        bench.run_arm(Generator(), "http://h:1/v1", {}, "auto", ["q"], 10, 3)


def test_a_rate_is_within_target_only_in_both_views_with_nothing_dropped(bench):
    def row(client_p99, server_p99, dropped=0, other=()):
        return {"admitted": 10, "dropped_connections": dropped, "other_statuses": list(other),
                "added": {"p99_ms": client_p99}, "server_view": {"added": {"p99_ms": server_p99}}}

    assert bench.within_target(row(10.0, 12.0))
    assert not bench.within_target(row(-180.0, 40.0))  # a starved direct arm hid 40 ms in the gateway
    assert not bench.within_target(row(20.0, 5.0))
    assert not bench.within_target(row(5.0, 5.0, dropped=1))
    assert not bench.within_target(row(5.0, 5.0, other=[500]))
    assert not bench.within_target({**row(5.0, 5.0), "admitted": 0})
