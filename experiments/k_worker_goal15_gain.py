"""Issue 28's ≤ 15 % goal, another try on val: model the gain over the cheap worker directly.

    cd <repo> && flock /tmp/routerops-bench.lock nice -n 19 env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \\
        HF_HUB_OFFLINE=1 python experiments/k_worker_goal15_gain.py [--data ../shared/data] [--test]

Why: at ≤ 15 % of the best model's cost a router mostly decides, query by query, between gemma-2-9b-it
($0.1) and one of the 7–8B models ($0.2), i.e. it ranks queries by the *difference* q̂_k − q̂_gemma.
`lexical_ensemble` estimates every worker's P̂(correct) on its own, so that difference inherits the
noise of two independent fits. The candidates here estimate the gain, or the choice, differently:

- gain models: for each worker k ≠ gemma a three-class (multinomial) logistic regression of
  d = y_k − y_gemma ∈ {−1, 0, +1} on `lexical`'s features, gain_k = P̂(+1) − P̂(−1) = E[d | x]; the
  router reads q̂_gemma (the ensemble's) + gain_k. This is RouteLLM's pairwise-preference view
  (Ong et al. 2024, arXiv 2406.18665, §4: a router trained on which of two models wins), with ties
  kept as a class so that "both right / both wrong" queries do not vanish from the fit. Alone, and
  averaged with the ensemble's own q̂_k;
- a lower confidence bound: the ensemble's q̂_k minus z × the standard error of the two kNN members'
  neighbour-mean gain over gemma (pessimism against the optimizer's curse: an argmax over nine noisy
  estimates favours the over-estimated; Smith & Winkler 2006, "The optimizer's curse");
- a stacked gradient-boosted model (Friedman 2001; scikit-learn's histogram GBM) per worker on the
  logits of all nine workers' neighbour outcome rates (both kNN members, leave-one-out on train so a
  training query never reads its own outcome) ⊕ `lexical`'s surface markers ⊕ surface statistics, as
  P̂(correct) or as the gain over gemma, alone and as a member of the ensemble (Wolpert 1992);
- the ensemble with a fourth member: the MLP baseline.

Protocol: k_worker_routing's table and seeded split; every candidate fitted on train (seed 0) and
read on **val** only: accuracy at ≤ 15 % / ≤ 50 % of val's best single model's val cost; test is not
loaded. The reference is `lexical_ensemble` fitted the same way. Val's choice: the candidate with the
best val accuracy at ≤ 15 % (ties: at ≤ 50 %), the reference excluded. `--test` then reads that
candidate and the reference on test, once, refitted for seeds 0, 1, 2, with k_worker_routing's read-out
(curve, val-chosen operating point, paired bootstrap interval of the gap to test's best single model).
Writes experiments/results/k_worker_goal15_gain.json and .md.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluation.kworker_readout import clipped_logit, loo_rates  # noqa: E402
from evaluation.kworker_readout import mean_rows, readout, val_reference  # noqa: E402
from models.base import RoutingData  # noqa: E402
from models.baselines.features import single_threaded, surface_features  # noqa: E402
from models.baselines.knn import KNNRouter, unit  # noqa: E402
from models.kworkers.lexical import LexicalKNNRouter, LexicalLogisticRouter, marker_features  # noqa: E402
from models.registry import make_router  # noqa: E402
from routerops import metrics  # noqa: E402
from routerops.schema import write_json_atomic, write_text_atomic  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

CHEAP = "gemma-2-9b-it"
REFERENCE = "lexical_ensemble (reference)"
GAIN_C = (0.03, 0.1, 0.3, 1.0)
LCB_Z = (0.5, 1.0)


def gain_from_proba(proba: np.ndarray, classes) -> np.ndarray:
    """E[y_k − y_cheap | x] = P̂(+1) − P̂(−1) from a classifier's probabilities over the classes it saw."""
    classes = list(classes)
    up = proba[:, classes.index(1)] if 1 in classes else 0.0
    down = proba[:, classes.index(-1)] if -1 in classes else 0.0
    return np.asarray(up - down, dtype=float).reshape(len(proba))


def outcome_difference(scores: np.ndarray, cheap: int) -> np.ndarray:
    """(n, w) y_k − y_cheap in {−1, 0, +1} (outcomes binarised at 0.5, as everywhere else)."""
    y = (np.asarray(scores, dtype=float) > 0.5).astype(int)
    return y - y[:, [cheap]]


