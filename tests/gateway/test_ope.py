"""Off-policy evaluation on the gateway's own traffic, end to end: requests through a real gateway
(uvicorn in a thread) with ε-exploration → graded feedback → `routerops ope` (the CLI) estimates
the champion and a registered challenger from the log → the promotion gate decides on it.

The workers are a real OpenAI-compatible test server (routerops/workers/chaos.py DelayedEndpoint),
so the test spends its time on the gateway, not on generation. The grader knows the truth by
construction: arithmetic is answered right only by smol-direct, capitals only by smol-cot. The
champion (v1) learned the two workers' labels swapped; the challenger (v2) learned the true ones.
"""

from __future__ import annotations

import json

import httpx
import mlflow
import pandas as pd
import pytest

from gateway.app import Gateway, GatewayConfig
from gateway.store import read_decisions
from routerops.workers.chaos import DelayedEndpoint
from cli.main import main as cli
from tests.gateway.test_gateway import BOOK, NAME, POOL, register_surface_router, set_champion

pytestmark = pytest.mark.slow
RIGHT = {"arith": "smol-direct", "capital": "smol-cot"}


def request(i: int) -> tuple[str, list[dict]]:
    """Alternating arithmetic and capital questions, each text distinct."""
    countries = ["France", "Japan", "Kenya", "Peru", "Canada", "Egypt", "Norway", "Chile", "Spain", "Ghana"]
    if i % 2:
        return "arith", [{"role": "user", "content": f"What is {17 + i} plus {25 * i + 3}?"}]
    return "capital", [{"role": "user", "content": f"Which city is the capital of {countries[i % 10]}? (#{i})"}]


