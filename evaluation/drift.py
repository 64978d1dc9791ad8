"""Closing the loop: is the champion still as good as its gate said, and retraining from its own traffic.

Drift check. The gate promoted the champion on an estimate of its quality (`promotion.candidate_score`
on its registered version). Live, its graded traffic gives another: the SNIPS estimate of its greedy
rule on the decisions it served (routerops/ope.py; with ε-exploration the explored calls are
re-weighted away). When |gate − live| exceeds `bound` (with at least `min_graded` graded decisions)
the champion is in breach. The check remembers, per model, whether it was already in breach for
that version (a JSON state file), so the caller emits one event per breach: the next breach
is a new one only after a check found the gap back within the bound, or after another version
became champion (flows/ope_loop.py emits `routerops.champion.drift`).

Retrain from the log. The graded decisions *created and graded before the cut-off* (the drift event's
time) become logged-outcome rows (query, the worker that answered, its grade and USD) with the
propensity they were logged under, joined to an optional base table; the champion's router
configuration is refitted on them (a copy of its unfitted settings: same family, features and
encoder reference). Each worker's outcome model is fitted on the queries that worker answered;
because the logging policy chose by the query alone, that selection is ignorable given the query
(no re-weighting is needed for a consistent per-worker model; the propensities are kept in the
table for learners that weight by them). A fifth of the rows (by decision-id hash) are held out and
the new version is judged on them against the champion by the off-policy gate
(evaluation/ope.py `promote_off_policy`); nothing graded at or after the cut-off is read at all.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from evaluation.ope import (CHAMPION_GREEDY, before, promote_off_policy, read_log, reads_only_embeddings,
                            stored_embeddings, traffic)
from models.base import RoutingData
from routerops import schema
from routerops.errors import InputError
from routerops.ope import OPEConfig, estimate_policies, one_hot

DRIFT_EVENT = "routerops.champion.drift"
GATE_SCORE_TAG = "promotion.candidate_score"
TRAINING_COLUMNS = ("dataset", "query_id", "query", "worker", "score", "cost_usd", "propensity", "decision_id",
                    "created_at", "graded_at")


@dataclass(frozen=True)
class DriftConfig:
    bound: float = 0.1  # |gate estimate − live estimate| of the champion's accuracy above this: a breach
    min_graded: int = 30  # fewer graded decisions of the champion version: no verdict
    n_boot: int = 500
    state_file: str = "retrain/drift_state.json"  # which models are in breach (once per breach)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise InputError("drift config", "bound", f"expected a number > 0, got {self.bound!r}")


def gate_estimate(name: str, version: str) -> float:
    """The quality the gate credited this version with when it was promoted."""
    import mlflow

    tags = mlflow.MlflowClient().get_model_version(name, version).tags
    if GATE_SCORE_TAG not in tags:
        raise InputError(f"{name} v{version}", GATE_SCORE_TAG, "the champion carries no gate estimate to compare with")
    return float(tags[GATE_SCORE_TAG])


def live_estimate(frame: pd.DataFrame, n_boot: int) -> dict[str, float]:
    """SNIPS estimate of the champion's greedy rule on its graded traffic, with its interval."""
    logged = traffic(frame)
    target = one_hot(logged.greedy(logged.logged_quality), len(logged.workers))
    result = estimate_policies(logged.log, {CHAMPION_GREEDY: target},
                               OPEConfig(estimators=("snips",), n_boot=n_boot, min_support=0.0))
    row = next(r for r in result.rows if r["metric"] == "accuracy")
    return {"live": row["value"], "live_low": row["ci_low"], "live_high": row["ci_high"], "ess": row["ess"],
            "graded": len(frame)}


def check_drift(name: str, log_source: str | Path, cfg: DriftConfig, now: str) -> dict[str, Any]:
    """One drift check of the champion of `name` at time `now` (ISO-8601 UTC; also the retrain's
    cut-off). Returns the verdict; `emit` is True only on the check that opens a breach."""
    from evaluation.registry import champion_version

    version = champion_version(name)
    if version is None:
        raise InputError(name, "champion", "no champion to check")
    frame = read_log(log_source, name)
    frame = frame[(frame.router_version.astype(str) == version) & before(frame, now)].reset_index(drop=True)
    verdict: dict[str, Any] = {"model": name, "version": version, "checked_at": now, "cutoff": now,
                               "log": str(log_source), "bound": cfg.bound, "graded": len(frame)}
    state_path = Path(cfg.state_file)
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    previous = state.get(name, {})
    if len(frame) < cfg.min_graded:
        return {**verdict, "breach": False, "emit": False,
                "reason": f"{len(frame)} graded decisions of v{version} < min_graded {cfg.min_graded}: no verdict"}
    gate = gate_estimate(name, version)
    verdict.update(gate=gate, **live_estimate(frame, cfg.n_boot))
    verdict["gap"] = gate - verdict["live"]
    breach = abs(verdict["gap"]) > cfg.bound
    open_breach = bool(previous.get("breach")) and previous.get("version") == version
    verdict.update(breach=breach, emit=breach and not open_breach,
                   reason=(f"live {verdict['live']:.3f} vs gate {gate:.3f}: gap {verdict['gap']:+.3f} "
                           f"{'exceeds' if breach else 'within'} ±{cfg.bound:g}"))
    state[name] = {"breach": breach, "version": version,
                   "since": previous.get("since") if open_breach and breach else (now if breach else None)}
    schema.write_json_atomic(state, state_path)
    return verdict


