"""What `gateway serve` adds for operators (issue 40, item 4): /health and /ready, the Prometheus series
per router and worker (and per key when asked), a trace per request with a span per worker call, and
the refusals to start: a router with no champion, a champion that routes to a tool worker.

Real components: a router registered in a temp MLflow registry (tests/gateway/conftest.py), the
gateway served by uvicorn in a thread, and a real OpenAI-compatible endpoint (DelayedEndpoint) behind
one worker while the other's endpoint is a closed port, so the first call fails over.
"""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest
import yaml
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from evaluation.registry import CHAMPION_ALIAS, register
from evaluation.serving.single_turn import ServedRouter
from gateway.app import Gateway, GatewayConfig
from gateway.settings import Observability
from gateway.telemetry import ObservedGateway, Telemetry
from models.base import RoutingData
from models.baselines import LogisticRouter, QueryFeaturizer
from routerops.pricing import load_pool, load_price_book
from routerops.workers.chaos import DelayedEndpoint
from routerops.workers.server import free_port
from cli import main as cli

pytestmark = pytest.mark.slow
REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
BOOK = load_price_book(REPO / "configs" / "prices" / "current.yaml")
SERVED, REFUSED = "router-ops-surface", "router-ops-tool"
ARITH = {"role": "user", "content": "What is 17 plus 25 times 3?"}


def register_champion(family: str, workers: list[str]) -> None:
    """A surface-statistics router (no encoder) on `workers`: the first learns arithmetic, the second capitals."""
    import mlflow

    rng = np.random.default_rng(0)
    queries = [f"What is {rng.integers(10, 99)} plus {rng.integers(10, 99)} times {i % 7 + 2}?" if i % 2 else
               f"Which city is the capital of country number {i}?" for i in range(40)]
    scores = np.array([[1.0, 0.0] if i % 2 else [0.0, 1.0] for i in range(40)])
    costs = np.tile([1e-6, 1e-5], (40, 1))
    data = RoutingData([f"q{i}" for i in range(40)], queries, list(workers), scores, costs)
    router = LogisticRouter(seed=0)
    router.featurizer = QueryFeaturizer(use_embedding=False)
    served = ServedRouter.from_fitted(router.fit(data), data, BOOK.version, embedding=None, family=family)
    registered = register(served, include_code=False)
    mlflow.MlflowClient().set_registered_model_alias(registered.name, CHAMPION_ALIAS, registered.version)


@pytest.fixture(scope="module")
def champions(mlflow_registry):
    register_champion("ops-surface", ["smol-direct", "smol-cot"])
    register_champion("ops-tool", ["smol-direct", "python"])  # a tool worker: no chat endpoint to call
    return mlflow_registry


@pytest.fixture(scope="module")
def endpoint():
    server = DelayedEndpoint(delay_s=0.01)
    with server as url:
        yield server, url


@pytest.fixture(scope="module")
def pool_file(endpoint, tmp_path_factory):
    """smol-direct behind a closed port (every call fails over), smol-cot behind the real endpoint."""
    pool = yaml.safe_load((REPO / "configs" / "pools" / "embedded-smollm2.yaml").read_text())
    for worker in pool["workers"]:
        if worker["name"] == "smol-direct":
            worker["endpoint"] = f"http://127.0.0.1:{free_port()}/v1"
        elif worker["kind"] == "llm":
            worker["endpoint"] = endpoint[1]
    path = tmp_path_factory.mktemp("pool") / "pool.yaml"
    path.write_text(yaml.safe_dump(pool))
    return path


