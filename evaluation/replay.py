"""Replay benchmark: train and evaluate routers on logged outcomes, with no live call.

Every router is cross-fitted: the queries are split into k folds and each fold is scored by a router
trained on the other folds only, so no query is ever scored by a router that saw its outcome. The
router's knob (cost weight λ, or a cascade's threshold) is then swept over the out-of-fold
predictions to trace its accuracy–cost curve, summarised by RouterBench's AIQ, LLMRouterBench's
gain over the best single worker and cost saved, and, for two-worker tables, RouteLLM's APGR and
CPT(50%/80%) with router score = q̂(strong) − q̂(weak): evaluation/curves.py (its names are
importable from here too).

Costs come from tokens and the price book passed in, so re-pricing is passing another book.
Tables with a split (a `split` column, or a second table to train on) are scored on a fixed split
instead: routers fit on the training rows only (`run_replay_benchmark(..., train=...)`). Router names
resolve through `models.registry.make_router` unless factories are given.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
from sklearn.model_selection import KFold
from tqdm.auto import tqdm

from models.base import Router, RoutingData
from models.embeddings import default_encoder, remember_vectors
from models.mtrouter.ablations import SINGLE_TURN_ABLATIONS, run_ablations
from models.mtrouter.config import MTRouterConfig
from models.mtrouter.history import build_history_encoder
from models.mtrouter.router import MTRouterRouter
from models.registry import ENSEMBLES, FIT_COST, ROUTER_FACTORIES, make_router, same_predictions
from evaluation.curves import (  # noqa: F401  (public here too: the replay harness's numbers)
    STRONG_FRACTION, OperatingPoints, aiq_in_window, bootstrap_intervals, cost_at_accuracy, cost_window, curve_summary,
    knob_grid, operating_points, resample_counts, single_worker_reference, strong_call_score, strong_weak, sweep,
    two_worker_metrics,
)
from routerops.envs.replay import load_logged_outcomes, validate_logged_outcomes, worker_order
from routerops.errors import InputError, RouteropsError
from routerops.metrics import curve_aiq  # noqa: F401  (tests and benchmarks read it here)
from routerops.pricing import PriceBook, load_price_book

RouterFactory = Callable[[int], Router]
log = logging.getLogger(__name__)


def cross_fit(data: RoutingData, router_factory: RouterFactory | Callable[[], Router], k: int = 5,
              seed: int = 0) -> np.ndarray:
    """(n, w) out-of-fold quality predictions: fold f is scored by a fresh router fitted on the rest."""
    return held_out_qualities(router_factory, data, k, [seed])[seed]


def _build(factory, seed: int) -> Router:
    """factory(seed), or factory() for a router class or a zero-argument callable."""
    if isinstance(factory, type):
        return factory()
    try:
        takes_seed = bool(inspect.signature(factory).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: assume the documented form
        takes_seed = True
    return factory(seed) if takes_seed else factory()


def fit_then_score(train: RoutingData, data: RoutingData, router_factory, seed: int = 0) -> np.ndarray:
    """(n, w) quality predictions on `data` of a fresh router fitted on `train` alone (a fixed split:
    nothing of `data` reaches the router's training data)."""
    return held_out_qualities(router_factory, data, 0, [seed], train)[seed]


def held_out_qualities(factory, data: RoutingData, k: int, seeds: Sequence[int], train: RoutingData | None = None,
                       n_jobs: int = 1, vectors_id: str | None = None) -> dict[int, np.ndarray]:
    """{seed: (n, w) predictions by routers that never saw the query they score}: fitted on `train` (a
    fixed split) when given, else cross-fitted on `data` with k folds per seed (cross_fit's folds).

    Every (seed, fold) fit is one task; with n_jobs > 1 they run in that many worker processes
    (joblib's loky). Each fit is single-threaded, so on 2 cores two folds at once take about the time
    of one. `vectors_id`: the cache id of the encoder that embedded `data` (and `train`); a worker
    puts those vectors in its own memo first, so a router that embeds (MTRouter's φ) finds them
    there instead of running the encoder again.
    """
    return held_out_qualities_of({None: factory}, data, k, seeds, train, n_jobs, vectors_id)[0][None]


def held_out_qualities_of(factories: dict, data: RoutingData, k: int, seeds: Sequence[int],
                          train: RoutingData | None = None, n_jobs: int = 1, vectors_id: str | None = None,
                          cost: dict | None = None) -> tuple[dict, dict]:
    """held_out_qualities for several routers at once, as one pool of (router, seed, fold) tasks:
    ({name: {seed: (n, w)}}, {name: seconds its fits took, summed over tasks}).

    Tasks are handed out dearest first (`cost`: relative seconds per fit by name, default 1), the
    longest-processing-time order: the workers then finish within about one small fit of each
    other, instead of each router's last fold leaving a core idle (15 folds on 2 cores: half a fit
    per router). Predictions are those of held_out_qualities for each router alone (same folds,
    same seeds, each fit in its own task).
    """
    if train is not None and list(train.workers) != list(data.workers):
        raise InputError("training table", "worker", f"trains on workers {train.workers}, scores {data.workers}")
    if train is None and not 2 <= k <= len(data):
        raise ValueError(f"k={k} folds needs 2 ≤ k ≤ n={len(data)}")
    splits = []  # (seed, rows fitted on or None for `train`, rows scored or None for all of `data`)
    for seed in seeds:
        if train is not None:
            splits.append((seed, None, None))
            continue
        folds = KFold(n_splits=k, shuffle=True, random_state=seed).split(np.arange(len(data)))
        splits.extend((seed, fit_rows, score_rows) for fit_rows, score_rows in folds)
    cost = cost or {}
    names = sorted(factories, key=lambda name: -float(cost.get(name, 1.0)))  # stable: ties keep their order
    tasks = [(name, *split) for name in names for split in splits]
    if n_jobs > 1 and len(tasks) > 1:
        run = joblib.delayed(_fit_and_score_in_worker)
        results = joblib.Parallel(n_jobs=min(n_jobs, len(tasks)), backend="loky")(
            run(factories[name], data, train, seed, fit_rows, score_rows, vectors_id)
            for name, seed, fit_rows, score_rows in tasks)
    else:
        results = [_timed_fit_and_score(factories[name], data, train, *task) for name, *task in tasks]
    quality = {name: {seed: np.full((len(data), len(data.workers)), np.nan) for seed in seeds} for name in names}
    seconds = dict.fromkeys(names, 0.0)
    for (name, seed, _, score_rows), (predicted, took) in zip(tasks, results):
        quality[name][seed][slice(None) if score_rows is None else score_rows] = predicted
        seconds[name] += took
    return quality, seconds


def _fit_and_score(factory, data: RoutingData, train: RoutingData | None, seed: int, fit_rows, score_rows) -> np.ndarray:
    fit_on = train if fit_rows is None else data.subset(fit_rows)
    scored = data if score_rows is None else data.subset(score_rows)
    return _build(factory, seed).fit(fit_on).predict_quality(scored)


def _timed_fit_and_score(factory, data, train, seed, fit_rows, score_rows) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    return _fit_and_score(factory, data, train, seed, fit_rows, score_rows), time.perf_counter() - start


def _fit_and_score_in_worker(factory, data, train, seed, fit_rows, score_rows, vectors_id) -> tuple[np.ndarray, float]:
    if vectors_id is not None:
        for part in (data, train):
            if part is not None and part.embeddings is not None:
                remember_vectors(vectors_id, part.queries, part.embeddings)
    return _timed_fit_and_score(factory, data, train, seed, fit_rows, score_rows)


# Below this many queries a replay fits in this process: starting workers (each imports torch and
# sklearn: 8 s for the first router of the 14k benchmark) costs more than a second core saves.
PARALLEL_MIN_QUERIES = 3000
NOTHING_TO_FIT = ("random", "oracle")  # and single:<worker>: faster in this process than a worker's start
MAX_JOBS = 8  # each worker holds its own copy of the table and of torch, sklearn and transformers


def default_jobs(n_queries: int) -> int:
    """Worker processes for a table of n queries: the CPUs this process may use, up to MAX_JOBS."""
    if n_queries < PARALLEL_MIN_QUERIES:
        return 1
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                      MAX_JOBS))


