"""MTRouter at inference (§3.3 "Inference", eq. 8) and its adapters.

    a_t* = argmax_{a ∈ A} ŝ_θ(h_t, a)                     (eq. 8)
    cost-aware variant:  argmax_a ŝ_θ(h_t, a) − λ · ĉ(a)

under the per-episode budget B and turn limit T_max (eq. 1). z_x is computed once per turn and all
candidates are scored in one batch. `MTRouterPolicy` plugs the router into the rollout engine
(routerops.types.Policy); `MTRouterRouter` is the single-turn form for logged-outcome tables
(models.base.Router), where the history is the query alone.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from models.base import Router, RoutingData
from models.mtrouter.config import MTRouterConfig
from models.mtrouter.dataset import HistoryFeaturizer, TurnExamples, turn_examples, validation_rows
from models.mtrouter.estimator import TrainingSet, build_estimator
from models.mtrouter.history import HistoryEncoder, Interaction, build_history_encoder, interactions_from_turns
from models.mtrouter.model_encoder import AttributeTable, attribute_table
from models.mtrouter.persistence import load_router, save_router
from models.mtrouter.targets import expected_episode_lengths
from routerops.errors import InputError
from routerops.pricing import Pool, PriceBook, derive_costs
from routerops.types import STOP, Action, EpisodeState


def fit_estimator(examples: TurnExamples, featurizer: HistoryFeaturizer, table: AttributeTable, cfg: MTRouterConfig):
    """Fit the featurizer on training tasks and the estimator on train rows, early-stopped on val rows."""
    train_rows, val_rows = validation_rows(examples.task_ids, examples.splits, cfg)
    if len(train_rows) == 0:
        raise InputError("<training data>", "episodes", "no training examples (after ablation filters)")
    featurizer.fit([examples.tasks[i] for i in train_rows])
    train = examples.training_set(featurizer, table, train_rows)
    val = examples.training_set(featurizer, table, val_rows) if len(val_rows) else None
    return build_estimator(table, cfg).fit(train, val)


class MTRouter:
    """Turn-level router over a worker pool, trained on logged trajectories."""

    def __init__(self, pool: Pool, price_book: PriceBook | None = None, cfg: MTRouterConfig | None = None,
                 history_encoder: HistoryEncoder | None = None):
        self.cfg = cfg or MTRouterConfig()
        self.pool = pool
        self.price_book = price_book
        self.table = attribute_table(pool.names, {w.name: w.attributes for w in pool.workers}, price_book)
        self.encoder = history_encoder or build_history_encoder(self.cfg)
        self.featurizer = HistoryFeaturizer(self.encoder, self.cfg)
        self.estimator = None
        self.expected_cost: dict[str, float] = {}
        self.lengths: dict[str, float] = {}

    # ---- training
    def fit(self, episodes: pd.DataFrame, turns: pd.DataFrame, prompts: Mapping[str, str] | None = None) -> "MTRouter":
        """Train on logged episodes/turns tables (routerops.schema). Episodes of splits other than
        train/val are ignored when those splits are present; `prompts` maps task_id → task text."""
        if episodes["split"].isin(["train", "val"]).any():
            episodes = episodes[episodes["split"].isin(["train", "val"])]
        turns = turns[turns["episode_id"].isin(set(episodes["episode_id"]))]
        self.lengths = expected_episode_lengths(episodes, self.cfg)
        examples = turn_examples(episodes, turns, self.encoder, self.cfg, prompts, self.lengths)
        self.estimator = fit_estimator(examples, self.featurizer, self.table, self.cfg)
        self.expected_cost = self._expected_costs(turns)
        return self

    def _expected_costs(self, turns: pd.DataFrame) -> dict[str, float]:
        """ĉ(a): mean cost of a call to each worker in the logs, re-priced under the current book;
        a worker never logged gets the dearest observed mean (pessimistic, so it is not favoured)."""
        if turns.empty:
            return {w: 0.0 for w in self.pool.names}
        cost = derive_costs(turns, self.price_book) if self.price_book is not None else turns["cost_usd"]
        means = cost.groupby(turns["worker"]).mean().to_dict()
        fallback = max(means.values(), default=0.0)
        return {w: float(means.get(w, fallback)) for w in self.pool.names}

    # ---- inference
    def history_features(self, state: EpisodeState) -> np.ndarray:
        """z_x of the current history h_t (one embedding, cached by content hash)."""
        return self.features_of(state.task.prompt, interactions_from_turns(state.turns, state.observation))

    def features_of(self, task: str, interactions: Sequence[Interaction]) -> np.ndarray:
        """z_x of h_t = [q, ⟨u_0, o_1⟩, …] given as the task text and its interactions (eq. 2)."""
        text = self.encoder.serialise(task, interactions, self.cfg.history_mode)
        return self.featurizer.transform([text], [task])[0]

    @property
    def input_dim(self) -> int:
        """Width of z_x: φ's width, plus the surface statistics when they are on."""
        return int(self.encoder.dim) + (0 if self.featurizer.mean is None else len(self.featurizer.mean))

    def score(self, zx: np.ndarray, workers: Sequence[str]) -> np.ndarray:
        """ŝ(h_t, a) for each candidate worker, all in one batch."""
        if self.estimator is None:
            raise RuntimeError("MTRouter used before fit()")
        idx = np.array([self.table.index(w) for w in workers], dtype=np.int64)
        return np.asarray(self.estimator.score_candidates(zx, idx), dtype=float)

    def select(self, state: EpisodeState, actions: Sequence[Action]) -> Action:
        """eq. 8 (minus λ·ĉ) over the offered actions that fit the remaining budget; STOP when the
        turn limit is reached, an answer was submitted, or nothing is affordable."""
        if state.done or len(state.turns) >= state.turn_limit:
            return STOP
        if self.cfg.stop_when_answered and state.answer is not None:
            return STOP
        remaining = state.budget_usd - state.spent_usd
        candidates = [a for a in actions if a.primitive != STOP.primitive
                      and self.expected_cost.get(a.worker, 0.0) <= remaining]
        if not candidates:
            return STOP
        workers = [a.worker for a in candidates]
        chosen = candidates[self.best_index(workers, self.score(self.history_features(state), workers))]
        return Action(chosen.worker, chosen.primitive, 1.0)

    def best_index(self, workers: Sequence[str], scores: np.ndarray) -> int:
        """argmax of ŝ − λ·ĉ over `workers` with their scores ŝ (eq. 8 and its cost-aware variant)."""
        cost = np.array([self.expected_cost.get(w, 0.0) for w in workers])
        utility = np.asarray(scores, dtype=float) - self.cfg.cost_weight * cost
        # Exact ties go to the cheaper action, so raising λ never raises spend.
        return min(range(len(workers)), key=lambda i: (-utility[i], cost[i], i))

    def policy(self, name: str = "mtrouter", version: str = "1") -> "MTRouterPolicy":
        return MTRouterPolicy(self, name, version)

    # ---- persistence (models/mtrouter/persistence.py: JSON + torch state_dicts + npz, no pickle)
    def save(self, directory: str | Path) -> Path:
        """Write the fitted router to `directory` (replaced atomically); φ is referenced by the config."""
        return save_router(self, directory)

    @classmethod
    def load(cls, directory: str | Path, history_encoder: HistoryEncoder | None = None) -> "MTRouter":
        """A router written by `save`; it scores every history exactly as the saved one did."""
        return load_router(cls, directory, history_encoder)


