"""Issue 42's probes, run as a hostile user would: a real gateway process (uvicorn, `gateway serve`'s
protocol) on loopback in front of a hostile worker (tests/gateway/hostile.py), each attack bounded in
count and time (the module takes ~30-60 s on two shared cores). A probe *holds* when the gateway answers as
it should; every probe's verdict is asserted, and printed with what was seen (`pytest -s`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from gateway.store import Store
from tests.gateway.hostile import ENV, REPO, HostileUpstream

pytestmark = pytest.mark.slow
TEXT = [{"role": "user", "content": "What is 17 plus 25?"}]
BODY_TIMEOUT_S = 2.0
HEAD_FLOOD_BYTES = 64 * 2**20


class GatewayProcess:
    def __init__(self, tmp: Path):
        self.upstream = HostileUpstream(stream_tokens=1000, tokens_per_chunk=50, chunk_delay_s=0.01)
        upstream_url = self.upstream.__enter__()
        self.db_url = f"sqlite:///{tmp / 'gw.db'}"
        self.store = Store(self.db_url, key_cache_s=0)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        spec = {"upstream": upstream_url, "db_url": self.db_url,
                "config": {"max_in_flight": 16, "body_timeout_s": BODY_TIMEOUT_S, "max_body_bytes": 2**20}}
        env = {**os.environ, ENV: json.dumps(spec), "PYTHONPATH": str(REPO)}
        self.log = open(tmp / "gateway.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "tests.gateway.hostile:app_from_env", "--factory",
                                      "--http", "gateway.serving:StampedHttpToolsProtocol", "--port", str(self.port),
                                      "--log-level", "warning"], cwd=REPO, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        deadline = time.monotonic() + 120
        while True:
            assert self.proc.poll() is None and time.monotonic() < deadline, (tmp / "gateway.log").read_text()[-2000:]
            try:
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 401:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        self.key, self.info = self.store.create_key(1e6, "total")
        self.headers = {"Authorization": f"Bearer {self.key}"}

    def chat(self, **extra) -> httpx.Response:
        return httpx.post(f"{self.url}/chat/completions", headers=self.headers, timeout=30,
                          json={"model": "auto", "messages": TEXT, "max_tokens": 8, **extra})

    def settled(self, timeout_s: float = 10.0) -> tuple[float, float]:
        """(spent, reserved) once nothing is reserved (the gateway process writes settlements off its
        request path), or as it stands at the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            spent, reserved = self.store.spend(self.info.key_id, "total")
            if reserved == 0 or time.monotonic() > deadline:
                return spent, reserved
            time.sleep(0.05)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()
        self.upstream.__exit__(None, None, None)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    g = GatewayProcess(tmp_path_factory.mktemp("probes"))
    yield g
    g.close()


VERDICTS: dict[str, tuple[bool, str]] = {}


def probe(name: str, held: bool, seen: str) -> None:
    VERDICTS[name] = (held, seen)
    print(f"{'held' if held else 'FAILED'}: {name}: {seen}")
    assert held, f"{name}: {seen}"


@pytest.mark.parametrize("usage", [
    '{"prompt_tokens": -10000000, "completion_tokens": -10000000}',
    '{"prompt_tokens": 100000000000000000000, "completion_tokens": 1}',
    '{"prompt_tokens": "12", "completion_tokens": 1}', '{"prompt_tokens": NaN, "completion_tokens": 1}',
    '{"prompt_tokens": 12, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": "many"}}'])
def test_an_upstream_usage_no_real_call_has_is_never_believed(gateway, usage):
    before, _ = gateway.settled()
    gateway.upstream.usages.extend([usage, usage])  # both workers answer it
    response = gateway.chat()
    spent, reserved = gateway.settled()
    probe(f"usage {usage[:60]}", response.status_code == 502 and spent > before and reserved == 0,
          f"status {response.status_code}, spend {before:.6g} -> {spent:.6g}, reserved {reserved}")


