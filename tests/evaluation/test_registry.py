"""Router registry and promotion gate on real MLflow (a temp SQLite store), real routers, real text.

The logged outcomes are synthetic but shaped like a real table (one row per query and worker, costs
derived from tokens under a price book): arithmetic questions that the cheap worker gets right and
the mid-priced one often gets wrong, knowledge questions the other way round, and a dear worker that
is right on both. At a budget that excludes the dear worker a router that reads the query reaches
~90%, one that does not ~60% — a gap no 95% interval on 120 test queries can miss.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from models.base import RoutingData
from models.baselines import KNNRouter, LogisticRouter, QueryFeaturizer
from evaluation.serving.single_turn import ServedRouter, choose_within_budget, load_bundle
from routerops.config import TrackConfig
from evaluation.replay import to_routing_data
from routerops.pricing import Price, PriceBook
from routerops.promotion import GateConfig

WORKERS = ("cheap", "mid", "dear")
P_CORRECT = {"arith": (0.92, 0.25, 0.96), "capital": (0.08, 0.92, 0.96)}  # per worker, in WORKERS order
COMPLETION_TOKENS = (20, 40, 200)
BOOK = PriceBook("test-2026-01", dt.date(2026, 1, 1), {
    "cheap": Price(0.1, 0.1), "mid": Price(1.0, 1.0), "dear": Price(10.0, 10.0)})
BUDGET = 1e-4  # affords cheap and mid, never dear
COUNTRIES = ["France", "Japan", "Kenya", "Peru", "Canada", "Egypt", "Norway", "Chile", "India", "Spain",
             "Ghana", "Italy", "Brazil", "Mexico", "Greece", "Poland", "Nepal", "Cuba", "Iran", "Fiji"]



def log_router(router, train, *, price_book_version, embedding="bundled-minilm", family=None, data_hashes=None,
               metrics=None, include_code=True, expected_cost_usd=None):
    """A fitted single-turn router registered through the one Servable path."""
    from evaluation.registry import register
    from evaluation.serving.single_turn import ServedRouter

    served = ServedRouter.from_fitted(router, train, price_book_version, embedding=embedding, family=family,
                                      expected_cost_usd=expected_cost_usd)
    return register(served, data_hashes=data_hashes, metrics=metrics, include_code=include_code)

def logged_outcomes(n: int, seed: int) -> pd.DataFrame:
    """A long logged-outcome table (docs/replay_format.md) with n queries, half of each kind."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        kind = "arith" if i % 2 == 0 else "capital"
        if kind == "arith":
            query = f"What is {rng.integers(10, 999)} plus {rng.integers(10, 999)}?"
        else:
            query = f"Which city is the capital of {COUNTRIES[rng.integers(len(COUNTRIES))]}?"
        for j, worker in enumerate(WORKERS):
            rows.append({"dataset": "synthetic", "query_id": f"s{seed}-{i:04d}", "query": query, "worker": worker,
                         "score": float(rng.random() < P_CORRECT[kind][j]), "prompt_tokens": 12 + len(query) // 4,
                         "completion_tokens": COMPLETION_TOKENS[j]})
    return pd.DataFrame(rows)


def routing_data(n: int, seed: int, encoder=None) -> RoutingData:
    return to_routing_data(logged_outcomes(n, seed), BOOK, embed=None if encoder is None else encoder.encode)


def surface_router(seed: int = 0) -> LogisticRouter:
    """A learned router on text statistics alone (how many numbers, how long): no encoder to load."""
    router = LogisticRouter(seed=seed)
    router.featurizer = QueryFeaturizer(use_embedding=False)
    router.name = "surface"
    return router


def shuffled(data: RoutingData, seed: int = 0) -> RoutingData:
    """The same queries with the outcome rows permuted: a router fitted on it learns nothing about them."""
    perm = np.random.default_rng(seed).permutation(len(data))
    return RoutingData(data.query_ids, data.queries, data.workers, data.scores[perm], data.costs, data.embeddings)


@pytest.fixture
def tracking(tmp_path, monkeypatch, mlflow_db):
    import mlflow

    from evaluation.tracking import use_tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)  # mlflow sets both; teardown restores them
    use_tracking(TrackConfig(tracking_uri=uri, artifact_root=str(tmp_path / "artifacts"), experiment="registry-test"))
    yield uri
    mlflow.set_tracking_uri(None)


