"""Schemathesis against the gateway's own OpenAPI schema (gateway/openapi.py), with a bounded example
budget: valid and invalid requests generated from the schema for every route, each answered without a
5xx and in the documented shape (status, content type, body schema). A live gateway (uvicorn in a
thread) in front of a real endpoint (DelayedEndpoint); the key is valid, so requests reach the router,
the budget and the worker. The longer run: `ROUTEROPS_FUZZ_EXAMPLES=500 pytest tests/gateway/test_schema_fuzz.py`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.config import SchemathesisConfig
from schemathesis.generation.modes import GenerationMode

from gateway.app import Gateway, GatewayConfig, create_app
from gateway.champion import Champion, Champions
from routerops.pricing import load_pool, load_price_book
from routerops.workers.chaos import DelayedEndpoint, _BackgroundServer

REPO = Path(__file__).resolve().parents[2]
POOL, BOOK = load_pool(REPO / "configs" / "pools" / "embedded-smollm2.yaml"), load_price_book(REPO / "configs" / "prices" / "current.yaml")
NAME = "router-fuzz"
# The suite's budget; the longer run (once benchmarks/gateway_fuzz.py) sets ROUTEROPS_FUZZ_EXAMPLES=500.
EXAMPLES_PER_ROUTE = int(os.environ.get("ROUTEROPS_FUZZ_EXAMPLES", "25"))


class LiveGateway:
    """A gateway over a fitted router (tests/gateway/test_hardening.py's), every LLM worker at one endpoint
    that accepts images (so that image parts reach a worker too)."""

    def __init__(self, router, db: Path, log_texts: bool = True):
        self.endpoint = DelayedEndpoint(delay_s=0.0)
        url = self.endpoint.__enter__()
        pool = dataclasses.replace(POOL, workers=tuple(
            dataclasses.replace(w, endpoint=url, accepts={"image_url": 1000} if w.name == "smol-direct" else {})
            if w.kind == "llm" else w for w in POOL.workers))
        champions = Champions([NAME], pool, BOOK)
        champions._current[NAME] = Champion(NAME, "1", router, "now")
        self.gw = Gateway(GatewayConfig(routers=(NAME,), db_url=f"sqlite:///{db}", log_texts=log_texts), pool, BOOK,
                          champions=champions)
        self.server = _BackgroundServer(create_app(self.gw))
        self.server.start()
        self.base_url = f"http://127.0.0.1:{self.server.port}"
        key, _ = self.gw.store.create_key(1e6, "total")
        self.headers = {"Authorization": f"Bearer {key}"}

    def close(self) -> None:
        self.server.stop()
        self.endpoint.__exit__(None, None, None)


def load_schema(live: LiveGateway, examples: int):
    config = SchemathesisConfig()
    # The key is ours (headers=): invalid requests are made of the routes' parameters and bodies, not the key's
    config.projects.default.generation.update(max_examples=examples, modes=["positive", "negative"],
                                              with_security_parameters=False)
    return schemathesis.openapi.from_url(f"{live.base_url}/openapi.json", config=config)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    import importlib.util

    spec = importlib.util.spec_from_file_location("hardening", Path(__file__).with_name("test_hardening.py"))
    hardening = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hardening)
    router = hardening.router.__wrapped__()  # the fixture's function: the same fitted router
    served = LiveGateway(router, tmp_path_factory.mktemp("fuzz") / "gw.db")
    yield served
    served.close()


def fuzz(live: LiveGateway, examples: int, seed: int = 0) -> dict[str, dict[str, int]]:
    """Every route of the schema, `examples` generated requests per generation mode (valid, invalid),
    each sent and its answer checked by Schemathesis (no 5xx, status documented, content type and body
    as documented); the first failure raises. Counts per route and mode: sent, and answers by status class."""
    schema = load_schema(live, examples)
    counts: dict[str, dict[str, int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            tally = counts.setdefault(f"{operation.label} [{mode.value}]", {})

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
            def check(case):
                response = case.call_and_validate(base_url=live.base_url, headers=live.headers)
                tally["sent"] = tally.get("sent", 0) + 1
                status = f"{response.status_code // 100}xx"
                tally[status] = tally.get(status, 0) + 1

            try:
                check()
            except Unsatisfiable:  # nothing in this route can be made invalid but the key, which is ours
                tally["unsatisfiable"] = 1
    return counts


@pytest.mark.slow
def test_no_5xx_and_every_answer_matches_the_schema(live):
    counts = fuzz(live, EXAMPLES_PER_ROUTE)
    assert len(counts) == 8  # four routes, valid and invalid requests for each
    assert all(not c.get("5xx") for c in counts.values()), counts
    assert all(c.get("sent", 0) >= 1 for route, c in counts.items() if "[positive]" in route), counts  # /v1/models: one case
    chat = counts["POST /v1/chat/completions [positive]"]
    assert chat.get("2xx", 0) >= 1, chat  # valid requests were routed and answered, not only refused
