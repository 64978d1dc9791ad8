"""Off the table (issue 39 item 6): `routerops arena evaluate` scores a registered router on another
logged table with responses, through the table's replay endpoint, with no retraining."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from models.base import RoutingData
from evaluation.transfer import choices, worker_map
from routerops.config import TrackConfig


def test_the_choice_is_the_best_worker_the_table_holds_and_a_choice_outside_it_is_counted():
    quality = np.array([[0.9, 0.2, 0.1], [0.1, 0.3, 0.8], [0.2, 0.6, 0.1]])
    chosen, outside = choices(quality, ["live", "a", "b"], {"a": "A", "b": "B"})
    assert chosen == ["A", "B", "A"] and outside.tolist() == [True, False, False]


def test_router_workers_map_by_flag_then_pool_model_then_name(tmp_path):
    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump({"name": "p", "workers": [
        {"name": "gpt", "kind": "llm", "endpoint": "replay:t.csv", "model": "gpt-4-1106-preview", "primitives": ["answer"]}]}))
    mapped = worker_map(["gpt", "weak", "live"], ["gpt-4-1106-preview", "weak", "other"], pool, {"live": "other"})
    assert mapped == {"gpt": "gpt-4-1106-preview", "weak": "weak", "live": "other"}
    with pytest.raises(Exception, match="none of the router's workers"):
        worker_map(["x"], ["a"], None, {})


@pytest.mark.slow
def test_a_registered_router_is_scored_on_another_table_through_its_replay_endpoint(tmp_path, monkeypatch, mlflow_db,
                                                                                   capsys):
    import mlflow

    from evaluation.registry import CHAMPION_ALIAS, register
    from evaluation.serving.single_turn import ServedRouter
    from evaluation.tracking import use_tracking
    from models.baselines import LogisticRouter, QueryFeaturizer
    from cli.main import main

    uri = f"sqlite:///{mlflow_db}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    use_tracking(TrackConfig(tracking_uri=uri, artifact_root=str(tmp_path / "artifacts"), experiment="transfer-test"))
    # Trained where "plus" questions go to the cheap worker and the others to the dear one.
    queries = [f"What is {i} plus {i + 3}?" if i % 2 else f"Which city is the capital of country {i}?" for i in range(40)]
    scores = np.array([[1.0, 0.0] if "plus" in q else [0.0, 1.0] for q in queries])
    train = RoutingData([f"q{i}" for i in range(40)], queries, ["cheap", "dear"], scores, np.tile([1e-5, 1e-4], (40, 1)))
    router = LogisticRouter(seed=0)
    router.featurizer = QueryFeaturizer(use_embedding=False)
    version = register(ServedRouter.from_fitted(router.fit(train), train, "t", embedding=None,
                                                family="transfer")).version
    mlflow.MlflowClient().set_registered_model_alias("router-transfer", CHAMPION_ALIAS, version)

    # Another table (other questions, other names), where the same rule holds: transfer should show.
    rows = [{"dataset": "other", "query_id": f"t{i}", "query": q, "worker": w, "prompt_tokens": 20,
             "completion_tokens": 4, "score": float((w == "small") == ("plus" in q)), "response": f"answer {i} by {w}"}
            for i, q in enumerate([f"What is {7 * i} plus {i}?" if i % 2 else f"Which city is the capital of land {i}?"
                                   for i in range(10)]) for w in ("small", "large")]
    table = tmp_path / "other.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    prices = tmp_path / "prices.yaml"
    prices.write_text(yaml.safe_dump({"version": "p", "effective_date": "2026-12-01", "prices": {
        "small": {"input_per_1m": 1.0, "output_per_1m": 1.0}, "large": {"input_per_1m": 10.0, "output_per_1m": 10.0}}}))
    out = tmp_path / "transfer.json"
    code = main(["arena", "evaluate", "--table", str(table), "--prices", str(prices), "--controller", "router-transfer",
                 "--map", "cheap=small", "dear=large", "--pool", str(tmp_path / "none.yaml"), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["version"] == version and result["test_queries"] == 10
    assert result["accuracy"] == 1.0 and result["action_shares"] == {"small": 0.5, "large": 0.5}
    assert result["usd_per_query"] == pytest.approx((0.5 * 24 * 1.0 + 0.5 * 24 * 10.0) / 1e6)
    singles = {row["policy"]: row["accuracy"] for row in result["baselines"]}
    assert singles == {"single:small": 0.5, "single:large": 0.5, "oracle": 1.0}
    assert result["first_choice_outside_table"] == 0.0