class SharedPredictions:
    """One run's held-out predictions per (router, seed), computed once: an ensemble named in
    models.registry.ENSEMBLES is the mean of its members' predictions, the very fits its own
    EnsembleRouter would make (each member built with the same seed, on the same folds), so the
    members are fitted once for their own rows and the ensemble's; a router whose predictions are
    another's on this table (models.registry.same_predictions) reuses them. Routers named in
    `parallel` (the registry's learned routers) are shared and fitted in worker processes; custom
    factories and the routers with nothing to fit run in this process as given.

    `prefetch(names, seeds)` fits every shared router those names need in one pool of tasks,
    dearest first (held_out_qualities_of, costs from models.registry.FIT_COST); `take_seconds(name)`
    then gives the pool time charged to `name`: the task seconds of the fits first read for it,
    divided by the workers that ran them (its share of the pool's wall time)."""

    def __init__(self, data: RoutingData, k: int, train: RoutingData | None, factories: dict[str, RouterFactory],
                 ensembles: dict[str, tuple[str, ...]], n_jobs: int = 1, parallel: set[str] = frozenset(),
                 vectors_id: str | None = None, cost: dict[str, float] | None = None):
        self.data, self.k, self.train = data, k, train
        self.factories, self.ensembles = factories, ensembles
        self.n_jobs, self.parallel, self.vectors_id = n_jobs, parallel, vectors_id
        self.cost = cost or {}
        self._responses_logged = data.responses is not None or (train is not None and train.responses is not None)
        self._done: dict[tuple[str, int], np.ndarray] = {}
        self._pooled_seconds: dict[str, float] = {}  # fitted by prefetch, not yet charged to a router
        self._charged = 0.0

    def _factory(self, name: str):
        return self.factories.get(name) or (lambda s, _n=name: make_router(_n, s))

    def _fitted_for(self, name: str) -> list[str]:
        """The shared routers whose own fits give `name`'s predictions (itself, its twin, its members)."""
        twin = same_predictions(name, self._responses_logged) if name in self.parallel else None
        if twin in self.parallel:
            return self._fitted_for(twin)
        if name in self.ensembles:
            return [base for member in self.ensembles[name] for base in self._fitted_for(member)]
        return [name] if name in self.parallel else []

    def prefetch(self, names: Sequence[str], seeds: Sequence[int]) -> None:
        todo = list(dict.fromkeys(base for name in names for base in self._fitted_for(name)
                                  if any((base, seed) not in self._done for seed in seeds)))
        if not todo:
            return
        fitted, seconds = held_out_qualities_of({name: self._factory(name) for name in todo}, self.data, self.k,
                                                seeds, self.train, self.n_jobs, self.vectors_id, self.cost)
        workers = max(1, min(self.n_jobs, len(todo) * len(seeds) * (1 if self.train is not None else self.k)))
        for name in todo:
            self._done.update({(name, seed): q for seed, q in fitted[name].items()})
            self._pooled_seconds[name] = seconds[name] / workers

    def take_seconds(self) -> float:
        """Pool seconds charged to the routers read since the last call (see the class docstring)."""
        taken, self._charged = self._charged, 0.0
        return taken

    def __call__(self, name: str, seeds: Sequence[int]) -> dict[int, np.ndarray]:
        self._charged += self._pooled_seconds.pop(name, 0.0)
        todo = [seed for seed in seeds if (name, seed) not in self._done]
        twin = same_predictions(name, self._responses_logged) if name in self.parallel else None
        if twin in self.parallel:
            if todo:
                self._done.update({(name, seed): q for seed, q in self(twin, todo).items()})
            else:
                self._charged += self._pooled_seconds.pop(twin, 0.0)
        elif name in self.ensembles:
            members = [self(member, seeds) for member in self.ensembles[name]]
            self._done.update({(name, seed): np.mean([m[seed] for m in members], axis=0) for seed in todo})
        elif todo:
            n_jobs = self.n_jobs if name in self.parallel else 1
            fitted = held_out_qualities(self._factory(name), self.data, self.k, todo, self.train, n_jobs,
                                        self.vectors_id)
            self._done.update({(name, seed): q for seed, q in fitted.items()})
        return {seed: self._done[(name, seed)] for seed in seeds}


