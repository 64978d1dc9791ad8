"""Off-policy evaluation (OPE): the value a target router *would* have had on traffic another policy served.

The gateway logs, per request i, the worker a_i it called, the logging policy's probability of every
worker μ(·|x_i) (ε-greedy over the affordable workers: gateway/routing.py), the grade r_i and the
USD paid. A target policy π (a challenger, or the champion's greedy rule) gives π(·|x_i). With the
importance weight w_i = π(a_i|x_i) / μ(a_i|x_i):

- IPS (Horvitz & Thompson 1952; inverse propensity scoring):  V̂ = (1/n) Σ_i w_i r_i.
  Unbiased when μ(a|x) > 0 wherever π(a|x) > 0; its variance grows with the weights.
- SNIPS (self-normalised IPS, Swaminathan & Joachims 2015, "The self-normalized estimator for
  counterfactual learning", eq. 2):  V̂ = Σ_i w_i r_i / Σ_i w_i. Biased O(1/n), much lower variance,
  and always inside the range of the observed rewards.
- DR (doubly robust, Dudík, Langford & Li 2011, eq. 3):
      V̂ = (1/n) Σ_i [ Σ_a π(a|x_i) q̂(x_i, a) + w_i (r_i − q̂(x_i, a_i)) ]
  with a direct model q̂ of the outcome: unbiased if the propensities are right *or* q̂ is;
  lower variance than IPS when q̂ is good.

Metrics (one reward each): `accuracy` (the grade), `usd` (USD per request) and `objective`, the
routers' cost-aware utility score − λ·usd (models/base.py) at the configured λ.

Weights may be clipped at `clip` (w ← min(w, clip); Ionides 2008 truncated importance sampling),
trading a known downward bias for variance; the output says how many rows were clipped.
Intervals: percentile bootstrap over the logged rows (Efron & Tibshirani 1993, ch. 13), every
estimate written as a ratio of two row sums so one resample-count matrix C (B × n) serves every
policy, estimator and metric at once (value_b = (C N)_b / (C D)_b), and a paired difference of
two policies is the difference of their columns under the same resamples.
Effective sample size: Kish's (Σ w)² / Σ w² (Owen 2013, §9.3). SNIPS intervals of accuracy are at
least Wilson's score interval at that effective size (`OPEConfig.wilson_floor`), because the
percentile bootstrap is too narrow when a handful of explored rows carry the weight.

Support: a worker the target would call but the logging policy never could (μ = 0) leaves its
outcome unobserved; no estimator recovers it. A deterministic champion (ε = 0) supports only its
own choices, so any challenger that differs from it on a request has no support there: `check_support`
refuses (NoSupportError) and reports the share of traffic that has it.

Pure numpy: the gateway side (reading the log, the challengers' probabilities) is evaluation/ope.py.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from routerops.errors import InputError, RouteropsError

ESTIMATORS = ("ips", "snips", "dr")
METRICS = ("accuracy", "usd", "objective")


@dataclass(frozen=True)
class OPEConfig:
    """How estimates are made (params.yaml `ope`, `routerops ope` flags)."""

    estimators: tuple[str, ...] = ESTIMATORS  # which of ESTIMATORS (dr needs a direct model)
    n_boot: int = 1000  # bootstrap resamples of the logged rows
    confidence: float = 0.95  # two-sided level of the percentile intervals
    clip: float | None = None  # largest importance weight kept (None: no clipping)
    min_support: float = 1.0  # share of the target's probability mass the log must support, else refuse
    cost_weight: float = 0.0  # λ of the objective score − λ·usd (quality per USD)
    seed: int = 0
    # SNIPS intervals of accuracy (a weighted mean of grades in [0, 1]) are widened to at least the Wilson
    # score interval at Kish's effective sample size (`wilson_interval`): the percentile bootstrap alone
    # is too narrow when few rows carry the weight (docs/ope.md, the demo's grid).
    wilson_floor: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "estimators", tuple(self.estimators))
        bad = [e for e in self.estimators if e not in ESTIMATORS]
        if bad or not self.estimators:
            raise InputError("ope config", "estimators", f"expected some of {ESTIMATORS}, got {list(self.estimators)}")
        if not (isinstance(self.n_boot, int) and self.n_boot >= 100):
            raise InputError("ope config", "n_boot", f"expected an integer ≥ 100, got {self.n_boot!r}")
        if not 0 < self.confidence < 1:
            raise InputError("ope config", "confidence", f"expected a level in (0, 1), got {self.confidence!r}")
        if self.clip is not None and not (math.isfinite(self.clip) and self.clip >= 1):
            raise InputError("ope config", "clip", f"expected a weight ≥ 1 or null, got {self.clip!r}")
        if not 0 <= self.min_support <= 1:
            raise InputError("ope config", "min_support", f"expected a share in [0, 1], got {self.min_support!r}")
        if not (math.isfinite(self.cost_weight) and self.cost_weight >= 0):
            raise InputError("ope config", "cost_weight", f"expected a number ≥ 0, got {self.cost_weight!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "ope config") -> "OPEConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InputError(source, unknown[0], f"unknown key; known: {sorted(known)}")
        return cls(**values)


class NoSupportError(RouteropsError):
    """The log does not cover the target's choices (e.g. a deterministic champion, ε = 0)."""

    def __init__(self, policy: str, support: float, required: float, epsilon: float | None = None):
        self.policy, self.support, self.required = policy, support, required
        why = ("the logging policy was deterministic (ε = 0): it supports only its own choices, so a policy that "
               "differs from it has no logged outcome there; serve with --epsilon > 0 to evaluate challengers"
               if epsilon == 0 else "the logging policy never called the worker the target would have called")
        super().__init__(f"cannot estimate {policy!r} off-policy: only {support:.1%} of the traffic has support "
                         f"(required {required:.1%}); {why}")