def drive(url: str, key: str, n: int) -> None:
    """n requests, each graded by what the test knows to be right."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        for i in range(n):
            kind, messages = request(i)
            answer = http.post("/chat/completions", json={"model": "auto", "messages": messages, "max_tokens": 4})
            assert answer.status_code == 200, answer.text
            extra = answer.json()["routerops"]
            score = float(extra["worker"] == RIGHT[kind])
            graded = http.post(f"/decisions/{extra['decision_id']}/feedback", json={"score": score})
            assert graded.status_code == 200, graded.text


@pytest.fixture(scope="module")
def workers():
    with DelayedEndpoint(delay_s=0.0) as url:
        yield url


@pytest.fixture(scope="module")
def versions(mlflow_registry):
    """v1 (labels swapped: it sends each question to the wrong worker) is the champion; v2 the challenger."""
    champion = register_surface_router(workers=["smol-cot", "smol-direct"])
    set_champion(champion.version)
    challenger = register_surface_router()
    return champion.version, challenger.version


def serve(serve_gateway, workers, tmp_path, epsilon: float, log_texts: bool = True):
    db = f"sqlite:///{tmp_path / 'gateway.db'}"
    gw = Gateway(GatewayConfig(routers=(NAME,), db_url=db, local_base_url=workers, watch_interval_s=0.2,
                               epsilon=epsilon, log_texts=log_texts), POOL, BOOK)
    url = serve_gateway(gw)
    key, _ = gw.store.create_key(10.0, "day")
    return gw, url, key, db


def test_requests_feedback_ope_and_the_gate_on_the_gateways_own_traffic(versions, serve_gateway, workers, tmp_path,
                                                                       capsys):
    # `versions` first: the registry fixture then outlives the served gateways (their watchers poll it).
    champion_v, challenger_v = versions
    gw, url, key, db = serve(serve_gateway, workers, tmp_path, epsilon=0.5)
    drive(url, key, 120)
    gw.store.close()  # every queued decision written
    log = read_decisions(db, graded_only=True)
    assert len(log) == 120 and set(log.propensity.round(4)) <= {0.75, 0.25}
    assert log.graded_at.notna().all() and (log.graded_at >= log.created_at.str[:19]).all()

    out = tmp_path / "ope"
    code = cli(["ope", "--log", db, "--routers", f"{NAME}/{challenger_v}", f"{NAME}/{champion_v}", "--n-boot", "500",
                "--gate", f"{NAME}/{challenger_v}", "--min-ess", "10", "--params", str(tmp_path / "none.yaml"),
                "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    board = pd.read_csv(out / "leaderboard.csv").set_index("policy")
    challenger = board.loc[f"{NAME}/{challenger_v}"]
    # The challenger routes every request right, the champion every one wrong: estimates 1 and 0 (what
    # SNIPS gives when every supported outcome agrees), the logging policy's ε/2 = 0.25 between them.
    assert challenger["accuracy.snips"] == 1.0 and board.loc["champion (greedy)", "accuracy.snips"] == 0.0
    assert board.loc["logging policy (as served)", "accuracy.snips"] == pytest.approx(log.score.mean())
    assert 0.1 < log.score.mean() < 0.4
    # Registered v1 is the champion itself: the same estimate as its greedy rule read from the log.
    assert board.loc[f"{NAME}/{champion_v}", "accuracy.ips"] == pytest.approx(
        board.loc["champion (greedy)", "accuracy.ips"])
    assert board.loc["logging policy (as served)", "support"] == 1.0 and challenger["support"] == 1.0
    assert 10 < challenger["ess"] < 120
    assert "| policy | accuracy |" in (out / "leaderboard.md").read_text()
    summary = json.loads((out / "ope.json").read_text())
    assert summary["gate"]["promote"], summary["gate"]["reason"]
    assert summary["gate"]["evidence"]["champion_version"] == champion_v
    client = mlflow.MlflowClient()
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == challenger_v
    run = client.search_runs([mlflow.get_experiment_by_name("gateway-test").experiment_id],
                             f"attributes.run_name = 'ope {NAME}'")[0]
    assert [d.dataset.name.rsplit("/", 1)[-1] for d in run.inputs.dataset_inputs] == ["log_snapshot.parquet"]
    snapshot = pd.read_parquet(out / "log_snapshot.parquet")
    assert len(snapshot) == 120 and snapshot.decision_id.is_unique
    set_champion(champion_v)  # for the next test


def test_a_deterministic_champion_is_refused_with_the_supported_share(versions, serve_gateway, workers, tmp_path,
                                                                     capsys):
    _, challenger_v = versions
    gw, url, key, db = serve(serve_gateway, workers, tmp_path, epsilon=0.0)
    drive(url, key, 20)
    gw.store.close()
    code = cli(["ope", "--log", db, "--routers", f"{NAME}/{challenger_v}", "--params", str(tmp_path / "none.yaml"),
                "--out", str(tmp_path / "ope")])
    err = capsys.readouterr().err
    assert code == 2
    assert "has support" in err and "ε = 0" in err
    share = float(err.split("only ")[1].split("%")[0]) / 100
    log = read_decisions(db)
    right = log["query"].map(lambda q: RIGHT["arith" if "plus" in q else "capital"])
    assert share == pytest.approx((log.chosen == right).mean(), abs=1e-3) and share < 1  # where both agree


def test_a_log_without_texts_says_which_routers_it_cannot_evaluate(versions, serve_gateway, workers, tmp_path, capsys):
    """The gateway keeps no texts unless told to; this router reads surface statistics of the text and
    has no encoder, so nothing in the log can stand in for the query: `ope` says so."""
    _, challenger_v = versions
    gw, url, key, db = serve(serve_gateway, workers, tmp_path, epsilon=0.5, log_texts=False)
    drive(url, key, 10)
    gw.store.close()
    log = read_decisions(db)
    assert (log["query"] == "").all() and (log["response"] == "").all() and (log["embedding"] == "").all()
    code = cli(["ope", "--log", db, "--routers", f"{NAME}/{challenger_v}", "--params", str(tmp_path / "none.yaml"),
                "--out", str(tmp_path / "ope")])
    err = capsys.readouterr().err
    assert code == 2 and "kept no query texts" in err and "neither query texts nor embeddings" in err
