"""`routerops gateway serve --workers 2`: two gateway processes on one port share one store (SQLite in
WAL mode), and a key's budget stays exact under concurrent requests that land on both: the spend is
the sum of the settled costs, and never more than the budget plus one request's overrun.

A real router registered in a temp MLflow store (tests/gateway/conftest.py), a real endpoint
(DelayedEndpoint) billing one prompt token per byte of the text it is sent; one request of the burst
is billed 500 tokens more than it sent (an overrun, charged and recorded).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from gateway.routing import prompt_token_bound
from gateway.store import Store, period_start, read_decisions
from routerops.pricing import load_pool, load_price_book
from routerops.workers.chaos import DelayedEndpoint
from routerops.workers.server import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
OVERBILL = "Please overbill this one."


def usage(body: dict) -> dict:
    sent = sum(len(str(m.get("content") or "").encode()) for m in body["messages"])
    extra = 500 if any(OVERBILL in str(m.get("content")) for m in body["messages"]) else 0
    return {"prompt_tokens": sent + extra, "completion_tokens": 1, "total_tokens": sent + extra + 1}


@pytest.fixture(scope="module")
def champion(mlflow_registry):
    import importlib.util

    import mlflow

    from evaluation.registry import CHAMPION_ALIAS

    spec = importlib.util.spec_from_file_location("gw_test", Path(__file__).with_name("test_gateway.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registered = module.register_surface_router()
    mlflow.MlflowClient().set_registered_model_alias(registered.name, CHAMPION_ALIAS, registered.version)
    return registered.name


def start(tmp_path: Path, name: str, endpoint: str, db_url: str, tracking_uri: str) -> tuple[subprocess.Popen, str]:
    pool = yaml.safe_load((ROOT / "configs" / "pools" / "embedded-smollm2.yaml").read_text())
    for worker in pool["workers"]:
        if worker["kind"] == "llm":
            worker["endpoint"] = endpoint
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    port = free_port()
    cmd = [sys.executable, "-m", "cli", "gateway", "serve", "--router", name, "--workers", "2",
           "--port", str(port), "--tracking-uri", tracking_uri, "--pool-file", str(tmp_path / "pool.yaml"),
           "--db-url", db_url, "--max-overhead-ms", "0",  # budgets are the subject: a burst is not shed here
           "--max-queue-wait-s", "60"]
    log = open(tmp_path / "gateway.log", "wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log,
                            stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}/v1"


def wait_until_served(proc: subprocess.Popen, url: str, key: str, log: Path) -> None:
    deadline, answered = time.monotonic() + 300, 0
    while answered < 6:  # both processes up: several answers in a row (each process loads its champion)
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        try:
            status = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}, timeout=5).status_code
            answered = answered + 1 if status == 200 else 0
        except httpx.HTTPError:
            answered = 0
        time.sleep(0.5)


def test_two_processes_share_one_budget_exactly(champion, mlflow_registry, tmp_path):
    db_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    store = Store(db_url)
    endpoint = DelayedEndpoint(delay_s=0.05, usage=usage)
    with endpoint as endpoint_url:
        proc, url = start(tmp_path, champion, endpoint_url, db_url, mlflow_registry)
        try:
            probe, _ = store.create_key(1.0, "day")
            wait_until_served(proc, url, probe, tmp_path / "gateway.log")
            texts = [f"What is {i} plus {i + 7}?" for i in range(80)]
            texts[0] = f"What is 1 plus 8? {OVERBILL}"
            pool, book = load_pool(tmp_path / "pool.yaml"), load_price_book(ROOT / "configs" / "prices" / "current.yaml")
            system = pool.worker("smol-direct").generation["system"]
            worst = book.cost("smol-direct", prompt_token_bound([{"role": "user", "content": texts[40]}], system), 8)
            budget = 20 * worst  # twenty requests' worst case: about forty of the eighty fit
            key, info = store.create_key(budget, "day")

            async def burst():
                async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=100)) as c:
                    async def one(text):
                        return await c.post(f"{url}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                            json={"model": "auto", "max_tokens": 8,
                                                  "messages": [{"role": "user", "content": text}]})
                    first = await one(texts[0])  # the overbilled one, first: its overrun is charged before the rest
                    return [first, *await asyncio.gather(*(one(t) for t in texts[1:]))]

            responses = asyncio.run(burst())
            codes = [r.status_code for r in responses]
            assert set(codes) <= {200, 429} and codes.count(200) >= 10 and codes.count(429) >= 1, codes
            # both processes called the worker: the endpoint's peers are sockets of both children
            children = psutil.Process(proc.pid).children()
            ports = {pid: {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")}
                     for pid in (c.pid for c in children)}
            from_endpoint = {port for _, port in endpoint.peers}
            served_by = {pid for pid, owned in ports.items() if owned & from_endpoint}
            assert len(served_by) == 2, (ports, from_endpoint)  # (the third child: multiprocessing's resource tracker)

            deadline = time.monotonic() + 60  # settlements are written after the answers
            while store.spend(info.key_id, period_start("day"))[1] > 0:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            spent, reserved = store.spend(info.key_id, period_start("day"))
            logged = read_decisions(db_url)
            mine = logged[logged.key_id == info.key_id]
            assert len(mine) == codes.count(200)
            assert spent == pytest.approx(mine.cost_usd.sum(), abs=1e-9)  # the spend is the sum of the settled costs
            assert spent == pytest.approx(sum(r.json()["routerops"]["cost_usd"] for r in responses if r.status_code == 200),
                                          abs=1e-9)
            [overrun] = store.overruns(info.key_id)
            assert overrun["decision_id"] == responses[0].json()["routerops"]["decision_id"]
            assert spent <= budget + overrun["overrun_usd"] + 1e-12
        finally:
            proc.terminate()
            proc.wait(timeout=60)