@dataclass(frozen=True)
class BanditLog:
    """n logged decisions over K workers: what was called, with what probabilities, and what came of it."""

    workers: list[str]
    action: np.ndarray  # (n,) index of the worker called
    logging: np.ndarray  # (n, K) μ(a | x_i): the logging policy's probability of every worker
    score: np.ndarray  # (n,) the grade of the call, in [0, 1]
    usd: np.ndarray  # (n,) USD paid

    def __post_init__(self) -> None:
        action = np.asarray(self.action, dtype=int)
        mu = np.asarray(self.logging, dtype=float)
        score, usd = np.asarray(self.score, dtype=float), np.asarray(self.usd, dtype=float)
        n, k = len(action), len(self.workers)
        if mu.shape != (n, k) or score.shape != (n,) or usd.shape != (n,):
            raise InputError("decision log", "shape", f"{n} actions over {k} workers, logging {mu.shape}, "
                                                      f"scores {score.shape}, usd {usd.shape}")
        if n == 0:
            raise InputError("decision log", "rows", "no graded decisions to estimate from")
        if ((action < 0) | (action >= k)).any():
            raise InputError("decision log", "worker", "an action outside the worker list")
        if not (np.isfinite(mu).all() and (mu >= 0).all() and np.allclose(mu.sum(axis=1), 1, atol=1e-6)):
            raise InputError("decision log", "propensity", "each row's logging probabilities must sum to 1")
        if not (mu[np.arange(n), action] > 0).all():
            raise InputError("decision log", "propensity", "a logged choice with propensity 0")
        if not (np.isfinite(score).all() and np.isfinite(usd).all()):
            raise InputError("decision log", "score", "scores and costs must be finite (grade the decisions first)")
        for name, value in (("action", action), ("logging", mu), ("score", score), ("usd", usd)):
            object.__setattr__(self, name, value)

    def __len__(self) -> int:
        return len(self.action)

    @property
    def propensity(self) -> np.ndarray:
        return self.logging[np.arange(len(self)), self.action]

    def rewards(self, cost_weight: float) -> dict[str, np.ndarray]:
        return {"accuracy": self.score, "usd": self.usd, "objective": self.score - cost_weight * self.usd}


def one_hot(choice: np.ndarray, k: int) -> np.ndarray:
    """A deterministic policy's (n, K) probabilities from its choices."""
    probs = np.zeros((len(choice), k))
    probs[np.arange(len(choice)), np.asarray(choice, dtype=int)] = 1.0
    return probs


def epsilon_greedy(greedy: np.ndarray, allowed: np.ndarray, epsilon: float) -> np.ndarray:
    """(n, K) probabilities of the gateway's rule: the greedy worker with 1 − ε, plus ε spread
    uniformly over the allowed (affordable) workers (gateway/routing.py `_explore`)."""
    allowed = np.asarray(allowed, dtype=bool)
    probs = epsilon * allowed / allowed.sum(axis=1, keepdims=True)
    probs[np.arange(len(greedy)), np.asarray(greedy, dtype=int)] += 1 - epsilon
    return probs


def support_share(log: BanditLog, target: np.ndarray) -> float:
    """Share of the target's probability mass on workers the logging policy could call (1 = full)."""
    return float((np.asarray(target) * (log.logging > 0)).sum(axis=1).mean())


def check_support(log: BanditLog, target: np.ndarray, policy: str, min_support: float) -> float:
    share = support_share(log, target)
    if share < min_support - 1e-12:
        explored = log.logging.max(axis=1) < 1
        raise NoSupportError(policy, share, min_support, epsilon=0.0 if not explored.any() else None)
    return share


