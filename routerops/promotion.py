"""The promotion gate: does a candidate router beat the current champion, beyond the noise of the test set?

Both routers are judged on the same test queries. Their per-query outcomes are resampled *jointly*
(a paired percentile bootstrap, Efron & Tibshirani 1993, ch. 13 — `metrics.paired_bootstrap_diff` for
one operating point), so query difficulty cancels. The candidate is promoted only when the lower end
of the confidence interval of (candidate − champion) on the objective exceeds `min_improvement`
(0 by default): a difference the interval cannot tell from zero keeps the champion. With no champion
the first candidate is promoted. Pure functions over arrays: the MLflow side is tasks/registry.py.

Objectives:
- accuracy_at_budget: mean score of the served routing rule at one per-query budget (one operating
  point per router; K = 1).
- aiq: RouterBench's AIQ (Hu et al. 2024, §3) of the router's accuracy–cost curve over its knob,
  inside a fixed cost window shared by both routers (K operating points per router).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from routerops import metrics

OBJECTIVES = ("accuracy_at_budget", "aiq")


@dataclass(frozen=True)
class GateConfig:
    objective: str = "accuracy_at_budget"  # one of OBJECTIVES
    budget_usd: float | None = None  # accuracy_at_budget: the per-query budget; None = no limit
    n_boot: int = 2000  # bootstrap resamples of the test queries
    confidence: float = 0.95  # two-sided level of the interval whose lower end must clear min_improvement
    min_improvement: float = 0.0  # the interval's lower end must exceed this (objective units)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective {self.objective!r} is not one of {OBJECTIVES}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.n_boot < 100:
            raise ValueError(f"n_boot={self.n_boot} is too few resamples for a {self.confidence:.0%} interval")
        if self.budget_usd is not None and not self.budget_usd >= 0:
            raise ValueError(f"budget_usd must be ≥ 0 or None, got {self.budget_usd}")


@dataclass(frozen=True)
class Outcomes:
    """One router on the test split: score obtained (`correct`) and USD paid (`paid`) per query at each
    of K operating points, both (K, n)."""

    correct: np.ndarray
    paid: np.ndarray

    def __post_init__(self) -> None:
        c, p = np.atleast_2d(np.asarray(self.correct, dtype=float)), np.atleast_2d(np.asarray(self.paid, dtype=float))
        if c.shape != p.shape or c.ndim != 2 or c.shape[1] == 0:
            raise ValueError(f"correct {c.shape} and paid {p.shape} must both be (K, n) with n ≥ 1")
        object.__setattr__(self, "correct", c)
        object.__setattr__(self, "paid", p)

    @property
    def n(self) -> int:
        return self.correct.shape[1]


@dataclass(frozen=True)
class PromotionDecision:
    """The gate's verdict and its evidence (what tasks/registry.py logs as a run, tags and JSON)."""

    promote: bool
    reason: str
    objective: str
    candidate_score: float
    champion_score: float | None
    diff: float | None  # candidate − champion on the objective
    ci_low: float | None
    ci_high: float | None
    n: int  # test queries both were judged on
    config: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)  # test split hash, versions, window ...

    def to_dict(self) -> dict[str, Any]:
        return {k: _plain(v) for k, v in asdict(self).items()}


def _plain(value: Any) -> Any:
    """JSON-safe: numpy scalars to Python, NaN to None."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (np.floating, float)):
        return None if math.isnan(float(value)) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def objective_value(outcomes: Outcomes, objective: str, window: tuple[float, float] | None = None,
                    idx: np.ndarray | None = None) -> float:
    """The objective of one router on the queries `idx` (default: all)."""
    idx = np.arange(outcomes.n) if idx is None else np.asarray(idx, dtype=int)
    correct, paid = outcomes.correct[:, idx], outcomes.paid[:, idx]
    if objective == "accuracy_at_budget":
        if correct.shape[0] != 1:
            raise ValueError(f"accuracy_at_budget takes one operating point, got {correct.shape[0]}")
        return float(correct.mean())
    if objective == "aiq":
        if window is None:
            raise ValueError("the aiq objective needs the cost window both routers are judged in")
        return metrics.curve_aiq(paid.mean(axis=1), correct.mean(axis=1), window)
    raise ValueError(f"objective {objective!r} is not one of {OBJECTIVES}")


def paired_difference(candidate: Outcomes, champion: Outcomes, cfg: GateConfig,
                      window: tuple[float, float] | None = None) -> tuple[float, float, float]:
    """(objective(candidate) − objective(champion), low, high) over the same queries resampled jointly."""
    if candidate.n != champion.n:
        raise ValueError(f"candidate has {candidate.n} test queries, champion {champion.n}: not the same split")
    if cfg.objective == "accuracy_at_budget":
        return metrics.paired_bootstrap_diff(candidate.correct[0], champion.correct[0], n_boot=cfg.n_boot,
                                             seed=cfg.seed, confidence=cfg.confidence)

    def diff(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        # scipy hands a batch of resampled index vectors (..., n); the AIQ of a resample is not a mean,
        # so each resample's curve is rebuilt from the per-query outcomes it selects.
        rows = np.atleast_2d(idx).astype(int)
        values = [objective_value(candidate, cfg.objective, window, r)
                  - objective_value(champion, cfg.objective, window, r) for r in rows]
        return np.array(values).reshape(np.shape(idx)[:-1])

    return metrics.bootstrap_ci(np.arange(candidate.n, dtype=float), diff, n_boot=cfg.n_boot, seed=cfg.seed,
                                confidence=cfg.confidence)


def decide_promotion(candidate: Outcomes, champion: Outcomes | None, cfg: GateConfig,
                     window: tuple[float, float] | None = None,
                     evidence: dict[str, Any] | None = None) -> PromotionDecision:
    """Promote when there is no champion, or when the paired interval's lower end > cfg.min_improvement."""
    config = asdict(cfg)
    evidence = dict(evidence or {})
    if window is not None:
        evidence["cost_window_usd"] = [float(window[0]), float(window[1])]
    cand_score = objective_value(candidate, cfg.objective, window)
    if champion is None:
        return PromotionDecision(True, "no current champion: the first candidate is promoted", cfg.objective,
                                 cand_score, None, None, None, None, candidate.n, config, evidence)
    diff, low, high = paired_difference(candidate, champion, cfg, window)
    champ_score = objective_value(champion, cfg.objective, window)
    level = f"{cfg.confidence:.0%} paired bootstrap interval"
    if math.isnan(low):
        promote, reason = False, f"too few test queries ({candidate.n}) for a {level}: the champion stays"
    elif low > cfg.min_improvement:
        promote, reason = True, (f"candidate beats the champion on {cfg.objective} by {diff:+.4f}, "
                                 f"{level} [{low:+.4f}, {high:+.4f}] above {cfg.min_improvement:g}")
    else:
        promote, reason = False, (f"candidate does not beat the champion on {cfg.objective} beyond the noise: "
                                  f"difference {diff:+.4f}, {level} [{low:+.4f}, {high:+.4f}] reaches "
                                  f"{cfg.min_improvement:g}")
    return PromotionDecision(promote, reason, cfg.objective, cand_score, champ_score, diff, low, high, candidate.n,
                             config, evidence)


