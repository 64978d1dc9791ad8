"""The user's journey from a table to a served endpoint (issue 40), as docs/operations/serve.md tells it,
each step the documented command in its own process: a tiny logged-outcome table → `routerops register`
→ `routerops gateway serve --config gateway.yaml` (uvicorn on loopback, in front of the session's real
llama.cpp server) → the openai SDK, plain and streamed, with the cost headers → `routerops gateway keys
spend` shows what was charged → SIGTERM ends the server cleanly.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pandas as pd
import pytest
import yaml

from routerops.pricing import load_price_book
from routerops.workers.server import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
BOOK = REPO / "configs" / "prices" / "current.yaml"
COUNTRIES = ["France", "Japan", "Kenya", "Peru", "Canada", "Egypt", "Norway", "Chile", "India", "Spain"]


def tiny_table(path: Path) -> Path:
    """40 queries × the embedded pool's two LLM workers: the direct one answers arithmetic, the
    chain-of-thought one capitals; a `split` column (28 train, 12 val)."""
    rows = []
    for i in range(40):
        arith = i % 2 == 1
        query = f"What is {10 + i} plus {3 * i + 7}?" if arith else f"Which city is the capital of {COUNTRIES[i % 10]}?"
        for worker in ("smol-direct", "smol-cot"):
            rows.append({"dataset": "tiny", "query_id": f"q{i:02d}", "query": query, "worker": worker,
                         "score": float((worker == "smol-direct") == arith), "prompt_tokens": 20,
                         "completion_tokens": 8 if worker == "smol-direct" else 60,
                         "split": "train" if i < 28 else "val"})
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def routerops(*argv: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "cli", *argv], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, f"routerops {' '.join(argv)}: exit {out.returncode}\n{out.stdout}\n{out.stderr[-3000:]}"
    return out


def wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the gateway did not become ready:\n" + log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def test_table_register_serve_call_and_spend(llm_url, new_mlflow_db, tmp_path):
    uri = f"sqlite:///{new_mlflow_db(tmp_path / 'mlflow.db')}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "ROUTEROPS_ARTIFACT_ROOT": str(tmp_path / "artifacts")}
    env.pop("MLFLOW_TRACKING_URI", None)
    table = tiny_table(tmp_path / "outcomes.csv")

    # 1. register: fitted, gated (the first version is promoted), aliased, and the serve command printed
    registered = routerops("register", "--table", str(table), "--prices", str(BOOK), "--router", "knn",
                           "--n-boot", "200", "--tracking-uri", uri, env=env)
    assert "router-knn v1: promoted: alias 'champion'" in registered.stdout, registered.stdout
    serve_line = registered.stdout.strip().splitlines()[-1].strip()
    assert shlex.split(serve_line)[:5] == ["routerops", "gateway", "serve", "--router", "router-knn"]
    assert f"--tracking-uri {uri}" in serve_line
    assert "loading the router registry" in registered.stderr  # progress before the heavy imports

    # 2. serve it from the shipped example settings, its values set for this test, a flag overriding one
    settings = yaml.safe_load((REPO / "configs" / "gateway.yaml").read_text())
    db_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    # the table's workers are the embedded pool's (the default pool's replay models need their table served)
    settings.update(routers=["router-knn"], database=db_url, tracking_uri=uri,
                    pool=str(REPO / "configs" / "pools" / "embedded-smollm2.yaml"))
    settings["server"].update(local_base_url=llm_url, port=1)  # port 1: overridden by --port below
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(settings))
    port = free_port()
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "gateway", "serve", "--config", str(config),
                                 "--port", str(port)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, log)
        assert "routerops gateway: serving router-knn" in log.read_text()  # said at once, before the imports

        # 3. a key, then the openai SDK: a plain call and a streamed one, each with its cost
        key = json.loads(routerops("gateway", "keys", "create", "--budget-usd", "1", "--db-url", db_url,
                                   env=env).stdout)["api_key"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)
        raw = client.chat.completions.with_raw_response.create(
            model="auto", max_tokens=8, messages=[{"role": "user", "content": "What is 17 plus 25?"}])
        plain = raw.parse()
        worker, cost = raw.headers["x-routerops-worker"], float(raw.headers["x-routerops-cost-usd"])
        book = load_price_book(BOOK)
        assert worker in ("smol-direct", "smol-cot") and plain.choices[0].message.content.strip()
        assert cost == pytest.approx(book.cost(worker, plain.usage.prompt_tokens, plain.usage.completion_tokens),
                                     rel=1e-6) and cost > 0
        assert raw.headers["x-routerops-router"] == "router-knn@1"
        chunks = list(client.chat.completions.create(
            model="router:router-knn", max_tokens=8, stream=True,
            messages=[{"role": "user", "content": "Which city is the capital of Peru?"}]))
        streamed = chunks[-1].model_extra["routerops"]
        assert streamed["cost_usd"] > 0 and "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        # 4. keys spend: what the database charged the key, both requests
        deadline = time.monotonic() + 60
        while True:  # the settlements are written just after the answers
            [row] = [json.loads(line) for line in routerops("gateway", "keys", "spend", "--db-url", db_url,
                                                              env=env).stdout.splitlines()]
            if row["requests"] == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert row["requests"] == 2 and row["held_usd"] == 0
        assert row["spent_usd"] == pytest.approx(cost + streamed["cost_usd"], rel=1e-6)
        metrics = httpx.get(f"{url}/metrics").text
        served = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("routerops_gateway_routed_requests_total{") and 'router="router-knn"' in line
                  and 'status="ok"' in line]
        assert sum(served) == 2, metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