# ---------------------------------------------------------------- retraining from the log


def held_out(decision_id: str, share: int = 5) -> bool:
    """One decision in `share` (by a hash of its id: stable across runs) is kept for the gate."""
    return int(hashlib.sha256(decision_id.encode()).hexdigest()[:8], 16) % share == 0


def training_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Graded decisions as logged-outcome rows: the worker that answered, its grade, USD and propensity."""
    table = frame.assign(dataset="gateway")
    for column in ("graded_at", "query"):
        if column not in table.columns:
            table[column] = ""
    return table[list(TRAINING_COLUMNS) + (["embedding"] if "embedding" in table.columns else [])]


def routing_data(table: pd.DataFrame, served: Any, base: pd.DataFrame | None = None) -> RoutingData:
    """(queries × the champion's workers): each logged row fills its (query, worker) cell; cells never
    observed stay NaN (the routers' outcome models skip them); costs: the logged USD where observed,
    else the worker's expected USD per call in the champion's bundle."""
    workers = list(served.workers)
    rows = table if base is None else pd.concat([base.assign(propensity=1.0), table], ignore_index=True)
    rows = rows[rows.worker.isin(workers)]
    key = rows["query_id"].astype(str)
    first = rows.assign(key=key).drop_duplicates("key")
    ids = first.key.tolist()
    index = {q: i for i, q in enumerate(ids)}
    scores, costs = np.full((len(ids), len(workers)), np.nan), np.tile(served.bundle.cost_vector(), (len(ids), 1))
    for q, w, s, c in zip(key, rows.worker, rows.score, rows.get("cost_usd", pd.Series(np.nan, index=rows.index))):
        scores[index[q], workers.index(w)] = float(s)
        if c == c:
            costs[index[q], workers.index(w)] = float(c)
    texts = first["query"].fillna("").astype(str).tolist()
    embeddings = stored_embeddings(first) if "embedding" in first.columns else None
    if not all(t.strip() for t in texts):
        if embeddings is None or not reads_only_embeddings(served):
            raise InputError("decision log", "query", "cannot retrain from this log: the gateway kept no query texts "
                                                      "(--no-log-texts) and this router reads more than the stored "
                                                      "query embedding; serve with --log-texts to retrain it")
    return RoutingData(ids, texts, workers, scores, costs, embeddings=embeddings)


def retrain_from_log(name: str, log_source: str | Path, cutoff: str, out_dir: str | Path, gate_cfg: Any,
                     base_table: str | Path | None = None, min_rows: int = 20) -> dict[str, Any]:
    """Refit the champion's router on its graded traffic before `cutoff`, register it, run the gate."""
    from evaluation.registry import champion_version, load_registered, register
    from evaluation.serving.single_turn import ServedRouter

    champ_v = champion_version(name)
    if champ_v is None:
        raise InputError(name, "champion", "no champion to retrain")
    champion = load_registered(name, champ_v)
    frame = read_log(log_source, name, graded_before=cutoff)
    gate_rows = frame.decision_id.map(held_out)
    train = frame[~gate_rows]
    if len(train) < min_rows:
        raise InputError(log_source, "score", f"{len(train)} graded decisions before {cutoff}: fewer than {min_rows}")
    table = training_table(train)
    base = None if base_table is None else (pd.read_parquet(base_table) if str(base_table).endswith(".parquet")
                                            else pd.read_csv(base_table))
    data = routing_data(table, champion, base)
    router = copy.deepcopy(champion.bundle.router).fit(data)
    served = ServedRouter(dataclasses.replace(
        champion.bundle, router=router,
        meta={**champion.bundle.meta, "data.log_cutoff": cutoff, "data.log_rows": str(len(train)),
              "data.retrained_from": f"{name} v{champ_v}"}), champion.encoder)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table_path = out / "training_table.parquet"
    partial = table_path.with_suffix(".parquet.partial")
    table.to_parquet(partial, index=False)
    partial.replace(table_path)
    registered = register(served, include_code=False, training_inputs=[table_path],
                          data_hashes={"log_cutoff": cutoff, "log_rows": str(len(train))})
    decision = promote_off_policy(name, registered.version, log_source, gate_cfg, graded_before=cutoff,
                                  exclude_ids=set(train.decision_id))
    report = {"model": name, "retrained_from": champ_v, "version": registered.version, "cutoff": cutoff,
              "training_rows": len(train), "gate_rows": int(gate_rows.sum()),
              "latest_graded_at": str(train.graded_at.max()), "latest_created_at": str(train.created_at.max()),
              "training_table": str(table_path), "decision": decision.to_dict()}
    schema.write_json_atomic(report, out / "retrain_from_log.json")
    return report