def evaluate_router(name: str, factory: RouterFactory, data: RoutingData, k: int = 5,
                    seeds: Sequence[int] = (0, 1, 2), n_boot: int = 1000,
                    train: RoutingData | None = None, timings: dict | None = None,
                    predict: Callable[[Sequence[int]], dict[int, np.ndarray]] | None = None) -> tuple[dict, pd.DataFrame]:
    """The leaderboard row (means over seeds, the spread of APGR and AIQ across seeds, bootstrap
    intervals from the first seed) and the first seed's curve of `factory` on `data`: fitted on `train`
    when given (fixed split), else cross-fitted on `data` with k folds. `predict(seeds)`, when given,
    supplies those predictions instead ({seed: quality}: run_replay_benchmark's shared ones). `timings`, when given,
    receives the seconds spent fitting and scoring, sweeping the knob and bootstrapping
    (benchmarks/replay_scale.py reads them)."""
    best, target = single_worker_reference(data)
    runs, first = [], None
    clock = {"fit_score_s": 0.0, "sweep_s": 0.0, "bootstrap_s": 0.0}
    predict = predict or (lambda todo: held_out_qualities(factory, data, k, todo, train))
    start = time.perf_counter()
    qualities = predict(list(seeds))
    clock["fit_score_s"] += time.perf_counter() - start
    for seed in seeds:
        quality = qualities[seed]
        start = time.perf_counter()
        router = _build(factory, seed)
        ops = operating_points(router, quality, data)
        runs.append(curve_summary(router, ops, data, quality, best, target))
        clock["sweep_s"] += time.perf_counter() - start
        if first is None:
            first = (router, ops, quality)
    router, ops, quality = first
    row = {"router": name, **pd.DataFrame(runs).mean().to_dict()}
    for key in ("aiq", "apgr"):
        if key in runs[0]:
            row[f"{key}_seed_std"] = float(np.std([r[key] for r in runs]))
    if n_boot:
        start = time.perf_counter()
        row.update(bootstrap_intervals(router, ops, data, quality, n_boot, seeds[0]))
        clock["bootstrap_s"] += time.perf_counter() - start
    if timings is not None:
        timings.update(clock)
    row["seeds"] = len(seeds)
    curve = sweep(router, quality, data, ops.knobs).assign(router=name)
    return row, curve