GATE = GateConfig(objective="accuracy_at_budget", budget_usd=BUDGET, n_boot=1000, seed=0)


@pytest.mark.slow
def test_gate_promotes_first_then_better_and_refuses_worse(tracking):
    import mlflow

    from evaluation.registry import CHAMPION_ALIAS, DECISION_FILE, promote_on_logged_grid as promote_if_better

    train, test = routing_data(240, seed=1), routing_data(120, seed=2)
    common = dict(price_book_version=BOOK.version, embedding=None, family="surface",
                  data_hashes={"logged_outcomes": "abc123"}, include_code=False)

    weak = log_router(surface_router().fit(shuffled(train)), train, **common)
    first = promote_if_better(weak.name, weak.version, test, GATE)
    assert first.promote and first.champion_score is None and "no current champion" in first.reason

    strong = log_router(surface_router().fit(train), train, **common)
    better = promote_if_better(strong.name, strong.version, test, GATE)
    assert better.promote, better.reason
    assert better.ci_low > 0 and better.candidate_score > better.champion_score + 0.15
    assert better.evidence["champion_version"] == weak.version and better.n == len(test)

    worse = log_router(surface_router().fit(shuffled(train, seed=1)), train, **common)
    refused = promote_if_better(worse.name, worse.version, test, GATE)
    assert not refused.promote and refused.ci_low <= 0, refused.reason

    client = mlflow.MlflowClient()
    assert str(client.get_model_version_by_alias("router-surface", CHAMPION_ALIAS).version) == strong.version
    tags = client.get_model_version("router-surface", worse.version).tags
    assert tags["promotion.decision"] == "refused" and tags["promotion.champion_version"] == strong.version
    assert float(tags["promotion.ci_high"]) < 0.05
    assert tags["price_book_version"] == BOOK.version and tags["data.logged_outcomes"] == "abc123"
    assert len(tags["git_commit"]) >= 7 and len(tags["data.train_sha256"]) == 64
    record = mlflow.artifacts.load_dict(f"runs:/{tags['promotion.run_id']}/{DECISION_FILE}")
    assert record["promote"] is False and record["evidence"]["gate_sha256"] == first.evidence["gate_sha256"]
    assert {"candidate_score", "champion_score", "ci_low", "ci_high", "n", "objective"} <= set(record)
    gate_runs = mlflow.search_runs(filter_string="tags.`promotion.decision` = 'refused'")
    assert len(gate_runs) == 1 and gate_runs["metrics.ci_low"].iloc[0] <= 0


@pytest.mark.slow
def test_aiq_objective_gate_and_pool_change(tracking):
    import mlflow

    from evaluation.registry import CHAMPION_ALIAS, promote_on_logged_grid as promote_if_better

    train, test = routing_data(200, seed=3), routing_data(100, seed=4)
    common = dict(price_book_version=BOOK.version, embedding=None, family="surface", include_code=False)
    aiq = GateConfig(objective="aiq", n_boot=300)
    weak = log_router(surface_router().fit(shuffled(train)), train, **common)
    assert promote_if_better(weak.name, weak.version, test, aiq).promote
    strong = log_router(surface_router().fit(train), train, **common)
    decision = promote_if_better(strong.name, strong.version, test, aiq)
    assert decision.promote and decision.ci_low > 0 and len(decision.evidence["cost_window_usd"]) == 2

    two = train.subset(np.arange(len(train)))  # the pool loses its dear worker
    two = RoutingData(two.query_ids, two.queries, ["cheap", "mid"], two.scores[:, :2], two.costs[:, :2])
    test_two = RoutingData(test.query_ids, test.queries, ["cheap", "mid"], test.scores[:, :2], test.costs[:, :2])
    new_pool = log_router(surface_router().fit(two), two, **common)
    replaced = promote_if_better(new_pool.name, new_pool.version, test_two, aiq)
    assert replaced.promote and "cannot route this pool" in replaced.reason
    champion = mlflow.MlflowClient().get_model_version_by_alias("router-surface", CHAMPION_ALIAS)
    assert str(champion.version) == new_pool.version