def importance_weights(log: BanditLog, target: np.ndarray, clip: float | None) -> tuple[np.ndarray, int]:
    """w_i = π(a_i|x_i) / μ(a_i|x_i), clipped at `clip`; and how many were clipped."""
    w = np.asarray(target)[np.arange(len(log)), log.action] / log.propensity
    if clip is None:
        return w, 0
    return np.minimum(w, clip), int((w > clip).sum())


def wilson_interval(value: float, n: float, confidence: float) -> tuple[float, float]:
    """Wilson's score interval (Wilson 1927, eq. for p with z = Φ⁻¹(1 − α/2)) for a share `value` seen on
    n rows, n here being Kish's effective sample size of the weights (Kish 1965, §11.7): the interval a
    weighted mean of [0, 1] outcomes would have if its weights were n equal ones. (0, 1) when n ≤ 0."""
    if not n > 0:
        return 0.0, 1.0
    from statistics import NormalDist

    p = min(max(value, 0.0), 1.0)
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def effective_sample_size(w: np.ndarray) -> float:
    """Kish's (Σw)² / Σw²: n when every weight is equal, 1 when one row carries everything."""
    squares = float((w ** 2).sum())
    return float(w.sum() ** 2 / squares) if squares > 0 else 0.0


@dataclass(frozen=True)
class Column:
    """One estimate as a ratio of row sums: value = Σ_i num_i / Σ_i den_i (resampled jointly)."""

    policy: str
    estimator: str
    metric: str
    num: np.ndarray
    den: np.ndarray


def estimator_columns(log: BanditLog, policy: str, target: np.ndarray, cfg: OPEConfig,
                      direct: dict[str, np.ndarray] | None = None) -> tuple[list[Column], dict[str, Any]]:
    """The (estimator × metric) columns of one target policy, and its weights' diagnostics.

    direct: metric → (n, K) direct model q̂(x_i, a) for DR (any metric missing: no DR for it)."""
    target = np.asarray(target, dtype=float)
    if target.shape != log.logging.shape or not np.allclose(target.sum(axis=1), 1, atol=1e-6):
        raise InputError(policy, "probabilities", f"expected ({len(log)}, {len(log.workers)}) rows summing to 1")
    support = check_support(log, target, policy, cfg.min_support)
    w, clipped = importance_weights(log, target, cfg.clip)
    ones = np.ones(len(log))
    rows = np.arange(len(log))
    columns = []
    for metric, r in log.rewards(cfg.cost_weight).items():
        if "ips" in cfg.estimators:  # Horvitz–Thompson
            columns.append(Column(policy, "ips", metric, w * r, ones))
        if "snips" in cfg.estimators:  # Swaminathan & Joachims 2015, eq. 2
            columns.append(Column(policy, "snips", metric, w * r, w))
        q = (direct or {}).get(metric)
        if "dr" in cfg.estimators and q is not None:  # Dudík et al. 2011, eq. 3
            q = np.asarray(q, dtype=float)
            columns.append(Column(policy, "dr", metric, (target * q).sum(axis=1) + w * (r - q[rows, log.action]),
                                  ones))
    diagnostics = {"support": support, "ess": effective_sample_size(w), "n_clipped": clipped,
                   "max_weight": float(w.max()), "n": len(log)}
    return columns, diagnostics


def resample_counts(n: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, n) counts of each row in n_boot bootstrap resamples (each a multinomial draw of n)."""
    picks = rng.integers(0, n, size=(n_boot, n)) + (np.arange(n_boot) * n)[:, None]
    return np.bincount(picks.ravel(), minlength=n_boot * n).reshape(n_boot, n).astype(float)


def bootstrap_values(columns: list[Column], n: int, n_boot: int, seed: int, chunk_cells: int = 4_000_000) -> np.ndarray:
    """(n_boot, M) resampled values of every column, all under the same resamples (paired)."""
    num = np.stack([c.num for c in columns], axis=1)
    den = np.stack([c.den for c in columns], axis=1)
    rng = np.random.default_rng(seed)
    out = np.empty((n_boot, len(columns)))
    step = max(1, chunk_cells // max(n, 1))
    for start in range(0, n_boot, step):
        counts = resample_counts(n, min(step, n_boot - start), rng)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[start:start + len(counts)] = (counts @ num) / (counts @ den)
    return out


@dataclass
class OPEResult:
    """Every policy's estimates (one row per policy × estimator × metric) and the resamples behind them."""

    rows: list[dict[str, Any]]
    columns: list[Column] = field(repr=False)
    boot: np.ndarray = field(repr=False)
    config: dict[str, Any] = field(default_factory=dict)

    def index(self, policy: str, estimator: str, metric: str) -> int:
        for j, c in enumerate(self.columns):
            if (c.policy, c.estimator, c.metric) == (policy, estimator, metric):
                return j
        raise KeyError(f"no {estimator} estimate of {metric} for {policy!r}")

    def value(self, policy: str, estimator: str, metric: str) -> float:
        return self.rows[self.index(policy, estimator, metric)]["value"]

    def paired_difference(self, a: str, b: str, estimator: str, metric: str) -> tuple[float, float, float]:
        """(V̂(a) − V̂(b), low, high): both estimated from the same log, resampled jointly."""
        i, j = self.index(a, estimator, metric), self.index(b, estimator, metric)
        low, high = _intervals((self.boot[:, i] - self.boot[:, j])[:, None], self.config["confidence"])
        return self.rows[i]["value"] - self.rows[j]["value"], float(low[0]), float(high[0])