# ---------------------------------------------------------------- the benchmark


def to_routing_data(frame: pd.DataFrame, price_book: PriceBook,
                    embed: Callable[[list[str]], np.ndarray] | None = None) -> RoutingData:
    """n queries × w workers: logged scores, USD costs derived from tokens under `price_book`
    (PriceBook.cost of each row's tokens), responses when logged, embeddings when `embed` is given."""
    frame = validate_logged_outcomes(frame)
    workers = worker_order(frame)
    unpriced = [w for w in workers if w not in price_book.prices]
    if unpriced:
        raise InputError(f"price book {price_book.version}", f"prices.{unpriced[0]}",
                         "no price for a worker of the logged outcomes")
    costs = [price_book.cost(w, p, c) for w, p, c in
             zip(frame["worker"], frame["prompt_tokens"], frame["completion_tokens"])]
    frame = frame.assign(cost_usd=costs)
    query_ids = list(dict.fromkeys(frame["query_id"]))
    values = ["score", "cost_usd"] + (["response"] if "response" in frame.columns else [])
    wide = frame.pivot(index="query_id", columns="worker", values=values).reindex(index=query_ids)
    queries = frame.drop_duplicates("query_id").set_index("query_id")["query"].reindex(query_ids).tolist()
    responses = None
    if "response" in frame.columns:
        responses = wide["response"][workers].astype(str).values.tolist()
    embeddings = None
    if embed is not None:
        embeddings = np.asarray(embed(queries), dtype=np.float32)
        if embeddings.ndim != 2 or embeddings.shape[0] != len(queries):
            raise RouteropsError(f"embed returned shape {embeddings.shape}, expected ({len(queries)}, d)")
    return RoutingData(
        query_ids=query_ids, queries=queries, workers=workers,
        scores=wide["score"][workers].to_numpy(dtype=float), costs=wide["cost_usd"][workers].to_numpy(dtype=float),
        embeddings=embeddings, responses=responses,
    )


def routing_data_from_table(table: str | Path | pd.DataFrame, price_book: PriceBook | str | Path,
                            encoder=None) -> RoutingData:
    """Logged outcomes (a long table or its path) → RoutingData priced under `price_book`, with cached
    query embeddings and, when the table has a `response` column, the responses (for cascades)."""
    df = load_logged_outcomes(table) if isinstance(table, (str, Path)) else table
    book = price_book if isinstance(price_book, PriceBook) else load_price_book(price_book)
    encoder = encoder or default_encoder()
    data = to_routing_data(df, book, embed=encoder.encode)
    if data.embeddings is None:
        data.embeddings = encoder.encode(data.queries)
    if data.responses is None and "response" in df.columns:
        wide = df.pivot_table(index="query_id", columns="worker", values="response", aggfunc="first")
        wide = wide.reindex(index=data.query_ids, columns=data.workers)
        data.responses = wide.fillna("").astype(str).values.tolist()
    return data


