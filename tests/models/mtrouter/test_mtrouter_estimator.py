"""Outcome estimator: training smoke (loss falls, finite, parameters change), early stopping,
batched candidate scoring, the linear head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.mtrouter.estimator import OutcomeEstimator, RidgeOutcomeEstimator, TrainingSet, build_estimator
from models.mtrouter.model_encoder import attribute_table


def synthetic_set(n: int = 120, d: int = 8, seed: int = 0) -> tuple[TrainingSet, np.ndarray]:
    """Outcome of model m on history x: x·w_m — models disagree in a history-dependent way."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=(3, d))
    hist = np.repeat(np.arange(n), 3)
    model = np.tile(np.arange(3), n)
    y = np.einsum("nd,nd->n", x[hist], w[model])
    return TrainingSet(x, hist, model, y, groups=hist.astype(str)), w


@pytest.fixture
def table(pool, book):
    return attribute_table(pool.names, {w.name: w.attributes for w in pool.workers}, book)


@pytest.mark.slow
def test_training_smoke_loss_falls_and_parameters_change(table, tiny_cfg):
    data, _ = synthetic_set()
    cfg = tiny_cfg.replace(linear_head=False, max_epochs=20, patience=20)
    est = OutcomeEstimator(table, cfg)
    torch.manual_seed(cfg.seed)
    before = [p.detach().clone() for p in est._new_net(data.histories.shape[1]).parameters()]
    est.fit(data.subset(np.arange(0, 300)), data.subset(np.arange(300, 360)))
    losses = est.reports[0].train_loss
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.8 * losses[0]
    after = list(est.nets[0].parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    pred = est.predict(data.histories[data.history_idx[300:]], data.model_idx[300:])
    assert np.isfinite(pred).all()


def test_early_stopping_on_validation_loss(table, tiny_cfg):
    data, _ = synthetic_set()
    noise = TrainingSet(data.histories, data.history_idx, data.model_idx,
                        np.random.default_rng(1).normal(size=len(data)))  # nothing to learn
    est = OutcomeEstimator(table, tiny_cfg.replace(linear_head=False, max_epochs=50, patience=3)).fit(
        noise.subset(np.arange(300)), noise.subset(np.arange(300, 360)))
    report = est.reports[0]
    assert report.stopped_early and len(report.val_loss) < 50
    assert len(report.val_loss) == report.best_epoch + 1 + 3  # stopped 3 epochs after the best one


def test_candidates_scored_in_one_batch_match_pairwise_predictions(table, tiny_cfg):
    data, _ = synthetic_set()
    cfg = tiny_cfg.replace(ensemble=2, max_epochs=5)
    est = OutcomeEstimator(table, cfg).fit(data.subset(np.arange(300)), data.subset(np.arange(300, 360)))
    zx = data.histories[5]
    batch = est.score_candidates(zx, np.arange(3))
    pairwise = est.predict(np.repeat(zx[None], 3, axis=0), np.arange(3))
    assert batch == pytest.approx(pairwise, abs=1e-5)
    assert est.predict_matrix(data.histories[5:9], np.arange(3))[0] == pytest.approx(pairwise, abs=1e-5)


def test_linear_head_recovers_model_specific_effects(table, tiny_cfg):
    data, _ = synthetic_set(n=200)
    train, test = data.subset(np.arange(450)), data.subset(np.arange(450, 600))
    est = OutcomeEstimator(table, tiny_cfg.replace(linear_head=True, max_epochs=5)).fit(train, None)
    pred = est.predict(test.features(), test.model_idx)
    assert np.corrcoef(pred, test.targets)[0, 1] > 0.95


def test_build_estimator_switches_on_regressor(table, tiny_cfg):
    assert isinstance(build_estimator(table, tiny_cfg), OutcomeEstimator)
    ridge = build_estimator(table, tiny_cfg.replace(regressor="ridge"))
    assert isinstance(ridge, RidgeOutcomeEstimator)
    data, _ = synthetic_set()
    assert np.isfinite(ridge.fit(data).predict(data.features()[:5], data.model_idx[:5])).all()
