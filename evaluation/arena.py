"""The arena's rows and comparisons (issue 39, items 3–4): every policy's held-out decisions on the same
test queries, paired query by query with the references it should beat at its own cost.

A policy's outcome on one seed is, per test query: right or not, USD paid, calls to the strong worker
(GPT-4 on the RouteLLM table) and the worker whose answer stood. A row is the mean over its seeds, query
by query, so every comparison is paired over the same resampled test queries:

- (a) the logistic router **at the row's own USD per query**: its sweep over λ on the test queries read
  at the row's USD, between the two neighbouring operating points (a mix of two λs is a policy one can
  run); per query the mix's expected correctness (1 − w)·right(k₁) + w·right(k₂);
- (b) the cascade at the row's own strong-worker calls per query, the same way on calls;
- (c) the best trivial policy at the row's USD: the random mix of always-weak and always-strong at equal
  USD (per query (1 − p)·right(weak) + p·right(strong)), the chord every random mix lies on; the oracle
  is not a policy one can run and is left out;
- (d) for an RL row, its SFT start on the same queries.

Each is a percentile interval (Efron & Tibshirani 1993, ch. 13) of the mean paired difference over
bootstrap resamples of the row's test queries (evaluation.replay.resample_counts)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from evaluation.replay import resample_counts


@dataclass
class Curve:
    """A policy's knob sweep on the test queries: per knob value (K) and test query (n)."""

    knobs: np.ndarray
    correct: np.ndarray  # (K, n)
    usd: np.ndarray  # (K, n)
    strong: np.ndarray  # (K, n) calls to the strong worker


@dataclass
class Outcome:
    """One policy's held-out decisions on one seed; `rows` are the table's query indices."""

    policy: str
    family: str
    seed: int
    rows: np.ndarray
    correct: np.ndarray
    usd: np.ndarray
    strong: np.ndarray
    actions: list[str]
    curve: Curve | None = None
    meta: dict = field(default_factory=dict)


def action_shares(actions: Sequence[str]) -> dict[str, float]:
    """Each action's share of the held-out decisions (all seeds pooled)."""
    counts = Counter(actions)
    return {a: counts[a] / len(actions) for a in sorted(counts)}


def is_constant(shares: dict[str, float], threshold: float = 0.9) -> bool:
    """One action on more than `threshold` of the test queries: the policy is constant (issue 39)."""
    return bool(shares) and max(shares.values()) > threshold


def paired_difference(ours: np.ndarray, theirs: np.ndarray, n_boot: int, seed: int,
                      confidence: float = 0.95) -> dict[str, float]:
    """Mean of ours − theirs over the same queries, with a percentile interval over `n_boot` resamples
    of those queries (the same resample for both: paired)."""
    d = np.asarray(ours, dtype=float) - np.asarray(theirs, dtype=float)
    counts = resample_counts(len(d), n_boot, seed)
    means = counts @ d / len(d)
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return {"diff": float(d.mean()), "lo": float(lo), "hi": float(hi)}


def matched_reference(curve: Curve, cols: np.ndarray, axis: str, target: float) -> tuple[np.ndarray, dict]:
    """Per query of `cols` (positions in the curve's test queries), the expected correctness of the
    curve's mix of its two operating points next to `target` in mean `axis` ("usd" or "strong"): the
    sweep read at the row's own cost, clamped to its ends. Nothing is chosen on the test queries but
    the cost to match. Returns it and where it was read (x and accuracy)."""
    x = getattr(curve, axis)[:, cols].mean(axis=1)
    order = np.argsort(x, kind="stable")
    xs = x[order]
    if target <= xs[0] or target >= xs[-1]:
        k1 = k2 = order[0] if target <= xs[0] else order[-1]
        w = 0.0
    else:
        j = int(np.searchsorted(xs, target, side="right"))
        k1, k2 = order[j - 1], order[j]
        w = 0.0 if x[k2] == x[k1] else (target - x[k1]) / (x[k2] - x[k1])
    per_query = (1 - w) * curve.correct[k1, cols] + w * curve.correct[k2, cols]
    read = (1 - w) * x[k1] + w * x[k2]
    return per_query, {"reference_" + axis: float(read), "reference_accuracy": float(per_query.mean())}


def chord_reference(weak: Outcome, strong: Outcome, cols: np.ndarray, target_usd: float) -> tuple[np.ndarray, dict]:
    """The random mix of always-weak and always-strong whose mean USD on `cols` equals `target_usd`
    (share p of the strong worker, clamped to [0, 1]); per query its expected correctness."""
    u_w, u_s = weak.usd[cols].mean(), strong.usd[cols].mean()
    p = float(np.clip((target_usd - u_w) / (u_s - u_w), 0.0, 1.0)) if u_s != u_w else 0.0
    per_query = (1 - p) * weak.correct[cols] + p * strong.correct[cols]
    return per_query, {"strong_share": p, "reference_accuracy": float(per_query.mean())}