def test_the_register_and_gate_runs_list_the_data_they_read(tracking, tmp_path, monkeypatch):
    """The MLflow UI's Dataset column: the register run shows what the router was fitted on and
    priced under (context train), the promotion-gate run what it was judged on (context gate)."""
    import mlflow
    import yaml

    from evaluation.registry import logged_grid_judge, register_and_promote

    monkeypatch.chdir(tmp_path)  # datasets are named by their path under the working directory
    train, gate_data = routing_data(80, seed=5), routing_data(40, seed=6)
    logged_outcomes(80, seed=5).assign(split="train").to_parquet("train.parquet")
    logged_outcomes(40, seed=6).assign(split="val").to_parquet("val.parquet")
    Path("book.yaml").write_text(yaml.safe_dump({"version": BOOK.version, "prices": {}}))
    served = ServedRouter.from_fitted(surface_router().fit(train), train, BOOK.version, embedding=None, family="surface")
    judge = logged_grid_judge(gate_data, GATE, served)
    registered, _ = register_and_promote(served, judge(served, "candidate"), judge, GATE, include_code=False,
                                         training_inputs=["train.parquet", "book.yaml", "absent.parquet"],
                                         gate_inputs=["val.parquet"])

    client = mlflow.MlflowClient()
    gate_run = client.get_model_version(registered.name, registered.version).tags["promotion.run_id"]

    def contexts(run_id: str) -> dict[str, str]:
        return {i.dataset.name: {t.key: t.value for t in i.tags}["mlflow.data.context"]
                for i in client.get_run(run_id).inputs.dataset_inputs}

    assert contexts(registered.run_id) == {"train.parquet": "train", "book.yaml": "train"}
    assert contexts(gate_run) == {"val.parquet": "gate"}

