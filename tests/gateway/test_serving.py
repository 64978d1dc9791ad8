"""How the gateway serves, on a fake pool (routerops.workers.chaos.DelayedEndpoint answers for every
worker) and a router fitted in the test (no registry, no LLM): requests overlap at the worker, the
event loop keeps serving while the database is busy, plain calls reuse one connection to the worker,
and settlements queued off the request path are all written by the app's shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn

from evaluation.serving.single_turn import ServedRouter
from gateway.app import Gateway, GatewayConfig, create_app
from gateway.champion import Champion, Champions
from gateway.serving import StampedHttpToolsProtocol
from gateway.store import Store, period_start, read_decisions
from models.base import RoutingData
from models.baselines import LogisticRouter, QueryFeaturizer
from routerops.pricing import load_pool, load_price_book
from routerops.workers.chaos import DelayedEndpoint, _BackgroundServer

REPO = Path(__file__).resolve().parents[2]
POOL, BOOK = load_pool(REPO / "configs" / "pools" / "embedded-smollm2.yaml"), load_price_book(REPO / "configs" / "prices" / "current.yaml")
WORKERS = ["smol-direct", "smol-cot"]
NAME = "router-serving"
BODY = {"model": "auto", "messages": [{"role": "user", "content": "What is 17 plus 25?"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def router() -> ServedRouter:
    queries = [f"What is {i} plus {i + 3}?" if i % 2 else f"Which city is the capital of country {i}?"
               for i in range(40)]
    scores = np.array([[1.0, 0.0] if "plus" in q else [0.0, 1.0] for q in queries])
    data = RoutingData([f"q{i}" for i in range(40)], queries, list(WORKERS), scores, np.tile([1e-5, 1e-4], (40, 1)))
    model = LogisticRouter(seed=0)
    model.featurizer = QueryFeaturizer(use_embedding=False)
    return ServedRouter.from_fitted(model.fit(data), data, BOOK.version, embedding=None, family="serving-test")


class Served:
    def __init__(self, router: ServedRouter, tmp_path: Path, delay_s: float):
        self.endpoint = DelayedEndpoint(delay_s=delay_s)
        url = self.endpoint.__enter__()
        pool = dataclasses.replace(POOL, workers=tuple(
            dataclasses.replace(w, endpoint=url) if w.kind == "llm" else w for w in POOL.workers))
        self.db_url = f"sqlite:///{tmp_path / 'gw.db'}"
        champions = Champions([NAME], pool, BOOK)
        champions._current[NAME] = Champion(NAME, "1", router, "now")
        self.gw = Gateway(GatewayConfig(routers=(NAME,), db_url=self.db_url), pool, BOOK, champions=champions)
        self.server = _BackgroundServer(create_app(self.gw))
        self.server.start()
        self.url = f"http://127.0.0.1:{self.server.port}/v1"
        self.key, self.info = self.gw.store.create_key(1.0, "day")
        self.headers = {"Authorization": f"Bearer {self.key}"}

    def close(self) -> None:
        self.server.stop()
        self.endpoint.__exit__(None, None, None)


@pytest.fixture
def serving(router, tmp_path):
    served = Served(router, tmp_path, delay_s=0.3)
    yield served
    served.close()


def test_concurrent_requests_overlap_at_the_worker(serving):
    async def burst():
        async with httpx.AsyncClient(timeout=30) as c:
            return await asyncio.gather(*(c.post(f"{serving.url}/chat/completions", json=BODY,
                                                 headers=serving.headers) for _ in range(8)))

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 8
    assert serving.endpoint.max_in_flight == 8  # nothing in the gateway serialises the requests


def test_the_event_loop_serves_while_the_database_is_busy(serving):
    with httpx.Client(timeout=30) as c:  # the key is verified once (then cached)
        assert c.post(f"{serving.url}/chat/completions", json=BODY, headers=serving.headers).status_code == 200
    gate = threading.Event()
    serving.gw.store.submit(lambda conn: gate.wait(30))  # the store's thread is stuck until the gate opens

    async def while_blocked():
        async with httpx.AsyncClient(timeout=10) as c:
            chat = asyncio.create_task(c.post(f"{serving.url}/chat/completions", json=BODY, headers=serving.headers))
            await asyncio.sleep(0.2)
            # a request that needs no database is answered while another waits on it: the loop is free
            models = await c.get(f"{serving.url}/models", headers=serving.headers)
            waiting = not chat.done()
            gate.set()
            return models.status_code, waiting, (await chat).status_code

    try:
        assert asyncio.run(while_blocked()) == (200, True, 200)
    finally:
        gate.set()


def test_plain_calls_reuse_one_connection_to_the_worker(router, tmp_path):
    served = Served(router, tmp_path, delay_s=0.0)
    try:
        with httpx.Client(timeout=30) as c:
            for _ in range(5):
                assert c.post(f"{served.url}/chat/completions", json=BODY, headers=served.headers).status_code == 200
        assert len(served.endpoint.peers) == 5 and len(set(served.endpoint.peers)) == 1
    finally:
        served.close()


def test_answers_do_not_wait_for_settlement_and_shutdown_writes_every_one(router, tmp_path):
    served = Served(router, tmp_path, delay_s=0.5)
    gate = threading.Event()
    try:
        async def burst():
            async with httpx.AsyncClient(timeout=30) as c:
                calls = [asyncio.create_task(c.post(f"{served.url}/chat/completions", json=BODY,
                                                    headers=served.headers)) for _ in range(10)]
                while served.endpoint.in_flight < 10:  # every call reserved its budget and reached the worker
                    await asyncio.sleep(0.01)
                served.gw.store.submit(lambda conn: gate.wait(30))  # then the database stops
                return await asyncio.gather(*calls)

        responses = asyncio.run(burst())
        # all ten answered while the store's thread was stuck: settling and logging are off the request path
        assert [r.status_code for r in responses] == [200] * 10 and not gate.is_set()
        gate.set()
        served.server.stop()  # the app's shutdown writes what is still queued
    finally:
        gate.set()
        served.close()
    logged = read_decisions(served.db_url)
    assert sorted(logged.decision_id) == sorted(r.json()["routerops"]["decision_id"] for r in responses)
    spent, reserved = Store(served.db_url).spend(served.info.key_id, period_start("day"))
    assert reserved == 0 and spent == pytest.approx(sum(r.json()["routerops"]["cost_usd"] for r in responses))


def test_gateway_serve_refuses_overload_at_the_protocol_and_counts_it(router, tmp_path):
    """`gateway serve`'s protocol finds the app's door (gateway/app.py): with the one slot taken, a chat
    request is refused before the app (no uvicorn response path: no `server` header), with Retry-After,
    and counted once in /metrics; other paths are not admission's."""
    endpoint_url = DelayedEndpoint(delay_s=0.0)
    url = endpoint_url.__enter__()
    pool = dataclasses.replace(POOL, workers=tuple(
        dataclasses.replace(w, endpoint=url) if w.kind == "llm" else w for w in POOL.workers))
    champions = Champions([NAME], pool, BOOK)
    champions._current[NAME] = Champion(NAME, "1", router, "now")
    gw = Gateway(GatewayConfig(routers=(NAME,), db_url=f"sqlite:///{tmp_path / 'gw.db'}", max_in_flight=1,
                               max_queue=0), pool, BOOK, champions=champions)
    key, _ = gw.store.create_key(1.0, "day")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(gw), http=StampedHttpToolsProtocol, log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        while not server.started:
            time.sleep(0.01)
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as c:
            assert c.post(f"{base}/v1/chat/completions", json=BODY).status_code == 200
            asyncio.run(gw.admission.acquire())  # the one slot, taken
            refused = c.post(f"{base}/v1/chat/completions", json=BODY)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "overloaded" and "server" not in refused.headers
            assert c.get(f"{base}/v1/models").status_code == 200  # not admission's path
            metrics = c.get(f"{base}/metrics").text
        assert 'routerops_gateway_responses_total{status="503"} 1' in metrics
        assert 'routerops_gateway_shed_total{reason="queue_full"} 1' in metrics
        gw.admission.release()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        endpoint_url.__exit__(None, None, None)