def mean_outcome(outcomes: Sequence[Outcome]) -> Outcome:
    """The seeds of one policy as one outcome: per query the mean over seeds (same rows required)."""
    first = outcomes[0]
    for o in outcomes[1:]:
        if not np.array_equal(o.rows, first.rows):
            raise ValueError(f"{first.policy}: seeds were evaluated on different queries")
    stack = lambda name: np.mean([getattr(o, name) for o in outcomes], axis=0)  # noqa: E731
    return Outcome(first.policy, first.family, first.seed, first.rows, stack("correct"), stack("usd"),
                   stack("strong"), [a for o in outcomes for a in o.actions], first.curve,
                   {**first.meta, "seeds": [o.seed for o in outcomes]})


@dataclass
class References:
    """What every row is compared with: the per-seed curves of the logistic router and the cascade on
    the test queries (their `rows`), and the two single workers' outcomes."""

    test_rows: np.ndarray
    logistic: Sequence[Curve]
    cascade: Sequence[Curve]
    weak: Outcome
    strong: Outcome

    def columns(self, rows: np.ndarray) -> np.ndarray:
        where = {int(r): i for i, r in enumerate(self.test_rows)}
        missing = [int(r) for r in rows if int(r) not in where]
        if missing:
            raise ValueError(f"query {missing[0]} is not a test query of the arena's split")
        return np.asarray([where[int(r)] for r in rows])


def _against(curves: Sequence[Curve], cols: np.ndarray, axis: str, target: float) -> tuple[np.ndarray, dict]:
    """The mean over seeds of a reference's per-query matched vectors."""
    parts = [matched_reference(c, cols, axis, target) for c in curves]
    per_query = np.mean([p[0] for p in parts], axis=0)
    info = {k: float(np.mean([p[1][k] for p in parts])) for k in parts[0][1]}
    return per_query, info | {"reference_accuracy": float(per_query.mean())}


def compare_row(row: Outcome, refs: References, n_boot: int, seed: int, sft: Outcome | None = None) -> dict:
    """The paired differences (a)–(d) of one row (seeds already averaged) against the references."""
    cols = refs.columns(row.rows)
    usd, strong = float(row.usd.mean()), float(row.strong.mean())
    out = {}
    for key, (theirs, info) in {
        "vs_logistic_at_usd": _against(refs.logistic, cols, "usd", usd),
        "vs_cascade_at_gpt4_calls": _against(refs.cascade, cols, "strong", strong),
        "vs_random_mix_at_usd": chord_reference(refs.weak, refs.strong, cols, usd),
    }.items():
        out[key] = {**paired_difference(row.correct, theirs, n_boot, seed), **info}
    if sft is not None:
        if not np.array_equal(sft.rows, row.rows):
            raise ValueError(f"{row.policy}: its SFT start was evaluated on other queries")
        out["vs_sft_start"] = {**paired_difference(row.correct, sft.correct, n_boot, seed), "sft_start": sft.policy,
                               "reference_accuracy": float(sft.correct.mean())}
    return out


def arena_row(outcomes: Sequence[Outcome], refs: References, n_boot: int, seed: int, constant_share: float,
              sft: Sequence[Outcome] | None = None) -> dict:
    """One row of arena.json: the policy's numbers on its test queries and its paired differences."""
    row = mean_outcome(outcomes)
    shares = action_shares(row.actions)
    start = mean_outcome(sft) if sft else None
    return {"policy": row.policy, "family": row.family, "seeds": row.meta["seeds"], "test_queries": int(len(row.rows)),
            "accuracy": float(row.correct.mean()), "usd_per_query": float(row.usd.mean()),
            "gpt4_calls_per_query": float(row.strong.mean()), "action_shares": shares,
            "constant": is_constant(shares, constant_share),
            **{k: v for k, v in row.meta.items() if k not in ("seeds",)},
            "comparisons": compare_row(row, refs, n_boot, seed, start)}


def pareto_front(usd: np.ndarray, accuracy: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both (cheaper or equal and at least as accurate,
    one strictly), by increasing USD."""
    order = np.lexsort((-accuracy, usd))
    front, best = [], -np.inf
    for i in order:
        if accuracy[i] > best:
            front.append(int(i))
            best = accuracy[i]
    return np.asarray(front, dtype=int)


def settings_key(*parts) -> str:
    """A short digest of the settings an output depends on: a cached output with another key is redone."""
    text = json.dumps([p if isinstance(p, (dict, list, str, int, float)) else repr(p) for p in parts], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