def with_gain(q: np.ndarray, gain: np.ndarray, cheap: int) -> np.ndarray:
    """q̂_cheap + gain_k for every worker but the cheap one, which keeps its own q̂."""
    out = q[:, [cheap]] + gain
    out[:, cheap] = q[:, cheap]
    return out


def knn_gain_se(neighbours: np.ndarray, scores: np.ndarray, cheap: int) -> np.ndarray:
    """(n, w) standard error of the neighbour-mean gain over the cheap worker: the sample standard
    deviation of y_k − y_cheap over a query's k neighbours, / √k (0 for the cheap worker itself)."""
    d = outcome_difference(scores, cheap).astype(float)[neighbours]  # (n, k, w)
    return d.std(axis=1, ddof=1) / np.sqrt(neighbours.shape[1])


class Fitted:
    """Every candidate's parts fitted on `train` for one seed, built on first use; `predict(name, data)`
    is the candidate's (n, w) quality on `data`."""

    def __init__(self, train: RoutingData, seed: int):
        self.train, self.seed = train, seed
        self.cheap = train.workers.index(CHEAP)
        self.d_train = outcome_difference(train.scores, self.cheap)
        self.y_train = (np.asarray(train.scores, dtype=float) > 0.5).astype(int)
        self.knn, self.knn_lex = KNNRouter().fit(train), LexicalKNNRouter().fit(train)
        self.lexical = LexicalLogisticRouter(seed=seed).fit(train)
        self.x_train = self.lexical.featurizer.transform(train)
        self._memo: dict = {}

    def _cached(self, key, data: RoutingData, compute):
        full = (key, tuple(data.query_ids))
        if full not in self._memo:
            self._memo[full] = compute()
        return self._memo[full]

    def members(self, data: RoutingData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._cached("members", data, lambda: (self.knn.predict_quality(data), self.knn_lex.predict_quality(data),
                                                     self.lexical.predict_quality(data)))

    def ensemble(self, data: RoutingData) -> np.ndarray:
        return np.mean(self.members(data), axis=0)

    @functools.lru_cache(maxsize=None)
    def gain_models(self, C: float) -> list:
        from sklearn.linear_model import LogisticRegression

        models = []
        for j in range(self.d_train.shape[1]):
            if j == self.cheap:
                models.append(None)
                continue
            with single_threaded():
                models.append(LogisticRegression(C=C, max_iter=3000).fit(self.x_train, self.d_train[:, j]))
        return models

    def multinomial_gain(self, data: RoutingData, C: float) -> np.ndarray:
        def compute():
            x = self.lexical.featurizer.transform(data)
            return np.stack([np.zeros(len(data)) if m is None else gain_from_proba(m.predict_proba(x), m.classes_)
                             for m in self.gain_models(C)], axis=1)
        return self._cached(("gain", C), data, compute)

    def lcb_penalty(self, data: RoutingData) -> np.ndarray:
        def compute():
            near = self.knn.top_k(unit(np.asarray(data.embeddings, dtype=float)), self.knn.k_)
            near_lex = self.knn_lex.top_k(self.knn_lex._unit(data.queries), self.knn_lex.k_)
            se, se_lex = (knn_gain_se(n, self.train.scores, self.cheap) for n in (near, near_lex))
            return np.sqrt(se**2 + se_lex**2) / 2  # the s.e. of the two members' mean gain, taken as independent
        return self._cached("lcb", data, compute)

    def _dense(self, data: RoutingData, rates: np.ndarray) -> np.ndarray:
        return np.hstack([clipped_logit(rates), marker_features(data.queries),
                          surface_features(data.queries).astype(float)])

    @functools.cached_property
    def boosted(self) -> tuple[list, list]:
        """Per-worker GBMs on the dense stacked features of train (leave-one-out neighbour rates): one
        for P̂(correct), one for the gain over the cheap worker."""
        from sklearn.ensemble import HistGradientBoostingClassifier

        x = self._dense(self.train, np.hstack([loo_rates(self.knn), loo_rates(self.knn_lex)]))

        def gbm(target):
            return HistGradientBoostingClassifier(learning_rate=0.05, max_iter=300, max_leaf_nodes=15, min_samples_leaf=40,
                                                  l2_regularization=1.0, early_stopping=True, validation_fraction=0.15,
                                                  random_state=self.seed).fit(x, target)
        outcome = [gbm(self.y_train[:, j]) for j in range(self.y_train.shape[1])]
        gain = [None if j == self.cheap else gbm(self.d_train[:, j]) for j in range(self.d_train.shape[1])]
        return outcome, gain

    def boosted_quality(self, data: RoutingData) -> tuple[np.ndarray, np.ndarray]:
        def compute():
            q_knn, q_knn_lex, _ = self.members(data)
            x = self._dense(data, np.hstack([q_knn, q_knn_lex]))
            outcome, gain = self.boosted
            p = np.stack([m.predict_proba(x)[:, 1] for m in outcome], axis=1)
            g = np.stack([np.zeros(len(data)) if m is None else gain_from_proba(m.predict_proba(x), m.classes_)
                          for m in gain], axis=1)
            return p, g
        return self._cached("boosted", data, compute)

    def mlp(self, data: RoutingData) -> np.ndarray:
        router = self._memo.get("mlp_router")
        if router is None:
            router = self._memo["mlp_router"] = make_router("mlp", self.seed).fit(self.train)
        return self._cached("mlp", data, lambda: router.predict_quality(data))


def candidates() -> dict:
    """name → (fitted, data) → (n, w) quality."""
    out = {REFERENCE: lambda f, d: f.ensemble(d)}
    for C in GAIN_C:
        out[f"ensemble's q̂_gemma + multinomial gain (C={C:g})"] = (
            lambda f, d, C=C: with_gain(f.ensemble(d), f.multinomial_gain(d, C), f.cheap))
        out[f"mean of the ensemble and that (C={C:g})"] = (
            lambda f, d, C=C: (f.ensemble(d) + with_gain(f.ensemble(d), f.multinomial_gain(d, C), f.cheap)) / 2)
    for z in LCB_Z:
        out[f"ensemble − {z:g} × s.e. of the kNN gain"] = lambda f, d, z=z: f.ensemble(d) - z * f.lcb_penalty(d)
    out["GBM on neighbour rates ⊕ markers"] = lambda f, d: f.boosted_quality(d)[0]
    out["ensemble + that GBM (a fourth member)"] = lambda f, d: (3 * f.ensemble(d) + f.boosted_quality(d)[0]) / 4
    out["ensemble's q̂_gemma + GBM gain"] = lambda f, d: with_gain(f.ensemble(d), f.boosted_quality(d)[1], f.cheap)
    out["ensemble + MLP (a fourth member)"] = lambda f, d: (3 * f.ensemble(d) + f.mlp(d)) / 4
    return out


def at_budget_resamples(rule, q: np.ndarray, data: RoutingData, best: int, fraction: float, n_boot: int = 1000,
                        seed: int = 0) -> np.ndarray:
    """(n_boot,) accuracy at ≤ `fraction` of the best single model's cost on resamples of `data`'s
    queries (the same resamples for every q at a given seed, so two routers' replicates are paired)."""
    from evaluation.replay import knob_grid, operating_points, resample_counts

    ops = operating_points(rule, q, data, knob_grid(rule, q, data.costs))
    counts = resample_counts(len(data), n_boot, seed).T / len(data)
    acc, usd, ref_usd = ops.correct @ counts, ops.paid @ counts, data.costs[:, best] @ counts
    return np.where(usd <= fraction * ref_usd[None, :] * (1 + 1e-9), acc, -np.inf).max(axis=0)


def disagreement_auc(gain_score: np.ndarray, d: np.ndarray) -> float | None:
    """AUC of a gain score for "k right, cheap wrong" against "k wrong, cheap right", on the queries
    where the two disagree (the only ones where routing between them changes accuracy)."""
    from sklearn.metrics import roc_auc_score

    keep = d != 0
    return float(roc_auc_score(d[keep] > 0, gain_score[keep])) if len(np.unique(d[keep])) == 2 else None


def shares_at_budget(rule, q: np.ndarray, data: RoutingData, best: int, fraction: float) -> dict:
    """Where the most accurate operating point within ≤ `fraction` of the best model's cost sends the
    queries: per worker, its share and the accuracy of it and of every worker on those queries."""
    from evaluation.replay import knob_grid, operating_points

    grid = knob_grid(rule, q, data.costs)
    ops = operating_points(rule, q, data, grid)
    acc, usd = ops.correct.mean(axis=1), ops.paid.mean(axis=1)
    ok = np.flatnonzero(usd <= fraction * float(data.costs[:, best].mean()) * (1 + 1e-9))
    pick = ok[np.lexsort((usd[ok], -acc[ok]))[0]]
    choice, _ = rule.decide(q, data.costs, grid[pick])
    y = np.asarray(data.scores, dtype=float) > 0.5
    cheap = data.workers.index(CHEAP)
    return {w: {"share": float((choice == j).mean()), "accuracy": float(y[choice == j, j].mean()),
                "cheap_accuracy_there": float(y[choice == j, cheap].mean())}
            for j, w in enumerate(data.workers) if (choice == j).any()}


def diagnostics(fitted: Fitted, val: RoutingData, rule, best: int) -> dict:
    """On val (seed-0 fits): the reference's routing at ≤ 15 %, and how well each estimator's gain over
    the cheap worker ranks the two 7–8B workers it upgrades to most and the best single model."""
    d = outcome_difference(val.scores, fitted.cheap)
    q_knn, q_knn_lex, q_lex = fitted.members(val)
    ens = fitted.ensemble(val)
    scores = {"ensemble": ens, "knn": q_knn, "knn_lexical": q_knn_lex, "lexical": q_lex}
    auc = {}
    for w in ("qwen2.5-7b-instruct", "llama-3.1-8b-instruct", val.workers[best]):
        j = val.workers.index(w)
        auc[w] = {name: disagreement_auc(q[:, j] - q[:, fitted.cheap], d[:, j]) for name, q in scores.items()}
        auc[w]["multinomial gain (C=0.3)"] = disagreement_auc(fitted.multinomial_gain(val, 0.3)[:, j], d[:, j])
        auc[w]["disagreement share"] = float((d[:, j] != 0).mean())
    return {"reference_routing_at_15": shares_at_budget(rule, ens, val, best, 0.15), "gain_auc": auc}


def val_choice(rows: dict) -> str:
    """Best val accuracy at ≤ 15 %, ties by ≤ 50 %; the reference is not a candidate."""
    return max((n for n in rows if n != REFERENCE), key=lambda n: (rows[n]["val_acc_at_15"], rows[n]["val_acc_at_50"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the test read-out")
    parser.add_argument("--out", type=Path, default=RESULTS / "k_worker_goal15_gain.json")
    parser.add_argument("--diagnostics", action="store_true",
                        help="only add val diagnostics (routing shares, gain-ranking AUCs) to the existing --out file")
    parser.add_argument("--test", action="store_true",
                        help="after the val read-outs, read val's choice and the reference on test, once, per seed")
    args = parser.parse_args(argv)

    data, split, book, train, val, acc, best, ref = val_reference(args.data)
    rule = make_router("knn")  # the shared q̂ − λ·c rule and its knob grid
    start = time.perf_counter()
    fitted = Fitted(train, seed=0)
    if args.diagnostics:  # val only; the earlier run's rows and test read-out are kept as they are
        import json

        result = json.loads(args.out.read_text(encoding="utf-8"))
        result["val_diagnostics"] = diagnostics(fitted, val, rule, best)
        result["diagnostics_command"] = "python experiments/k_worker_goal15_gain.py " + " ".join(
            sys.argv[1:] if argv is None else argv)
        write_json_atomic(result, args.out)
        write_text_atomic(markdown(result, data.workers[best], float(acc[best])), args.out.with_suffix(".md"))
        return 0
    rows = {}
    for name, predict in candidates().items():
        r = readout(rule, predict(fitted, val), predict(fitted, val), val, val, ref, ref)
        rows[name] = {"val_acc_at_15": r["acc_at_15"], "val_acc_at_50": r["acc_at_50"], "val_best_accuracy": r["best_accuracy"]}
        print(f"{name:52s} val ≤15%: {r['acc_at_15']:.3f}  ≤50%: {r['acc_at_50']:.3f}", flush=True)
    choice = val_choice(rows)
    result = {
        "benchmark": "k_worker_goal15_gain", "issue": 28, "price_book": book, "seed": 0,
        "n": {"train": len(train), "val": len(val)},
        "val_best_single": {"worker": data.workers[best], "accuracy": float(acc[best]), "usd_per_query": ref},
        "protocol": ("k_worker_routing's seeded split; candidates fitted on train (seed 0) and read on val only; budgets "
                     "are fractions of val's best single model's val cost; val's choice = best val ≤ 15 % (ties ≤ 50 %)"),
        "rows": rows, "val_choice": choice, "val_seconds": time.perf_counter() - start, "test": None,
        "command": "python experiments/k_worker_goal15_gain.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    # How far val's margin over the reference is from val's own sampling noise: paired bootstrap of the
    # difference at ≤ 15 %, the same resamples for both (the fits held fixed).
    table = candidates()
    diff = (at_budget_resamples(rule, table[choice](fitted, val), val, best, 0.15)
            - at_budget_resamples(rule, table[REFERENCE](fitted, val), val, best, 0.15))
    result["val_choice_minus_reference_at_15"] = {"mean": float(diff.mean()),
                                                  "ci95": [float(v) for v in np.percentile(diff, [2.5, 97.5])]}
    print(f"val's choice: {choice}; minus the reference at ≤ 15 %: {result['val_choice_minus_reference_at_15']}", flush=True)
    if args.test:
        result["test"] = read_on_test(choice, data, split, train, val, rule, args.seeds, first=fitted)
    write_json_atomic(result, args.out)
    write_text_atomic(markdown(result, data.workers[best], float(acc[best])), args.out.with_suffix(".md"))
    return 0


def read_on_test(choice: str, data, split, train, val, rule, seeds, first: Fitted) -> dict:
    """The val choice and the reference on test, refitted per seed, k_worker_routing's read-out averaged
    over seeds (its seed spreads kept)."""
    test = data.subset(np.flatnonzero(split == "test"))
    acc_t, usd_t = test.scores.mean(axis=0), test.costs.mean(axis=0)
    best = metrics.best_single(usd_t, acc_t)
    ref_test, ref_val = float(usd_t[best]), float(val.costs.mean(axis=0)[best])
    table = candidates()
    out = {"val_chosen": choice, "seeds": list(seeds),
           "best_single": {"worker": data.workers[best], "accuracy": float(acc_t[best])}}
    for name in (choice, REFERENCE):
        per_seed = []
        for seed in seeds:
            fitted = first if seed == first.seed else Fitted(train, seed)
            per_seed.append(readout(rule, table[name](fitted, val), table[name](fitted, test), val, test, ref_val,
                                    ref_test, best=best))
        out[name] = mean_rows(per_seed)
        print(f"TEST {name}: {out[name]}", flush=True)
    return out


def markdown(result: dict, best_worker: str, best_acc: float) -> str:
    lines = [f"val's best single model: {best_worker} {best_acc:.3f}", "",
             "| candidate (fitted on train, read on val) | val ≤ 15 % | val ≤ 50 % | val best |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['val_acc_at_15']:.3f} | {r['val_acc_at_50']:.3f} | {r['val_best_accuracy']:.3f} |"
              for name, r in result["rows"].items()]
    margin = result["val_choice_minus_reference_at_15"]
    lines += ["", f"Val's choice: {result['val_choice']}; its val accuracy at ≤ 15 % minus the reference's: "
                  f"{margin['mean']:+.3f}, paired 95 % bootstrap interval [{margin['ci95'][0]:+.3f}, {margin['ci95'][1]:+.3f}] "
                  "(1,000 resamples of the val queries, fits held fixed)."]
    t = result["test"]
    if t:
        lines += ["", f"On **test**, read once after the val choice, seeds {t['seeds']} (test's best single model "
                      f"{t['best_single']['worker']} {t['best_single']['accuracy']:.3f}):", "",
                  "| router | ≤ 15 % | ≤ 50 % | val-chosen ≤ 15 % (cost) | gap ≤ 15 % [95 % CI] | gap ≤ 50 % [95 % CI] "
                  "| cost to match the best single |", "|---|---|---|---|---|---|---|"]
        for n in (t["val_chosen"], REFERENCE):
            r = t[n]
            match = "—" if r["cost_ratio_to_match_best"] is None else f"{100 * r['cost_ratio_to_match_best']:.1f} %"
            lines.append(f"| {n} | {r['acc_at_15']:.3f} | {r['acc_at_50']:.3f} | {r['val_chosen_acc_at_15']:.3f} "
                         f"({100 * r['val_chosen_cost_ratio_at_15']:.1f} %) | [{r['gap_at_15_lo']:+.3f}, "
                         f"{r['gap_at_15_hi']:+.3f}] | [{r['gap_at_50_lo']:+.3f}, {r['gap_at_50_hi']:+.3f}] | {match} |")
    diag = result.get("val_diagnostics")
    if diag:
        lines += ["", "Val diagnostics (seed-0 fits): where the reference's most accurate point within ≤ 15 % sends "
                      "the val queries:", "", "| worker | share | its accuracy there | gemma's accuracy there |",
                  "|---|---|---|---|"]
        lines += [f"| {w} | {r['share']:.3f} | {r['accuracy']:.3f} | {r['cheap_accuracy_there']:.3f} |"
                  for w, r in diag["reference_routing_at_15"].items()]
        names = list(next(iter(diag["gain_auc"].values())))
        lines += ["", "AUC of each estimator's gain over gemma on the val queries where the two disagree:", "",
                  "| worker | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        lines += [f"| {w} | " + " | ".join("—" if v is None else f"{v:.3f}" for v in r.values()) + " |"
                  for w, r in diag["gain_auc"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
