"""An open-loop HTTP load generator for an OpenAI-compatible endpoint (the gateway, or the endpoint
behind it directly), shared by benchmarks/gateway_overhead.py and benchmarks/gateway_refusal_cost.py.

Requests are sent on a fixed schedule whatever the answers do (open loop: a slow server cannot slow the
offered load down, Schroeder et al. 2006, "Open versus closed"), over keep-alive connections, from a
client process of its own; the delayed endpoint (routerops/workers/chaos.py) runs in another, so the
three never share an interpreter.
"""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing
import os
import time
from pathlib import Path

import httpx
import numpy as np

from routerops.workers.chaos import DelayedEndpoint

COUNTRIES = ["France", "Japan", "Kenya", "Peru", "Canada", "Egypt", "Norway", "Chile", "India", "Spain"]


def queries(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"What is {rng.integers(10, 999)} plus {rng.integers(10, 999)}?" if i % 2 else
            f"Which city is the capital of {COUNTRIES[rng.integers(len(COUNTRIES))]}?" for i in range(n)]


def request_bytes(url: str, headers: dict, model: str, text: str) -> bytes:
    """One chat completion POST to `url` (http://host:port/v1), ready to write."""
    parsed = httpx.URL(url)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8}).encode()
    lines = [f"POST {parsed.path.rstrip('/')}/chat/completions HTTP/1.1", f"Host: {parsed.host}:{parsed.port}",
             "Content-Type: application/json", f"Content-Length: {len(body)}",
             *(f"{name}: {value}" for name, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    """Status, lower-cased headers and body of one HTTP/1.1 response (Content-Length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip()
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = bytearray()
        while size := int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")  # the last chunk's empty trailer
        return status, fields, bytes(body)
    return status, fields, await reader.readexactly(int(fields.get(b"content-length", b"0")))


class KeepAlivePool:
    """Plain HTTP/1.1 connections to one host, each reused once its answer is read (no pipelining)."""

    def __init__(self, host: str, port: int):
        self.host, self.port, self.idle = host, port, []

    async def send(self, payload: bytes) -> tuple[int, dict[bytes, bytes]]:
        reader, writer = self.idle.pop() if self.idle else await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(payload)
            status, fields, _ = await read_response(reader)
        except BaseException:
            writer.close()
            raise
        if b"close" in fields.get(b"connection", b"").lower():
            writer.close()
        else:
            self.idle.append((reader, writer))
        return status, fields

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def open_loop(url: str, payloads: list[bytes], rate: float, n: int) -> dict[str, np.ndarray]:
    """Open loop: request i is sent at i/rate s (from one scheduler, not n sleeping tasks); its latency is
    measured from its own send. Per request: status (0: the connection failed), latency, how late it was
    sent, the Server-Timing parts (wait, gateway, worker; NaN without); and the client loop's lag."""
    parsed = httpx.URL(url)
    pool = KeepAlivePool(parsed.host, parsed.port)
    out = {"codes": np.zeros(n, dtype=int), "latency_ms": np.zeros(n), "late_ms": np.zeros(n),
           "timing_ms": np.full((n, 3), np.nan)}

    async def one(i: int, sent: float) -> None:
        try:
            status, fields = await pool.send(payloads[i % len(payloads)])
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            status, fields = 0, {}
        out["latency_ms"][i] = (time.perf_counter() - sent) * 1000
        out["codes"][i] = status
        if b"server-timing" in fields:
            out["timing_ms"][i] = server_timing(fields[b"server-timing"].decode())

    lags: list[float] = []
    watch = asyncio.create_task(loop_lag(lags))
    tasks = []
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.perf_counter()
        out["late_ms"][i] = (sent - (start + i / rate)) * 1000
        tasks.append(asyncio.create_task(one(i, sent)))
    await asyncio.gather(*tasks)
    watch.cancel()
    pool.close()
    out["loop_lag_ms"] = np.array(lags or [0.0]) * 1000
    return out


def client_process(conn) -> None:
    """The load generator's process: runs each arm sent on `conn` and sends its result back."""
    try:
        import uvloop

        new_loop = uvloop.new_event_loop
    except ImportError:  # asyncio's own loop: slower, still correct
        new_loop = asyncio.new_event_loop
    gc.freeze()  # the imports are not timed into any arm: the collector stops walking them
    while (job := conn.recv()) is not None:
        url, payloads, rate, n = job
        with asyncio.Runner(loop_factory=new_loop) as runner:
            conn.send(runner.run(open_loop(url, payloads, rate, n)))


def endpoint_process(conn, delay_s: float) -> None:
    """The delayed endpoint in a process of its own (uvicorn's defaults): it answers until told to stop."""
    with DelayedEndpoint(delay_s=delay_s) as url:
        conn.send(url)
        conn.recv()


class LoadGenerator:
    """The client and the endpoint, each in its own process (spawned: nothing of this one is inherited)."""

    def __init__(self, delay_s: float | None):
        """`delay_s` None: no endpoint (a client alone)."""
        ctx = multiprocessing.get_context("spawn")
        self._client, child = ctx.Pipe()
        self.client = ctx.Process(target=client_process, args=(child,), daemon=True)
        self.client.start()
        self._endpoint = self.endpoint = self.endpoint_url = None
        if delay_s is not None:
            self._endpoint, child_e = ctx.Pipe()
            self.endpoint = ctx.Process(target=endpoint_process, args=(child_e, delay_s), daemon=True)
            self.endpoint.start()
            if not self._endpoint.poll(120):
                self.close()
                raise RuntimeError("the delayed endpoint did not start")
            self.endpoint_url = self._endpoint.recv()

    def run(self, url: str, headers: dict, model: str, texts: list[str], rate: float, n: int) -> dict[str, np.ndarray]:
        self._client.send((url, [request_bytes(url, headers, model, text) for text in texts], rate, n))
        return self._client.recv()

    def close(self) -> None:
        for conn, proc in ((self._client, self.client), (self._endpoint, self.endpoint)):
            if conn is None:
                continue
            try:
                conn.send(None)
            except OSError:
                pass
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()


def run_arm(load: LoadGenerator, url: str, headers: dict, model: str, texts: list[str], rate: float, n: int,
            statuses: list | None = None, views: dict | None = None) -> np.ndarray:
    """One arm on the load generator. Without `statuses` every answer must be a 200; with it, each request's
    status is appended to it (0: the connection failed) and the latencies of the 200s alone are returned.
    `views` gets, per admitted request (ms), the gateway's Server-Timing parts (wait, gateway, worker)
    and the client's own lateness (its send after the schedule: the load generator starved of CPU)."""
    out = load.run(url, headers, model, texts, rate, n)
    codes = out["codes"]
    if statuses is None:
        if (codes != 200).any():
            raise RuntimeError(f"{url}: statuses {sorted(set(codes.tolist()))} where every answer must be a 200")
        return out["latency_ms"]
    statuses.extend(codes.tolist())
    ok = codes == 200
    if views is not None:
        views.update({"client_late_ms": out["late_ms"][ok], "server_timing_ms": out["timing_ms"][ok],
                      "client_loop_lag_ms": out["loop_lag_ms"]})
    return out["latency_ms"][ok]


async def loop_lag(lags: list[float], interval_s: float = 0.005) -> None:
    """How late a 5 ms sleep of the client's own loop wakes up, tick after tick: a client starved of
    CPU answers late whatever the server did."""
    while True:
        start = time.perf_counter()
        await asyncio.sleep(interval_s)
        lags.append(max(time.perf_counter() - start - interval_s, 0.0))


def server_timing(header: str) -> tuple[float, float, float]:
    """`wait;dur=…, gateway;dur=…, worker;dur=…` (gateway/admission.py) → the three durations, ms."""
    parts = dict(part.strip().split(";dur=") for part in header.split(","))
    return float(parts["wait"]), float(parts["gateway"]), float(parts["worker"])


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (proc(5): utime, stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(ms: np.ndarray) -> dict[str, float]:
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "max_ms": float(ms.max())}


def warm_up(load: LoadGenerator, url: str, headers: dict, model: str, texts: list[str], passes: int = 3) -> None:
    """Send every text until each was answered once (a gateway's embedding cache filled). The first
    requests meet a cold gateway (MiniLM loads on the first one), so admission may refuse some with a
    503: they are sent again in the next pass, at 10 req/s; the timed arms then see only cached queries."""
    statuses: list[int] = []
    for _ in range(passes):
        statuses.clear()
        run_arm(load, url, headers, model, texts, 10, len(texts), statuses=statuses)
        if all(code == 200 for code in statuses):
            return
    raise RuntimeError(f"{url}: warm-up answered {sorted(set(statuses))} after {passes} passes")