class MTRouterPolicy:
    """routerops.types.Policy adapter: deterministic, so the rng is not used."""

    def __init__(self, router: MTRouter, name: str = "mtrouter", version: str = "1"):
        self.router = router
        self.name = name
        self.version = version
        self.seed = router.cfg.seed

    def act(self, state: EpisodeState, actions: Sequence[Action], rng: Any) -> Action:
        return self.router.select(state, actions)


# ---------------------------------------------------------------- single-turn logged outcomes


def routing_attributes(data: RoutingData) -> AttributeTable:
    """Pool attributes of a logged-outcome table plus each worker's mean USD per call (its price
    signal: the paper's attribute vector includes pricing).

    Only attributes every worker carries are kept: published tables describe their models unevenly,
    and a missing value would otherwise read as 0. Dropping one loses nothing a model's identity
    cannot give back — its learned residual e_a (eq. 3) is free to absorb it.
    """
    given = {w: dict(data.worker_attributes.get(w) or {}) for w in data.workers}
    shared = set.intersection(*(set(a) for a in given.values())) if given else set()
    dropped = sorted(set().union(*given.values()) - shared)
    if dropped:
        warnings.warn(f"MTRouter ignores attributes not given for every worker: {dropped}", stacklevel=2)
    attributes = {w: {k: v for k, v in a.items() if k in shared} for w, a in given.items()}
    extra = {w: {"mean_cost_usd": float(np.nanmean(data.costs[:, j]))} for j, w in enumerate(data.workers)}
    return attribute_table(data.workers, attributes, extra=extra, source="RoutingData.worker_attributes")


