"""Shared gateway fixtures: a real MLflow registry in a temp SQLite store and gateways served by
uvicorn in a thread; the real llama.cpp server (SmolLM2) behind the pool's LLM workers is the
session's `llm_url` (tests/conftest.py)."""

from __future__ import annotations

import os

import pytest

from routerops.config import TrackConfig


@pytest.fixture(scope="module")
def mlflow_registry(tmp_path_factory, new_mlflow_db):
    """A real MLflow tracking store and registry (temp SQLite) for one test module; its URI."""
    import mlflow

    from evaluation.tracking import use_tracking

    tmp = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{new_mlflow_db(tmp / 'mlflow.db')}"
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID")}
    os.environ["MLFLOW_TRACKING_URI"] = uri
    os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
    use_tracking(TrackConfig(tracking_uri=uri, artifact_root=str(tmp / "artifacts"), experiment="gateway-test"))
    yield uri
    mlflow.set_tracking_uri(None)
    for key, value in saved.items():
        os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


@pytest.fixture(scope="module")
def serve_gateway():
    """serve(gw) -> base URL: the gateway's champions loaded and watched, its app served by uvicorn in
    a thread; everything served is stopped when the module's tests are done."""
    from gateway.app import create_app
    from routerops.workers.chaos import _BackgroundServer

    running = []

    def serve(gw):
        gw.champions.start(interval_s=gw.cfg.watch_interval_s)
        server = _BackgroundServer(create_app(gw))
        server.start()
        running.append((server, gw))
        return f"http://127.0.0.1:{server.port}/v1"

    yield serve
    for server, gw in reversed(running):
        server.stop()
        gw.champions.stop()
