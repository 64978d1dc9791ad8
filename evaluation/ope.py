"""Off-policy evaluation of registered routers on the gateway's own decision log (routerops/ope.py's
estimators; `routerops ope`; the promotion gate's off-policy judge).

The log (gateway/store.py `read_decisions`, or a table exported from it) holds per request the
worker the champion chose, its propensity and, in `explanation`, every candidate worker's logged
quality estimate, worst-case cost, affordability, the request's λ and the exploration ε. From that:

- the logging distribution μ(·|x_i) is rebuilt exactly (gateway/routing.py's ε-greedy over the
  affordable workers around the highest utility) and checked against the logged propensity;
- a target router's choice is the gateway's own rule applied to *its* quality estimates under the
  same budget (the same affordable set, worst-case costs and λ as the request had), so the
  estimate is of the router as the gateway would have served it;
- the action is the router's choice (`chosen`); a request answered by a fallback worker keeps the
  outcome of the chosen action's attempt (what choosing it led to), as serving it would again.

The target router reads the logged query text, or, in a log kept without texts (the gateway's
`--no-log-texts`), the stored query embedding when the router reads nothing else (privacy: README).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from routerops.errors import InputError
from routerops.ope import BanditLog, OPEConfig, OPEResult, epsilon_greedy, estimate_policies, fit_direct_model, one_hot

LOGGING, CHAMPION_GREEDY = "logging policy (as served)", "champion (greedy)"
DIRECT_MODELS = ("router", "fitted")


@dataclass
class LoggedTraffic:
    """A graded decision log as bandit feedback plus what a target router needs to replay the rule."""

    frame: pd.DataFrame  # the graded rows, in log order
    log: BanditLog
    worst: np.ndarray  # (n, K) worst-case USD of each worker for that request
    affordable: np.ndarray  # (n, K) bool
    cost_weight: np.ndarray  # (n,) λ of the request
    logged_quality: np.ndarray  # (n, K) the champion's q̂ (NaN → 0 where it gave none)
    epsilon: np.ndarray  # (n,)

    @property
    def workers(self) -> list[str]:
        return self.log.workers

    def greedy(self, quality: np.ndarray) -> np.ndarray:
        """The gateway's rule on `quality`: argmax q̂ − λ·worst over the affordable workers, exact
        ties to the cheaper (gateway/routing.py `decide`)."""
        rank = np.argsort(np.argsort(self.worst, axis=1, kind="stable"), axis=1, kind="stable")
        utility = quality - self.cost_weight[:, None] * self.worst - 1e-9 * rank
        return np.argmax(np.where(self.affordable, utility, -np.inf), axis=1)


def read_log(source: str | Path, router: str | None = None, graded_before: str | None = None) -> pd.DataFrame:
    """The graded decisions of a log: an SQLAlchemy URL (the gateway's database) or an exported
    table (.parquet / .csv with the decision-log columns). `router`: only that served name's rows;
    `graded_before`: only rows created *and* graded before this ISO-8601 UTC time."""
    from routerops.decision_log import read_decisions

    text = str(source)
    if "://" in text:
        frame = read_decisions(text, graded_only=True)
    else:
        path = Path(text)
        if not path.is_file():
            raise InputError(path, "log", "no such file: give the gateway's database URL or an exported table")
        try:
            frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path, keep_default_na=False)
        except (ValueError, OSError, UnicodeDecodeError) as exc:  # pandas/pyarrow parse errors are ValueErrors
            raise InputError(path, "log", f"not a decision table ({type(exc).__name__}): export one with "
                                          "gateway.store.read_decisions, or give the database URL") from None
        frame["score"] = pd.to_numeric(frame.get("score"), errors="coerce")
        frame = frame[frame.score.notna() & (frame.get("worker", "x") != "")].reset_index(drop=True)
    missing = [c for c in ("decision_id", "router", "chosen", "propensity", "explanation", "score", "cost_usd")
               if c not in frame.columns]
    if missing:
        raise InputError(source, missing[0], "a decision-log column is missing (routerops/decision_log.py DECISION_COLUMNS)")
    if router is not None:
        frame = frame[frame.router == router]
    if graded_before is not None:
        frame = frame[before(frame, graded_before)]
    if frame.empty:
        raise InputError(source, "score", "no graded decisions" + (f" of {router!r}" if router else "")
                         + " to estimate from: post grades to /v1/decisions/{id}/feedback first")
    return frame.reset_index(drop=True)


def before(frame: pd.DataFrame, cutoff: str) -> pd.Series:
    """Rows created *and* graded before `cutoff` (ISO-8601, UTC). A row without a grading time cannot be
    shown to predate the cut-off, so it is left out."""
    limit = pd.Timestamp(cutoff)
    limit = limit.tz_localize("UTC") if limit.tzinfo is None else limit.tz_convert("UTC")
    created = pd.to_datetime(frame["created_at"], utc=True, errors="coerce", format="ISO8601")
    graded = pd.to_datetime(frame["graded_at"], utc=True, errors="coerce", format="ISO8601") \
        if "graded_at" in frame.columns else pd.Series(pd.NaT, index=frame.index)
    return (created < limit) & (graded < limit)


def traffic(frame: pd.DataFrame) -> LoggedTraffic:
    """The log as bandit feedback: μ rebuilt from each explanation and checked against the propensity."""
    explanations = [e if isinstance(e, dict) else json.loads(e) for e in frame.explanation]
    episodes = [i for i, e in enumerate(explanations) if "candidates" not in e or "epsilon" not in e]
    if episodes:
        raise InputError("decision log", "explanation", f"decision {frame.decision_id.iloc[episodes[0]]} is not one "
                                                        "routed call (an orchestrator episode?): off-policy evaluation "
                                                        "reads single-turn and MTRouter decisions (--router)")
    workers = [c["worker"] for c in explanations[0]["candidates"]]
    n, k = len(frame), len(workers)
    quality, worst = np.zeros((n, k)), np.zeros((n, k))
    affordable = np.zeros((n, k), dtype=bool)
    utility = np.full((n, k), -np.inf)
    eps, lam, action = np.zeros(n), np.zeros(n), np.zeros(n, dtype=int)
    for i, e in enumerate(explanations):
        if [c["worker"] for c in e["candidates"]] != workers:
            raise InputError("decision log", "explanation.candidates",
                             f"decision {frame.decision_id.iloc[i]} routes over other workers than the first row "
                             f"({workers}): evaluate one served router's log at a time (--router)")
        for j, c in enumerate(e["candidates"]):
            q = c.get("quality")
            quality[i, j] = q if q is not None and np.isfinite(q) else 0.0
            worst[i, j], affordable[i, j] = float(c["worst_cost_usd"]), bool(c["affordable"])
            if c.get("utility") is not None:
                utility[i, j] = float(c["utility"])
        eps[i], lam[i] = float(e.get("epsilon", 0.0)), float(e.get("cost_weight", 0.0))
        action[i] = workers.index(e["chosen"])
    mu = epsilon_greedy(np.argmax(utility, axis=1), affordable, 0.0)
    mu = (1 - eps[:, None]) * mu + eps[:, None] * affordable / affordable.sum(axis=1, keepdims=True)
    logged = frame.propensity.to_numpy(dtype=float)
    rebuilt = mu[np.arange(n), action]
    bad = np.flatnonzero(np.abs(rebuilt - logged) > 1e-6)
    if len(bad):
        raise InputError("decision log", "propensity",
                         f"decision {frame.decision_id.iloc[bad[0]]}: logged propensity {logged[bad[0]]:.6g} is not "
                         f"the ε-greedy rule's {rebuilt[bad[0]]:.6g}; the log was not written by this gateway's rule")
    log = BanditLog(workers, action, mu, frame.score.to_numpy(dtype=float), frame.cost_usd.to_numpy(dtype=float))
    return LoggedTraffic(frame, log, worst, affordable, lam, quality, eps)


def router_quality(served: Any, logged: LoggedTraffic, label: str) -> np.ndarray:
    """(n, K) the router's q̂ on the logged requests, in the log's worker order. It reads the
    logged query texts, or the stored embeddings of a log kept without texts when the router
    reads only the embedding (`reads_text_only_via_embedding`); otherwise it says it cannot."""
    if not hasattr(served, "routing_data"):
        raise InputError(label, "family", f"{type(served).__name__} is not a single-turn router: only those are "
                                          "estimated off-policy here (MTRouter's turn histories are not replayed yet)")
    missing = [w for w in served.workers if w not in logged.workers]
    if missing:
        raise InputError(label, "workers", f"routes to {missing}, which the logged champion never could call: "
                                           "no logged outcome can support it")
    frame = logged.frame
    texts = frame["query"].fillna("").astype(str).tolist() if "query" in frame.columns else [""] * len(frame)
    embeddings = stored_embeddings(frame)
    if not all(t.strip() for t in texts):
        if embeddings is None or not reads_only_embeddings(served):
            why = ("its features include the query text" if embeddings is not None
                   else "the log stores neither query texts nor embeddings")
            raise InputError(label, "query", f"cannot be evaluated on this log: the gateway kept no query texts "
                                             f"(--no-log-texts) and {why}; serve with --log-texts, or evaluate a "
                                             "router that reads only the query embedding")
        texts = [t if t.strip() else f"<query {i} not logged>" for i, t in enumerate(texts)]
    own = served.quality(served.routing_data(texts, embeddings))
    out = np.zeros((len(frame), len(logged.workers)))
    for j, w in enumerate(served.workers):
        out[:, logged.workers.index(w)] = own[:, j]
    # A worker the router does not route to is never its choice.
    absent = [j for j, w in enumerate(logged.workers) if w not in served.workers]
    out[:, absent] = -np.inf
    return out


def stored_embeddings(frame: pd.DataFrame) -> np.ndarray | None:
    """The query embeddings the gateway stored (`embedding` column, JSON lists), or None."""
    if "embedding" not in frame.columns:
        return None
    values = frame["embedding"].tolist()
    if not all(isinstance(v, (str, bytes, list, np.ndarray)) and len(v) for v in values):
        return None
    return np.asarray([json.loads(v) if isinstance(v, (str, bytes)) else v for v in values], dtype=np.float32)


def reads_only_embeddings(served: Any) -> bool:
    """True when the router's quality depends on the query only through its embedding (kNN; MF, MLP
    and logistic without surface statistics or TF-IDF): then a stored embedding replaces the text."""
    from models.baselines import KNNRouter

    router = getattr(getattr(served, "bundle", None), "router", None)
    if router is None or getattr(served.bundle, "embedding", None) is None or getattr(router, "use_tfidf", False):
        return False
    featurizer = getattr(router, "featurizer", None)
    if featurizer is not None:
        return bool(featurizer.use_embedding) and not featurizer.use_surface
    return isinstance(router, KNNRouter)


def policies(logged: LoggedTraffic, routers: dict[str, Any], dm: str = "router",
             cost_weight: float = 0.0) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """Target probabilities of the logging policy itself, the champion's greedy rule and each router,
    and their direct models for DR (dm: "router" = each router's own q̂ for accuracy, the logged
    champion's for the champion; "fitted" = an outcome model fitted on the log)."""
    if dm not in DIRECT_MODELS:
        raise InputError("ope config", "direct_model", f"expected one of {DIRECT_MODELS}, got {dm!r}")
    k = len(logged.workers)
    fitted = fit_direct_model(logged.log, logged.logged_quality, cost_weight)
    targets = {LOGGING: logged.log.logging, CHAMPION_GREEDY: one_hot(logged.greedy(logged.logged_quality), k)}
    qualities = {LOGGING: logged.logged_quality, CHAMPION_GREEDY: logged.logged_quality}
    for name, served in routers.items():
        q = router_quality(served, logged, name)
        targets[name] = one_hot(logged.greedy(q), k)
        qualities[name] = np.where(np.isfinite(q), q, 0.0)
    direct = {}
    for name, q in qualities.items():
        if dm == "fitted":
            direct[name] = fitted
        else:
            acc = np.clip(q, 0, 1)
            direct[name] = {"accuracy": acc, "usd": fitted["usd"], "objective": acc - cost_weight * fitted["usd"]}
    return targets, direct


def evaluate(logged: LoggedTraffic, routers: dict[str, Any], cfg: OPEConfig,
             dm: str = "router") -> OPEResult:
    targets, direct = policies(logged, routers, dm, cfg.cost_weight)
    return estimate_policies(logged.log, targets, cfg, direct)


def leaderboard(result: OPEResult, estimator: str = "snips", metric: str = "objective") -> pd.DataFrame:
    """One row per policy: every estimator's value and interval per metric, sorted by `estimator`'s
    `metric` (best first; for usd, cheapest first)."""
    frame = pd.DataFrame(result.rows)
    wide = frame.pivot_table(index="policy", columns=["metric", "estimator"], values=["value", "ci_low", "ci_high"],
                             sort=False)
    out = pd.DataFrame(index=wide.index)
    for metric_, estimator_ in dict.fromkeys((m, e) for _, m, e in wide.columns):
        for part in ("value", "ci_low", "ci_high"):
            out[f"{metric_}.{estimator_}" + ("" if part == "value" else f".{part}")] = wide[(part, metric_, estimator_)]
    diag = frame.drop_duplicates("policy").set_index("policy")[["support", "ess", "n", "n_clipped", "max_weight", "clip"]]
    out = out.join(diag)
    key = f"{metric}.{estimator}"
    if key in out.columns:
        out = out.sort_values(key, ascending=metric == "usd")
    return out.reset_index()


def markdown(board: pd.DataFrame, estimator: str = "snips") -> str:
    """A short Markdown table: each metric's `estimator` value [interval], support and ESS."""
    lines = ["| policy | accuracy | USD / request | objective | support | ESS | n |", "|---|---|---|---|---|---|---|"]
    for _, r in board.iterrows():
        cells = []
        for metric in ("accuracy", "usd", "objective"):
            key = f"{metric}.{estimator}"
            fmt = ".3g" if metric == "usd" else ".3f"
            cells.append(f"{r[key]:{fmt}} [{r[key + '.ci_low']:{fmt}}, {r[key + '.ci_high']:{fmt}}]"
                         if key in board.columns else "")
        lines.append(f"| {r['policy']} | {' | '.join(cells)} | {r['support']:.0%} | {r['ess']:.1f} | {int(r['n'])} |")
    return "\n".join(lines) + f"\n\n{estimator.upper()} estimates, 95 % bootstrap intervals.\n"


def promote_off_policy(name: str, version: str, log_source: str | Path, cfg: Any, cost_weight: float | None = None,
                       direct_model: str = "router", served_name: str | None = None, graded_before: str | None = None,
                       exclude_ids: set[str] | None = None) -> Any:
    """The promotion gate judged on the champion's own traffic: the registered candidate `version`
    of `name` against the champion's greedy rule, both estimated off-policy from the decisions the
    champion version served (routerops.promotion.decide_off_policy), logged like every gate decision
    (evaluation/registry.py `log_decision`: run, tags, alias). `graded_before` and `exclude_ids` keep
    a retrain's cut-off and its training rows out of the judged traffic."""
    from evaluation.registry import champion_version, load_registered, log_decision
    from routerops.ope import NoSupportError
    from routerops.promotion import decide_off_policy

    champ_v = champion_version(name)
    if champ_v is None:
        raise InputError(name, "champion", "no champion: the off-policy gate judges a candidate on a champion's traffic")
    frame = read_log(log_source, served_name or name, graded_before)
    keep = (frame.router_version.astype(str) == str(champ_v)) & ~frame.decision_id.isin(exclude_ids or set())
    frame = frame[keep].reset_index(drop=True)
    if frame.empty:
        raise InputError(log_source, "router_version", f"no graded decisions served by {name} v{champ_v} (the champion)")
    logged = traffic(frame)
    lam = float(np.median(logged.cost_weight)) if cost_weight is None else cost_weight
    evidence = {"model": name, "candidate_version": str(version), "champion_version": str(champ_v), "n": len(frame),
                "log": str(log_source), "log_first": str(frame.created_at.min()), "log_last": str(frame.created_at.max()),
                "epsilon": sorted(set(logged.epsilon.tolist())), "direct_model": direct_model}
    ope_cfg = OPEConfig(estimators=(cfg.estimator,), n_boot=cfg.n_boot, confidence=cfg.confidence, clip=cfg.clip,
                        min_support=cfg.min_support, cost_weight=lam, seed=cfg.seed)
    try:
        result = evaluate(logged, {"candidate": load_registered(name, str(version))}, ope_cfg, direct_model)
    except NoSupportError as exc:
        evidence["support"] = exc.support
        decision = decide_off_policy(None, "candidate", CHAMPION_GREEDY, cfg, evidence,
                                     refused=f"{exc}; the champion stays")
    else:
        decision = decide_off_policy(result, "candidate", CHAMPION_GREEDY, cfg, evidence)
    log_decision(name, str(version), decision)
    return decision