# ---------------------------------------------------------------- judging on the champion's own traffic


@dataclass(frozen=True)
class OffPolicyGateConfig:
    """The gate on the champion's logged traffic (routerops/ope.py): the candidate's and the champion's
    greedy rule's values are estimated from the same log and resampled jointly (paired)."""

    estimator: str = "snips"  # ips | snips | dr
    metric: str = "accuracy"  # accuracy | objective (score − λ·USD); usd is not a quality
    min_improvement: float = 0.0  # the paired interval's lower end must exceed this
    min_support: float = 1.0  # share of the candidate's choices the log must support, else refused
    min_ess: float = 30.0  # Kish effective sample size of the candidate's weights, else refused
    confidence: float = 0.95
    n_boot: int = 2000
    clip: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.estimator not in ("ips", "snips", "dr"):
            raise ValueError(f"estimator must be ips, snips or dr, got {self.estimator!r}")
        if self.metric not in ("accuracy", "objective"):
            raise ValueError(f"metric must be accuracy or objective, got {self.metric!r}")
        if not self.min_ess >= 1:
            raise ValueError(f"min_ess must be ≥ 1, got {self.min_ess}")


def decide_off_policy(result: Any, candidate: str, champion: str, cfg: OffPolicyGateConfig,
                      evidence: dict[str, Any] | None = None, refused: str | None = None) -> PromotionDecision:
    """Promote when the paired interval of V̂(candidate) − V̂(champion) on the champion's traffic lies
    above cfg.min_improvement, with enough support and effective sample size. `result` is an
    OPEResult holding both policies; `refused` a reason the estimate could not be made (no support)."""
    config, objective = asdict(cfg), f"off_policy_{cfg.metric}"
    evidence = dict(evidence or {})
    if refused is not None:
        return PromotionDecision(False, refused, objective, math.nan, None, None, None, None,
                                 int(evidence.get("n", 0)), config, evidence)
    row = next(r for r in result.rows if (r["policy"], r["estimator"], r["metric"]) == (candidate, cfg.estimator,
                                                                                        cfg.metric))
    evidence.update({"support": row["support"], "ess": row["ess"], "n_clipped": row["n_clipped"],
                     "estimator": cfg.estimator})
    cand = row["value"]
    champ = result.value(champion, cfg.estimator, cfg.metric)
    diff, low, high = result.paired_difference(candidate, champion, cfg.estimator, cfg.metric)
    level = f"{cfg.confidence:.0%} paired bootstrap interval of the {cfg.estimator.upper()} estimates"
    if row["ess"] < cfg.min_ess:
        promote, reason = False, (f"too little support on the champion's traffic: the candidate's effective sample "
                                  f"size is {row['ess']:.1f} < {cfg.min_ess:g} (serve with a larger ε or log longer)")
    elif low > cfg.min_improvement:
        promote, reason = True, (f"candidate beats the champion on its own traffic ({cfg.metric}, off-policy) by "
                                 f"{diff:+.4f}, {level} [{low:+.4f}, {high:+.4f}] above {cfg.min_improvement:g}")
    else:
        promote, reason = False, (f"candidate does not beat the champion on its own traffic ({cfg.metric}, "
                                  f"off-policy) beyond the noise: {diff:+.4f}, {level} [{low:+.4f}, {high:+.4f}]")
    return PromotionDecision(promote, reason, objective, cand, champ, diff, low, high, row["n"], config, evidence)
