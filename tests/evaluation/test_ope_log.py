"""Reading a decision log for off-policy evaluation and retraining (evaluation/ope.py, evaluation/drift.py):
μ rebuilt from the gateway's own explanations, the cut-off, and logs kept without query texts.

The log is written by the gateway's real decision rule (gateway/routing.py `decide`) on synthetic
queries: two clusters of embeddings, worker 0 right on the first, worker 1 on the second.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evaluation.drift import routing_data, training_table
from evaluation.ope import CHAMPION_GREEDY, LOGGING, evaluate, read_log, router_quality, traffic
from evaluation.serving.single_turn import ServedRouter, bundled_minilm_ref
from gateway.app import explanation
from gateway.routing import Estimate
from gateway.routing import decide, prompt_token_bound
from models.base import RoutingData
from models.baselines import KNNRouter, LogisticRouter
from routerops.errors import InputError
from routerops.ope import OPEConfig
from routerops.pricing import load_price_book

REPO = Path(__file__).resolve().parents[2]
BOOK = load_price_book(REPO / "configs/prices/current.yaml")
WORKERS = ["smol-direct", "smol-cot"]


def cluster_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    side = rng.integers(0, 2, n)
    centres = np.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    x = (centres[side] + 0.1 * rng.standard_normal((n, 4))).astype(np.float32)
    return x, side


def knn_router() -> ServedRouter:
    x, side = cluster_data(60, 0)
    scores = np.stack([side == 0, side == 1], axis=1).astype(float)
    data = RoutingData([f"t{i}" for i in range(60)], [f"train {i}" for i in range(60)], WORKERS, scores,
                       np.tile([1e-5, 4e-5], (60, 1)), embeddings=x)
    return ServedRouter.from_fitted(KNNRouter(k=5).fit(data), data, BOOK.version, embedding=bundled_minilm_ref(),
                                    family="knn")


def surface_router() -> ServedRouter:
    x, side = cluster_data(60, 0)
    scores = np.stack([side == 0, side == 1], axis=1).astype(float)
    data = RoutingData([f"t{i}" for i in range(60)], [f"question {i} " * (1 + s) for i, s in enumerate(side)],
                       WORKERS, scores, np.tile([1e-5, 4e-5], (60, 1)), embeddings=x)
    return ServedRouter.from_fitted(LogisticRouter(seed=0).fit(data), data, BOOK.version,
                                    embedding=bundled_minilm_ref(), family="logistic")


def decision_log(n: int = 200, epsilon: float = 0.5, texts: bool = False) -> pd.DataFrame:
    """Rows as gateway/store.py writes them: the champion (always worker 0) explores with ε."""
    x, side = cluster_data(n, 1)
    rng, rows = random.Random(0), []
    bounds = {w: prompt_token_bound([{"role": "user", "content": "a question"}]) for w in WORKERS}
    for i in range(n):
        d = decide(Estimate(WORKERS, np.array([0.6, 0.4]), f"query {i}"), "router-knn", "1", BOOK, bounds, 8,
                   1.0, 1.0, 0.0, epsilon, rng, f"d{i:04d}", "single-turn")
        rows.append({"decision_id": d.decision_id, "created_at": f"2026-11-25T10:{i // 60:02d}:{i % 60:02d}Z",
                     "router": "router-knn", "router_version": "1", "query_id": d.query_id,
                     "query": f"query {i}" if texts else "", "chosen": d.chosen, "worker": d.chosen,
                     "propensity": d.propensity, "explanation": json.dumps(explanation(d, d.chosen, 1e-5)),
                     "score": float(WORKERS.index(d.chosen) == side[i]), "cost_usd": 1e-5 if d.chosen == WORKERS[0] else 4e-5,
                     "graded_at": f"2026-11-25T12:{i // 60:02d}:{i % 60:02d}.000000Z",
                     "embedding": "" if texts else json.dumps(x[i].round(6).tolist())})
    return pd.DataFrame(rows)


def test_the_logging_distribution_is_rebuilt_from_each_explanation():
    logged = traffic(decision_log(50, epsilon=0.3))
    assert logged.log.logging[:, 0] == pytest.approx(np.full(50, 0.85))  # greedy: 1 − ε + ε/2
    assert logged.greedy(logged.logged_quality).tolist() == [0] * 50
    frame = decision_log(5)
    frame.loc[2, "propensity"] = 0.9
    with pytest.raises(InputError, match="not the ε-greedy rule's"):
        traffic(frame)


def test_a_log_without_texts_is_evaluated_through_its_stored_embeddings():
    logged = traffic(decision_log())
    result = evaluate(logged, {"knn": knn_router()}, OPEConfig(n_boot=200))
    # kNN routes each cluster to its right worker: near 1; the champion (always worker 0) about half.
    assert result.value("knn", "snips", "accuracy") > 0.9
    assert 0.3 < result.value(CHAMPION_GREEDY, "snips", "accuracy") < 0.7
    assert result.value(LOGGING, "ips", "accuracy") == pytest.approx(logged.log.score.mean())


def test_a_router_that_reads_the_text_is_refused_on_a_log_without_texts():
    logged = traffic(decision_log(20))
    with pytest.raises(InputError, match="its features include the query text"):
        router_quality(surface_router(), logged, "logistic")
    table = training_table(decision_log(20))
    with pytest.raises(InputError, match="cannot retrain from this log"):
        routing_data(table, surface_router())
    data = routing_data(table, knn_router())  # the stored embeddings stand in for the text
    assert data.embeddings.shape == (20, 4) and np.isnan(data.scores).sum() == 20  # one worker seen per query


def test_the_cutoff_keeps_rows_created_or_graded_after_it_out(tmp_path):
    frame = decision_log(120)
    frame.loc[3, "graded_at"] = "2026-11-25T13:30:00.000000Z"  # made before the cut-off, graded after
    frame.loc[4, "graded_at"] = None
    path = tmp_path / "log.parquet"
    frame.to_parquet(path)
    kept = read_log(path, graded_before="2026-11-25T12:01:00Z")
    assert set(kept.decision_id) == {f"d{i:04d}" for i in range(60) if i not in (3, 4)}


def test_an_exported_csv_log_reads_like_the_database(tmp_path):
    frame = decision_log(30)
    frame.loc[[0, 1], "score"] = None  # not graded yet: left out
    frame.to_csv(tmp_path / "log.csv", index=False)
    logged = traffic(read_log(tmp_path / "log.csv"))
    assert len(logged.log) == 28 and logged.log.logging.shape == (28, 2)
    episode = decision_log(3)
    episode.loc[1, "explanation"] = json.dumps({"calls": []})
    with pytest.raises(InputError, match="not one routed call"):
        traffic(episode)