class MTRouterRouter(Router):
    """MTRouter on single-turn logged outcomes: history = the query (h_0 = [q]); one training pair
    (query, worker) per observed cell with target = its score; quality = ŝ(q, worker)."""

    name = "mtrouter"
    # Below this many training queries the linear head's leave-one-out residuals are undefined
    # (one query leaves nothing to fit); the MLP then learns the targets alone.
    MIN_QUERIES_FOR_HEAD = 3
    # (query, worker) rows scored per estimator call: predict_matrix repeats z_x per candidate, so
    # 10k queries × 12 workers × a 4k-wide z_x would be ~2 GB in one batch.
    PREDICT_ROWS = 16_384

    def __init__(self, cfg: MTRouterConfig | None = None, history_encoder: HistoryEncoder | None = None,
                 seed: int | None = None):
        self.cfg = cfg or MTRouterConfig()
        if seed is not None:
            self.cfg = self.cfg.replace(seed=int(seed))
        self.encoder = history_encoder  # built on first fit when None; pass one to share its cache
        self.featurizer: HistoryFeaturizer | None = None
        self.table: AttributeTable | None = None
        self.estimator = None

    def _histories(self, data: RoutingData) -> np.ndarray:
        if self.cfg.table_embeddings:
            if data.embeddings is None:
                raise InputError("RoutingData", "embeddings", "table_embeddings is on but the table has none cached")
            return self.featurizer.with_surface(np.asarray(data.embeddings, dtype=np.float32), data.queries)
        # h_0 = [q] has no turns to delimit, so φ embeds the query as logged, without the multi-turn
        # "[Task]" header: the very text the baselines' vectors embed, so with the shared default
        # encoder (same backend and length) a replay run embeds each query once for all routers.
        return self.featurizer.transform(list(data.queries), data.queries)

    def fit(self, data: RoutingData) -> "MTRouterRouter":
        if not np.isfinite(data.scores).any():
            raise InputError("RoutingData", "scores", f"no observed score among {len(data)} queries to fit on")
        if self.encoder is None and not self.cfg.table_embeddings:
            self.encoder = build_history_encoder(self.cfg)
        self.featurizer = HistoryFeaturizer(self.encoder, self.cfg)
        self.table = routing_attributes(data)
        ids = np.asarray(data.query_ids, dtype=object)
        train_q, val_q = validation_rows(ids, None, self.cfg)
        self.featurizer.fit([data.queries[i] for i in train_q])
        zx = self._histories(data)
        train, val = (self._cells(zx, data, rows) for rows in (train_q, val_q))
        cfg = self.cfg
        if len(train_q) + len(val_q) < self.MIN_QUERIES_FOR_HEAD:  # the head fits on train ∪ val
            cfg = cfg.replace(linear_head=False)
        self.estimator = build_estimator(self.table, cfg).fit(train, val if len(val) else None)
        return self

    def _cells(self, zx: np.ndarray, data: RoutingData, rows: np.ndarray) -> TrainingSet:
        """One example per observed (query, worker) cell of `rows`."""
        q, w = np.nonzero(np.isfinite(data.scores[rows]))
        model_idx = np.array([self.table.index(data.workers[j]) for j in w], dtype=np.int64)
        return TrainingSet(zx, rows[q], model_idx, data.scores[rows[q], w].astype(float),
                           np.asarray(data.query_ids, dtype=object)[rows[q]])

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.estimator is None:
            raise RuntimeError("MTRouterRouter.predict_quality before fit()")
        idx = np.array([self.table.index(w) for w in data.workers], dtype=np.int64)
        zx = self._histories(data)
        step = max(1, self.PREDICT_ROWS // max(1, len(idx)))
        parts = [self.estimator.predict_matrix(zx[i:i + step], idx) for i in range(0, len(zx), step)]
        return np.concatenate(parts) if parts else np.zeros((0, len(idx)))