def _intervals(boot: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of each column (a resample whose SNIPS denominator was 0 is left out)."""
    alpha = (1 - confidence) / 2
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column: no interval
        low, high = np.nanquantile(np.where(np.isfinite(boot), boot, np.nan), [alpha, 1 - alpha], axis=0)
    return np.atleast_1d(low), np.atleast_1d(high)


def estimate_policies(log: BanditLog, targets: dict[str, np.ndarray], cfg: OPEConfig,
                      direct: dict[str, dict[str, np.ndarray]] | None = None) -> OPEResult:
    """Every target's value by every configured estimator and metric, with intervals (one paired
    bootstrap for all). targets: policy name → (n, K) probabilities; direct: policy name → metric →
    (n, K) direct model for DR. A target without support raises NoSupportError."""
    columns, diagnostics = [], {}
    for name, target in targets.items():
        cols, diagnostics[name] = estimator_columns(log, name, target, cfg, (direct or {}).get(name))
        columns += cols
    boot = bootstrap_values(columns, len(log), cfg.n_boot, cfg.seed)
    lows, highs = _intervals(boot, cfg.confidence)
    bounded = bool(((log.score >= 0) & (log.score <= 1)).all())
    rows = []
    for j, c in enumerate(columns):
        low, high, value = float(lows[j]), float(highs[j]), float(c.num.sum() / c.den.sum())
        method = "percentile"
        if cfg.wilson_floor and bounded and (c.estimator, c.metric) == ("snips", "accuracy"):
            w_low, w_high = wilson_interval(value, diagnostics[c.policy]["ess"], cfg.confidence)
            low, high, method = min(low, w_low), max(high, w_high), "percentile ∪ wilson(ess)"
        rows.append({"policy": c.policy, "estimator": c.estimator, "metric": c.metric,
                     "value": value, "ci_low": low, "ci_high": high, "ci_method": method,
                     **diagnostics[c.policy], "clip": cfg.clip})
    return OPEResult(rows, columns, boot, asdict(cfg))


# ---------------------------------------------------------------- a direct model fitted on the log


def fit_direct_model(log: BanditLog, features: np.ndarray, cost_weight: float = 0.0, folds: int = 2,
                     seed: int = 0) -> dict[str, np.ndarray]:
    """q̂(x, a) for DR fitted on the log alone: per worker, a logistic regression of the grade on the
    request's features (e.g. the champion's logged quality estimates, or a query embedding) over the
    rows that called that worker; USD per call as the worker's mean logged cost. Cross-fitted over
    `folds` (each row predicted by a model that did not see it: Chernozhukov et al. 2018, §3), so the
    model's own fitting noise does not enter DR's correction term. A worker with too few logged rows
    (or one class only) gets its mean grade, or the log's mean when it was never called."""
    from sklearn.linear_model import LogisticRegression

    x = np.asarray(features, dtype=float).reshape(len(log), -1)
    n, k = len(log), len(log.workers)
    accuracy = np.empty((n, k))
    fold = np.random.default_rng(seed).integers(0, folds, n)
    for f in range(folds):
        train, test = fold != f, fold == f
        for a in range(k):
            rows = train & (log.action == a)
            y = log.score[rows] >= 0.5
            if rows.sum() < 10 or y.all() or not y.any():
                accuracy[test, a] = log.score[rows].mean() if rows.any() else log.score[train].mean()
                continue
            model = LogisticRegression(C=1.0, max_iter=200).fit(x[rows], y)
            accuracy[test, a] = model.predict_proba(x[test])[:, 1]
    usd = np.array([log.usd[log.action == a].mean() if (log.action == a).any() else log.usd.mean()
                    for a in range(k)])
    usd = np.tile(usd, (n, 1))
    return {"accuracy": accuracy, "usd": usd, "objective": accuracy - cost_weight * usd}