def test_logged_model_signature_bundle_and_budget_rule(tracking, tmp_path):
    import mlflow
    from mlflow.models import Model

    from evaluation.serving.single_turn import registered_name

    train = routing_data(160, seed=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reg = log_router(surface_router().fit(train), train, price_book_version=BOOK.version, embedding=None,
                         family="single:odd name", include_code=False, metrics={"aiq": 0.5})
    # The signature is explicit and there is deliberately no example: MLflow's advice is not repeated (issue 26).
    assert not [w for w in caught if "input example was not provided" in str(w.message)]
    assert reg.name == registered_name("single:odd name") == "router-single-odd-name"
    local = Path(mlflow.artifacts.download_artifacts(reg.model_uri, dst_path=str(tmp_path / "dl")))
    model = Model.load(str(local))
    assert model.signature.inputs.input_names() == ["query", "budget_usd"]
    assert model.signature.outputs.input_names() == [
        "worker", "expected_cost_usd", "score:cheap", "score:mid", "score:dear"]
    bundle_dir = local / model.flavors["python_function"]["data"]
    meta = json.loads((bundle_dir / "bundle.json").read_text())
    assert meta["workers"] == list(WORKERS) and meta["price_book_version"] == BOOK.version
    assert meta["expected_cost_usd"]["cheap"] < BUDGET < meta["expected_cost_usd"]["dear"]

    served = ServedRouter(load_bundle(bundle_dir))
    out = served.predict(pd.DataFrame({"query": ["What is 12 plus 30?", "Which city is the capital of Peru?"] * 3,
                                       "budget_usd": [BUDGET, BUDGET, 0.0, 0.0, np.nan, np.nan]}))
    assert list(out.worker) == ["cheap", "mid", "cheap", "cheap", "dear", "dear"]
    assert (out.expected_cost_usd[:4] <= BUDGET).all()


def test_budget_rule_cost_never_rises_as_budget_falls():
    rng = np.random.default_rng(0)
    quality, costs = rng.random((200, 4)), np.array([0.3, 0.01, 0.1, 1.0])
    paid = [costs[choose_within_budget(quality, costs, np.full(200, b))] for b in (2.0, 0.5, 0.2, 0.05, 0.001)]
    assert all((later <= earlier).all() for earlier, later in zip(paid, paid[1:]))
    assert (paid[-1] == costs.min()).all()  # nothing affordable: the cheapest


def test_encoder_is_pickled_as_a_reference(tmp_path):
    from models.embeddings import SentenceEncoder
    from evaluation.serving.single_turn import ServingBundle, bundled_minilm_ref, save_bundle

    encoder = SentenceEncoder(use_cache=False)
    encoder._model = object()  # stands in for loaded weights: must never reach the pickle
    data = routing_data(40, seed=6)
    data.embeddings = np.random.default_rng(0).random((40, 8)).astype(np.float32)
    router = KNNRouter(k=5, encoder=encoder).fit(data)
    bundle = ServingBundle(router, list(data.workers), {w: 1e-5 for w in data.workers}, BOOK.version,
                           bundled_minilm_ref(), "knn")
    save_bundle(bundle, tmp_path / "b")
    assert (tmp_path / "b" / "router.pkl").stat().st_size < 50_000
    fresh = SentenceEncoder(use_cache=False)
    assert load_bundle(tmp_path / "b", encoder=fresh).router.encoder is fresh


@pytest.mark.slow
def test_champion_loads_and_routes_raw_text_in_a_fresh_process(tracking, tmp_path):
    """KNN on real all-MiniLM-L6-v2 embeddings; the served model embeds raw text itself."""
    from models.embeddings import SentenceEncoder
    from evaluation.registry import promote_on_logged_grid as promote_if_better

    encoder = SentenceEncoder(cache_dir=tmp_path / "cache")
    train, test = routing_data(120, seed=7, encoder=encoder), routing_data(60, seed=8, encoder=encoder)
    reg = log_router(KNNRouter(k=10).fit(train), train, price_book_version=BOOK.version)
    assert promote_if_better(reg.name, reg.version, test, GATE).promote

    script = (
        "import sys, mlflow, pandas as pd\n"
        "m = mlflow.pyfunc.load_model('models:/router-knn@champion')\n"
        "df = pd.DataFrame({'query': ['What is 417 plus 86?', 'Which city is the capital of Japan?', "
        "'What is 5 plus 9?'], 'budget_usd': [1e-4, 1e-4, 0.0]})\n"
        "print(m.predict(df).to_json(orient='records'))\n"
        "print('models' in sys.modules and sys.modules['models'].__file__)\n"
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    rows = json.loads(lines[-2])
    assert [r["worker"] for r in rows] == ["cheap", "mid", "cheap"]
    assert rows[1]["score:mid"] > rows[1]["score:cheap"] and rows[0]["score:cheap"] > rows[0]["score:mid"]
    assert "/code/models/" in lines[-1]  # the fresh process ran the code logged with the model


@pytest.mark.slow
@pytest.mark.parametrize("family", ["knn", "logistic", "mf", "mlp", "ensemble", "cascade", "random"])
def test_every_servable_baseline_round_trips_through_a_bundle(family, tmp_path):
    """Whatever a baseline holds (closures, torch modules, sklearn models) survives the bundle, and the
    served router predicts exactly what the fitted one did."""
    from models.registry import make_router
    from models.baselines.synthetic import make_synthetic_table
    from evaluation.serving.single_turn import ServingBundle, expected_costs_from_data, save_bundle

    data = make_synthetic_table(n_queries=80, seed=1)
    router = make_router(family, seed=0)
    if family in ("mf", "mlp"):
        router.max_epochs, router.patience = 60, 10  # a smoke fit: the round trip is what is tested
    router.fit(data)
    bundle = ServingBundle(router, list(data.workers), expected_costs_from_data(data), BOOK.version, None, family)
    served = ServedRouter(load_bundle(save_bundle(bundle, tmp_path / family)))
    np.testing.assert_allclose(served.quality(data), router.predict_quality(data), rtol=1e-6)


def test_unservable_routers_are_refused():
    from models.registry import make_router
    from evaluation.serving.single_turn import ServingBundle

    with pytest.raises(ValueError, match="oracle"):
        ServingBundle(make_router("oracle"), ["a"], {"a": 0.0}, "v", None, "oracle")
    with pytest.raises(ValueError, match="expected cost"):
        ServingBundle(make_router("random"), ["a", "b"], {"a": 0.0}, "v", None, "random")