def split_table(frame: pd.DataFrame, column: str, values: Sequence[str], source: str = "table") -> pd.DataFrame:
    """The rows of a logged-outcome table whose `column` is one of `values` (a clear error otherwise)."""
    if column not in frame.columns:
        raise InputError(source, column, f"no split column {column!r}; columns: {sorted(frame.columns)}")
    rows = frame[frame[column].astype(str).isin(list(values))]
    if rows.empty:
        raise InputError(source, column, f"no row with {column} in {list(values)}; "
                         f"found {sorted(frame[column].astype(str).unique())}")
    return rows.reset_index(drop=True)


def check_disjoint(train: RoutingData, data: RoutingData) -> None:
    """A router is never judged on a query it trained on: refuse overlapping query ids or texts."""
    seen_ids, seen_texts = set(train.query_ids), set(train.queries)
    shared = [q for q, text in zip(data.query_ids, data.queries) if q in seen_ids or text in seen_texts]
    if shared:
        raise InputError("training table", "query_id", f"{len(shared)} scored queries are also training "
                         f"queries, e.g. {shared[0]!r}: the numbers would not be out of sample")


def align_workers(train: RoutingData, data: RoutingData) -> RoutingData:
    """`train` with its worker columns in `data`'s order: two splits of one table may list the same
    workers in another order (the wide view follows each table's first rows). Other workers: refused."""
    if list(train.workers) == list(data.workers):
        return train
    if sorted(train.workers) != sorted(data.workers):
        only_train = sorted(set(train.workers) - set(data.workers))
        only_scored = sorted(set(data.workers) - set(train.workers))
        raise InputError("training table", "worker", f"trains on workers {sorted(train.workers)}, scores "
                         f"{sorted(data.workers)} (only in training: {only_train}; only scored: {only_scored}): "
                         "both must log the same workers")
    order = [list(train.workers).index(w) for w in data.workers]
    return RoutingData(query_ids=list(train.query_ids), queries=list(train.queries), workers=list(data.workers),
                       scores=train.scores[:, order], costs=train.costs[:, order], embeddings=train.embeddings,
                       worker_attributes=train.worker_attributes,
                       responses=None if train.responses is None else [[row[j] for j in order] for row in train.responses])


def _as_routing_data(table, book: PriceBook | None, encoder) -> RoutingData:
    return table if isinstance(table, RoutingData) else routing_data_from_table(table, book, encoder)


