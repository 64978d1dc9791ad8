"""The routing literature's K-worker routers (models/kworkers: RouterDC, EmbedLLM, GraphRouter) on
tiny in-memory tables: their losses, that they learn who to call, and that they pass through the
one router interface (replay harness, registration, serving) unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from evaluation.replay import run_replay_benchmark
from evaluation.serving.single_turn import ServedRouter
from models.base import RoutingData
from models.registry import make_router
from models.kworkers import EmbedLLMRouter, GraphRouter, RouterDCRouter
from models.kworkers.routerdc import pick_contrast_sets, sample_llm_loss, sample_sample_loss
from models import registry
from models.kworkers.stacked import StackedRouter
from tests.models.test_kworkers import separable_table as kworkers_table

LITERATURE = ["routerdc", "routerdc_cal", "embedllm", "graphrouter"]


def separable_table(n: int = 240, seed: int = 0) -> RoutingData:
    """test_kworkers' table with its queries in two clear groups (RouterDC's sample-sample loss assumes
    clusters; on isotropic noise it would pull the embedding towards arbitrary ones)."""
    return kworkers_table(n, seed, clustered=True)


FACTORIES = dict(registry.ROUTER_FACTORIES)  # before any test swaps in the short-training ones


def small(name: str, seed: int = 0):
    """The registry's router with fewer steps, so the tests stay fast."""
    router = FACTORIES[name](seed)
    router.name = name
    if isinstance(router, RouterDCRouter):
        router.steps = 400
    if isinstance(router, GraphRouter):
        router.steps = 200
    if isinstance(router, EmbedLLMRouter):
        router.max_epochs = 200
    return router


@pytest.fixture(scope="module")
def split():
    table = separable_table()
    return table.subset(np.arange(180)), table.subset(np.arange(180, 240))


@pytest.fixture(scope="module")
def fitted(split):
    train, _ = split
    return {name: small(name).fit(train) for name in LITERATURE}


# ---------------------------------------------------------------- RouterDC's losses


def test_contrast_sets_take_best_as_positives_and_worst_as_negatives():
    scores = torch.tensor([[1.0, 0, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1], [0.9, 0.2, 0.5, 0.1, 0.7, 0.3]])
    pos, neg = pick_contrast_sets(scores, 3, 2, torch.Generator().manual_seed(0))
    assert not (pos & neg).any()
    assert pos[0].sum() == 3 and bool((scores[0][pos[0]] == 1).all())  # 3 of the 4 right ones
    assert neg[0].sum() == 2 and bool((scores[0][neg[0]] == 0).all())
    assert not pos[1].any() and not neg[1].any()  # all equal: nothing to contrast
    assert pos[2].tolist() == [True, False, True, False, True, False]  # strict ranking: the top 3
    assert neg[2].tolist() == [False, True, False, True, False, False]
    two = torch.tensor([[1.0, 0.0], [0.0, 0.0]])  # two workers: K⁺ = K⁻ = 3 shrink to what there is
    pos, neg = pick_contrast_sets(two, 3, 3, torch.Generator().manual_seed(0))
    assert pos.tolist() == [[True, False], [False, False]] and neg.tolist() == [[False, True], [False, False]]


def test_sample_llm_loss_falls_as_positives_move_closer():
    pos = torch.tensor([[True, False, False]])
    neg = torch.tensor([[False, False, True]])
    near = sample_llm_loss(torch.tensor([[0.9, 0.0, -0.5]]), pos, neg, tau=0.2)
    far = sample_llm_loss(torch.tensor([[-0.5, 0.0, 0.9]]), pos, neg, tau=0.2)
    assert float(near) < float(far)
    # the sample-LLM loss for one pair: −log e^{s⁺/τ} / (e^{s⁺/τ} + e^{s⁻/τ})
    expected = -np.log(np.exp(0.9 / 0.2) / (np.exp(0.9 / 0.2) + np.exp(-0.5 / 0.2)))
    assert abs(float(near) - expected) < 1e-5


def test_sample_sample_loss_rewards_same_cluster_neighbours():
    e = torch.nn.functional.normalize(torch.tensor([[1.0, 0], [0, 1.0]]), dim=1)
    cluster = torch.tensor([0, 1])
    close = sample_sample_loss(e, e.clone(), cluster, tau=0.5)  # own-cluster mate identical
    apart = sample_sample_loss(e, -e, cluster, tau=0.5)  # own-cluster mate opposite
    assert float(close) < float(apart)


# ---------------------------------------------------------------- learning who to call


@pytest.mark.parametrize("name", LITERATURE)
def test_router_learns_who_to_call(name, split, fitted):
    _, test = split
    router = fitted[name]
    quality = router.predict_quality(test)
    assert quality.shape == (len(test), 4) and np.isfinite(quality).all()
    # The cheap worker must look better where it is right than where it is wrong (ranking, not scale:
    # RouterDC's softmax is a distribution over workers, not a probability of being right).
    assert roc_auc_score(test.scores[:, 0], quality[:, 0]) >= 0.8, name
    # At a λ that only pays the dear worker when the cheap one looks wrong, most answers are right
    # and cost stays below always calling the dear worker.
    dear = test.costs[:, 3].mean()
    accuracies = [test.scores[np.arange(len(test)), choice].mean()
                  for choice, paid in (router.decide(quality, test.costs, lam) for lam in np.geomspace(1e3, 1e7, 40))
                  if paid.mean() < 0.9 * dear]
    assert accuracies and max(accuracies) >= 0.85, name