def observed(pool_file, tmp_path, key_labels: bool = False):
    exporter = InMemorySpanExporter()
    telemetry = Telemetry((SERVED,), Observability(key_labels=key_labels), span_processor=SimpleSpanProcessor(exporter))
    cfg = GatewayConfig(routers=(SERVED,), pool_file=str(pool_file), db_url=f"sqlite:///{tmp_path / 'gw.db'}",
                        watch_interval_s=60)
    return ObservedGateway(cfg, telemetry, pool=load_pool(pool_file), book=BOOK), exporter


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one series in Prometheus text (labels in any order)."""
    for line in metrics.splitlines():
        match = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if match and dict(re.findall(r'(\w+)="([^"]*)"', match.group(1))) == labels:
            return float(match.group(2))
    raise AssertionError(f"no {name}{labels} in:\n" + "\n".join(l for l in metrics.splitlines() if name in l))


def test_health_ready_metrics_and_a_trace_with_a_span_per_worker_call(champions, pool_file, serve_gateway, tmp_path):
    gw, exporter = observed(pool_file, tmp_path)
    url = serve_gateway(gw).removesuffix("/v1")
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{url}/ready")
    assert ready.status_code == 200 and ready.json() == {"ready": True, "routers": {SERVED: "1"}, "database": "ok"}

    key, _ = gw.store.create_key(1.0, "day")
    answer = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                        json={"model": "auto", "max_tokens": 8, "messages": [ARITH]})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-routerops-worker"] == "smol-cot" and answer.headers["x-routerops-fallbacks"] == "1"
    gw.store.close()  # the settlement is written (and recorded) after the answer

    metrics = httpx.get(f"{url}/metrics").text
    served = {"router": SERVED, "worker": "smol-cot"}
    assert sample(metrics, "routerops_gateway_routed_requests_total", **served, status="ok") == 1
    cost = float(answer.headers["x-routerops-cost-usd"])
    assert sample(metrics, "routerops_gateway_spend_usd_total", **served) == pytest.approx(cost, rel=1e-6) and cost > 0
    usage = answer.json()["usage"]
    assert sample(metrics, "routerops_gateway_tokens_total", **served, kind="prompt") == usage["prompt_tokens"]
    assert sample(metrics, "routerops_gateway_tokens_total", **served, kind="completion") == usage["completion_tokens"]
    assert sample(metrics, "routerops_gateway_request_seconds_count", **served) == 1
    assert sample(metrics, "routerops_gateway_fallbacks_total", router=SERVED, worker="smol-direct") == 1
    assert "routerops_gateway_admitted_total" in metrics  # the admission counters are still there
    assert 'key="' not in metrics  # no per-key series unless asked

    spans = {s.name: s for s in exporter.get_finished_spans() if s.name == "chat.completions"}
    request = spans["chat.completions"]
    calls = [s for s in exporter.get_finished_spans() if s.name == "worker.call"]
    assert [c.attributes["routerops.worker"] for c in calls] == ["smol-direct", "smol-cot"]
    assert all(c.parent.span_id == request.context.span_id for c in calls)
    assert not calls[0].status.is_ok and calls[1].status.is_ok  # the failed attempt is marked
    assert request.attributes["routerops.worker"] == "smol-cot"
    assert request.attributes["routerops.cost_usd"] == pytest.approx(cost, rel=1e-6)
    assert request.attributes["http.response.status_code"] == 200


def test_key_labels_only_when_asked(champions, pool_file, serve_gateway, tmp_path):
    gw, _ = observed(pool_file, tmp_path, key_labels=True)
    url = serve_gateway(gw).removesuffix("/v1")
    key, info = gw.store.create_key(1.0, "day")
    stream = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                        json={"model": "auto", "max_tokens": 8, "messages": [ARITH], "stream": True})
    assert stream.status_code == 200 and "[DONE]" in stream.text
    gw.store.close()
    metrics = httpx.get(f"{url}/metrics").text
    assert sample(metrics, "routerops_gateway_routed_requests_total", router=SERVED, worker="smol-cot",
                  key=info.key_id, status="ok") == 1


def test_ready_is_503_while_a_router_has_no_champion(champions, serve_gateway, tmp_path):
    gw = Gateway(GatewayConfig(routers=("router-nothing",), db_url=f"sqlite:///{tmp_path / 'gw.db'}",
                               watch_interval_s=60))
    url = serve_gateway(gw).removesuffix("/v1")
    assert httpx.get(f"{url}/health").status_code == 200  # alive ...
    ready = httpx.get(f"{url}/ready")  # ... not ready
    assert ready.status_code == 503 and ready.json()["routers"] == {"router-nothing": None}


def serve(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = cli.main(["gateway", "serve", *argv])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def test_serve_refuses_a_router_with_no_champion(champions, tmp_path, capsys):
    code, err = serve(capsys, "--router", "router-nothing", "--tracking-uri", champions,
                      "--db-url", f"sqlite:///{tmp_path / 'gw.db'}", "--port", str(free_port()))
    lines = err.strip().splitlines()
    assert code == 2 and lines[-1].startswith("routerops: error: ") and "Traceback" not in err, err
    assert "'router-nothing' has no registered champion" in lines[-1] and "routerops register" in lines[-1]


def test_serve_refuses_a_champion_that_routes_to_a_tool_worker(champions, tmp_path, capsys):
    code, err = serve(capsys, "--router", REFUSED, "--tracking-uri", champions,
                      "--pool-file", str(REPO / "configs" / "pools" / "embedded-smollm2.yaml"),
                      "--db-url", f"sqlite:///{tmp_path / 'gw.db'}", "--port", str(free_port()))
    lines = err.strip().splitlines()
    assert code == 2 and lines[-1].startswith("routerops: error: ") and "Traceback" not in err, err
    assert f"router {REFUSED!r}: its champion v1 cannot serve pool" in lines[-1]
    assert "worker 'python'" in lines[-1] and "no LLM endpoint" in lines[-1]