def run_replay_benchmark(table: str | Path | pd.DataFrame | RoutingData, price_book: PriceBook | str | Path | None,
                         routers: Sequence[str], k: int = 5, seeds: Sequence[int] = (0, 1, 2),
                         factories: dict[str, RouterFactory] | None = None, encoder=None, n_boot: int = 1000,
                         include_singles: bool = True, progress: bool = True,
                         single_seed: Sequence[str] = ("oracle", "prompted_llm"),
                         train: str | Path | pd.DataFrame | RoutingData | None = None,
                         protocol: str | None = None, n_jobs: int | None = None) -> pd.DataFrame:
    """Leaderboard of `routers` (registry names, or keys of `factories`) on one logged-outcome table.

    Protocol: with `train` (another table, or the train split of the same one), every router is fitted
    on `train` alone and scored on `table` (a fixed split; overlapping queries are refused); without
    it, routers are cross-fitted on `table` (k folds). The `protocol` column and attr say which.

    One row per router (and per single worker): AIQ, APGR, CPT50, CPT80 (two-worker tables), best
    accuracy, USD per query at 95% of the strong worker's accuracy, gain over and cost saved against
    the best single worker, with 95% bootstrap intervals for AIQ and APGR. The sweep curves of the
    first seed are in `.attrs["curves"]`. `table` may already be RoutingData (then price_book is unused).
    Routers named in `single_seed` are deterministic given their folds (or slow: an LLM per query)
    and run with the first seed only. `n_jobs`: worker processes for the registry routers' fits
    (None: default_jobs(n)); routers from `factories` always fit in this process.
    """
    timings: dict = {"embedding_s": 0.0, "routers": {}}
    book = None if price_book is None or isinstance(price_book, PriceBook) else load_price_book(price_book)
    book = price_book if isinstance(price_book, PriceBook) else book
    start = time.perf_counter()
    data = _as_routing_data(table, book, encoder)
    train_data = None if train is None else _as_routing_data(train, book, encoder)
    timings["embedding_s"] = time.perf_counter() - start
    if train_data is not None:
        train_data = align_workers(train_data, data)
        check_disjoint(train_data, data)
    protocol = protocol or (f"cross-fit k={k}" if train_data is None else "fixed split: fit on train, scored here")
    custom = factories or {}
    factories = {**ROUTER_FACTORIES, **custom}
    n_jobs = default_jobs(len(data) + (0 if train_data is None else len(train_data))) if n_jobs is None else n_jobs
    embedded_here = not isinstance(table, RoutingData)
    shared = SharedPredictions(data, k, train_data, factories,
                               {name: members for name, members in ENSEMBLES.items() if name not in custom},
                               n_jobs=n_jobs, parallel=set(ROUTER_FACTORIES) - set(custom) - set(NOTHING_TO_FIT),
                               vectors_id=(encoder or default_encoder()).cache_id if embedded_here else None,
                               cost=FIT_COST)
    names = ([f"single:{w}" for w in data.workers] if include_singles else []) + list(routers)
    start = time.perf_counter()  # every learned router's fits in one pool, dearest first
    shared.prefetch([name for name in routers if name not in single_seed], seeds)
    shared.prefetch([name for name in routers if name in single_seed], seeds[:1])
    timings["pooled_fits_s"] = time.perf_counter() - start
    rows, curves = [], []
    for name in tqdm(names, desc="routers", disable=not progress):
        factory = factories.get(name) or (lambda seed, _n=name: make_router(_n, seed))
        single = name.startswith("single:")
        stochastic = not (single or name in single_seed)
        # A single worker has one operating point: no curve whose area a resample could vary.
        timings["routers"][name] = {}
        row, curve = evaluate_router(name, factory, data, k=k, seeds=seeds if stochastic else seeds[:1],
                                     n_boot=0 if single else n_boot, train=train_data,
                                     timings=timings["routers"][name], predict=functools.partial(shared, name))
        timings["routers"][name]["fit_score_s"] += shared.take_seconds()
        rows.append({**row, "protocol": protocol})
        curves.append(curve)
        log.info("%s: %s", name, ", ".join(f"{key} {value:.1f}" for key, value in timings["routers"][name].items()))
    board = pd.DataFrame(rows).sort_values("aiq", ascending=False, kind="mergesort").reset_index(drop=True)
    board.attrs["curves"] = pd.concat(curves, ignore_index=True)
    board.attrs["n_queries"] = len(data)
    board.attrs["workers"] = list(data.workers)
    board.attrs["price_book"] = None if book is None else book.version
    board.attrs["k"], board.attrs["seeds"] = k, list(seeds)
    board.attrs["protocol"] = protocol
    board.attrs["n_train_queries"] = None if train_data is None else len(train_data)
    # seconds: embedding the table, the pooled fits (wall), then per router (evaluate_router; a pooled
    # router's fit_score_s is its share of the pool: its task seconds / workers)
    board.attrs["timings"] = timings
    return board


# ---------------------------------------------------------------- MTRouter's ablations on a table


def replay_ablations(data, k: int = 5, seeds: Sequence[int] = (0,), base: MTRouterConfig | None = None,
                     names: Sequence[str] = SINGLE_TURN_ABLATIONS, history_encoder=None) -> pd.DataFrame:
    """MTRouter's single-turn ablations (models/mtrouter/ablations.py) on a logged-outcome table,
    cross-fitted (k folds); APGR on two-worker tables."""
    def fit_and_evaluate(name: str, cfg: MTRouterConfig) -> dict[str, float]:
        encoder = history_encoder or build_history_encoder(cfg)
        runs = []
        for seed in seeds:
            quality = cross_fit(data, lambda s: MTRouterRouter(cfg, encoder, seed=s), k=k, seed=seed)
            runs.append(two_worker_metrics(quality, data) if len(data.workers) == 2 else {})
        return {key: float(np.mean([r[key] for r in runs])) for key in (runs[0] if runs else {})}

    return run_ablations(fit_and_evaluate, base, names)