def test_training_changes_parameters_and_losses_are_finite(split):
    train, _ = split
    dc = RouterDCRouter(steps=60, eval_every=20, seed=1)
    torch.manual_seed(1)
    fresh = RouterDCRouter(steps=1, eval_every=1, seed=1).fit(train).model_.llms.detach().clone()
    dc.fit(train)
    assert np.isfinite(dc.losses_).all() and not torch.allclose(dc.model_.llms.detach(), fresh)
    graph = GraphRouter(steps=40, seed=1).fit(train)
    assert np.isfinite(graph.losses_).all() and graph.losses_[-1] < graph.losses_[0]


def test_embedllm_fused_path_matches_torch_and_exposes_model_embeddings(split, fitted):
    _, test = split
    router = fitted["embedllm"]
    x = router.featurizer.transform(test)
    np.testing.assert_allclose(router.predict_quality(test), router.predict_with_torch(x), atol=1e-5)
    assert router.model_embeddings().shape == (router.n_bags, 4, router.dim)


def test_graphrouter_scores_each_new_query_from_the_training_graph_alone(split, fitted):
    _, test = split
    router = fitted["graphrouter"]
    whole = router.predict_quality(test)
    alone = np.vstack([router.predict_quality(test.subset(np.array([i]))) for i in range(5)])
    np.testing.assert_allclose(whole[:5], alone, atol=1e-5)  # serving one query = scoring it in a batch


def test_bad_configuration_and_too_few_queries_are_rejected(split):
    train, _ = split
    with pytest.raises(ValueError):
        RouterDCRouter(output="logits")
    with pytest.raises(ValueError):
        GraphRouter(mask_fraction=1.0)
    with pytest.raises(ValueError):
        EmbedLLMRouter(dim=0)
    with pytest.raises(ValueError):
        RouterDCRouter().fit(train.subset(np.arange(5)))
    with pytest.raises(RuntimeError):
        GraphRouter().predict_quality(train)


# ---------------------------------------------------------------- stacked ensemble


def test_stack_out_of_fold_predictions_never_read_their_own_outcomes(split):
    train, _ = split
    stack = StackedRouter(members=("knn", "logistic"), n_folds=3, seed=0, make=make_router)
    oof = stack.out_of_fold(train)
    flipped = train.subset(np.arange(len(train)))
    flipped.scores = flipped.scores.copy()
    flipped.scores[7] = 1.0 - flipped.scores[7]
    again = stack.out_of_fold(flipped)
    np.testing.assert_allclose(again[7], oof[7])  # row 7 was scored by members fitted without it
    assert not np.allclose(again, oof)  # ...while other rows' members did read it


def test_stack_learns_per_worker_weights_and_predicts_probabilities(split):
    train, test = split
    stack = StackedRouter(members=("knn", "logistic"), n_folds=3, seed=0, make=make_router).fit(train)
    quality = stack.predict_quality(test)
    assert quality.shape == (len(test), 4) and ((quality >= 0) & (quality <= 1)).all()
    weights = stack.weights()
    assert weights.shape == (4, 2)
    assert np.isnan(weights[1:]).all()  # workers 1-3 are constant on train: served by their base rate
    assert (weights[0] > 0).any()  # worker 0's P̂ leans on its members' P̂
    assert roc_auc_score(test.scores[:, 0], quality[:, 0]) >= 0.9
    with pytest.raises(ValueError):
        StackedRouter(members=("knn",), make=make_router)


# ---------------------------------------------------------------- through the harness and serving


def test_literature_routers_run_through_the_replay_harness(split, monkeypatch):
    train, test = split
    for name in LITERATURE:  # the harness builds routers by name: give it the short-training ones
        monkeypatch.setitem(registry.ROUTER_FACTORIES, name, lambda seed, _n=name: small(_n, seed))
    board = run_replay_benchmark(test, None, LITERATURE, seeds=(0,), n_boot=0, progress=False, train=train, n_jobs=1,
                                 include_singles=True)
    rows = board.set_index("router")
    for name in LITERATURE:
        assert np.isfinite(rows.loc[name, "aiq"]), name
        assert rows.loc[name, "best_accuracy"] <= test.scores.max(axis=1).mean() + 1e-12


def test_literature_routers_register_and_serve_the_same_decisions(split, fitted, tmp_path):
    train, test = split
    for name in LITERATURE:
        served = ServedRouter.from_fitted(fitted[name], train, "test-book", embedding=None)
        quality = served.quality(test)
        loaded = ServedRouter.load(served.save(tmp_path / name))
        np.testing.assert_array_equal(loaded.quality(test), quality)