def test_an_aborted_stream_is_charged_at_least_what_it_delivered(gateway):
    before, _ = gateway.settled()
    received, worker = 0, ""
    with httpx.stream("POST", f"{gateway.url}/chat/completions", headers=gateway.headers, timeout=30,
                      json={"model": "auto", "messages": TEXT, "max_tokens": 1000, "stream": True}) as response:
        worker = response.headers["x-routerops-worker"]
        for line in response.iter_lines():
            if line.startswith("data: {"):
                received += sum(len((c["delta"].get("content") or "").split()) for c in json.loads(line[6:])["choices"])
            if received >= 950:
                break
    spent, reserved = gateway.settled()
    from routerops.pricing import load_price_book

    delivered = load_price_book(REPO / "configs" / "prices" / "current.yaml").cost(worker, 0, received)
    probe("stream of 50 tokens a chunk, client gone at 950 of 1,000", spent - before >= delivered and reserved == 0,
          f"charged ${spent - before:.3g} for ${delivered:.3g} delivered")


def slow_connection(port: int, key: str, expect: bool) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=BODY_TIMEOUT_S + 10)
    extra = "Expect: 100-continue\r\n" if expect else ""
    sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: 1000\r\n{extra}\r\n").encode()
                 + (b"" if expect else b'{"model": '))
    return sock


def test_slow_clients_do_not_starve_a_legitimate_one(gateway):
    zero, _ = gateway.store.create_key(0.0, "day")
    slow = [slow_connection(gateway.port, zero, expect=i % 2 == 1) for i in range(16)]
    time.sleep(0.3)
    with httpx.Client(headers=gateway.headers, timeout=30) as client:
        codes = [client.post(f"{gateway.url}/chat/completions",
                             json={"model": "auto", "messages": TEXT, "max_tokens": 8}).status_code for _ in range(20)]
    cut, deadline = 0, time.monotonic() + BODY_TIMEOUT_S + 5
    for sock in slow:  # each is answered 408 at the deadline (after a 100 Continue when it asked for one)
        data = b""
        try:
            while b"408" not in data and (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                if not (chunk := sock.recv(4096)):
                    break
                data += chunk
        except OSError:
            pass
        cut += b"HTTP/1.1 408" in data
        sock.close()
    probe("16 slowloris connections with a $0 key, 20 legitimate requests", codes.count(200) >= 19 and cut == 16,
          f"{codes.count(200)} of 20 answered 200 ({sorted(set(codes))}); {cut} of 16 slow clients answered")


def flood_head(port: int, limit: int, sent: list[int]) -> None:
    """One connection streaming a header of up to `limit` bytes; how far it got is appended to `sent`."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    total = 0
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Flood: ")
        chunk = b"a" * 2**20
        while total < limit:
            sock.sendall(chunk)
            total += len(chunk)
    except OSError:
        pass
    finally:
        sent.append(total)
        sock.close()


def test_four_64_mb_headers_are_refused_early_with_bounded_memory(gateway):
    rss_before = gateway.rss_mb()
    sent: list[int] = []
    threads = [threading.Thread(target=flood_head, args=(gateway.port, HEAD_FLOOD_BYTES, sent)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    time.sleep(0.5)
    growth = gateway.rss_mb() - rss_before
    probe("4 connections streaming 64 MB of headers", max(sent) < HEAD_FLOOD_BYTES and growth < 32,
          f"each cut after <= {max(sent) / 2**20:.0f} MB sent; gateway RSS {rss_before:.0f} MB, +{growth:.1f} MB")


@pytest.mark.parametrize("name, status, content, headers", [
    ("max_tokens 4097 beside a valid max_completion_tokens", 400,
     {"max_tokens": 4097, "max_completion_tokens": 8}, {}),
    ("response_format as a string", 400, {"response_format": "json_object"}, {}),
    ("101 header fields", 431, {}, {f"x-h{i}": "1" for i in range(101)}),
    ("a body over the cap", 413, {"pad": "x" * (2**20 + 10)}, {}),
    ("JSON nested 100 deep", 400, {"tools": json.loads("[" * 100 + "]" * 100)}, {}),
])
def test_requests_past_the_schema_and_the_size_limits_are_refused(gateway, name, status, content, headers):
    response = httpx.post(f"{gateway.url}/chat/completions", timeout=30, headers={**gateway.headers, **headers},
                          json={"model": "auto", "messages": TEXT, "max_tokens": 8, **content})
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        error = {}
    probe(name, response.status_code == status and set(error) == {"message", "type", "param", "code"},
          f"status {response.status_code}")
