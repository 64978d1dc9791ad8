"""The validation read-outs behind the lexical routers' settings (issue 28; models/kworkers/lexical.py).

    cd <repo> && nice -n 19 env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 \\
        python experiments/k_worker_lexical_val.py [--data ../shared/data] [--skip-hgb]

Protocol: k_worker_routing's table and seeded split; every candidate is fitted on train (seed 0) and
read on **val** only (test is never loaded into a read-out here): accuracy at ≤ 15 % / ≤ 50 % of
val's best single model's val cost, and the best on the curve. It records what the registry's
defaults were chosen from:
- `lexical`'s C over a grid, against inner-fold log loss's choice (sklearn's LogisticRegressionCV on
  the same features), and without the MiniLM block;
- kNN's k (sentence vectors and TF-IDF) over a grid, against leave-one-out Brier's choice;
- which members `lexical_ensemble` averages, and the stack of the same three;
- per-worker HistGradientBoosting on a TruncatedSVD of the TF-IDF ⊕ MiniLM ⊕ markers, alone and in
  the mean (not adopted).
Writes experiments/results/k_worker_lexical_val.json and .md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluation.kworker_readout import readout, val_reference  # noqa: E402
from models.baselines.knn import KNNRouter  # noqa: E402
from models.kworkers.lexical import LexicalKNNRouter, LexicalLogisticRouter  # noqa: E402
from models.registry import make_router  # noqa: E402
from routerops.schema import write_json_atomic, write_text_atomic  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

C_GRID = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
K_GRID = (20, 40, 80, 160)


def inner_cv_quality(router: LexicalLogisticRouter, train, val, seed: int = 0) -> tuple[np.ndarray, list[float]]:
    """`lexical`'s features with C chosen per worker by 5-fold log loss on train (what fit_outcome_model does)."""
    from sklearn.linear_model import LogisticRegressionCV

    x_train = router.featurizer.fit(train).transform(train)
    x_val = router.featurizer.transform(val)
    cols, chosen = [], []
    for j in range(len(train.workers)):
        y = (train.scores[:, j] > 0.5).astype(int)
        model = LogisticRegressionCV(Cs=np.logspace(-2, 1, 7), cv=5, scoring="neg_log_loss", max_iter=3000,
                                     random_state=seed).fit(x_train, y)
        cols.append(model.predict_proba(x_val)[:, 1])
        chosen.append(float(model.C_[0]))
    return np.stack(cols, axis=1), chosen


def hgb_quality(train, val, seed: int = 0) -> np.ndarray:
    """Per-worker gradient-boosted trees on a 100-d SVD of the TF-IDF blocks ⊕ MiniLM ⊕ markers."""
    from sklearn.decomposition import TruncatedSVD
    from sklearn.ensemble import HistGradientBoostingClassifier

    feats = LexicalLogisticRouter().featurizer.fit(train)
    svd = TruncatedSVD(100, random_state=seed).fit(feats.text_vectors(train.queries))

    def dense(data):
        stats = (feats.stats(data.queries) - feats.mean_) / feats.std_
        return np.hstack([svd.transform(feats.text_vectors(data.queries)), data.embeddings, stats])

    x_train, x_val = dense(train), dense(val)
    cols = []
    for j in range(len(train.workers)):
        model = HistGradientBoostingClassifier(learning_rate=0.05, max_iter=300, max_leaf_nodes=15, min_samples_leaf=40,
                                               l2_regularization=1.0, early_stopping=True, validation_fraction=0.15,
                                               n_iter_no_change=20, random_state=seed)
        cols.append(model.fit(x_train, (train.scores[:, j] > 0.5).astype(int)).predict_proba(x_val)[:, 1])
    return np.stack(cols, axis=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--skip-hgb", action="store_true", help="leave out the gradient-boosted trees (slowest)")
    parser.add_argument("--out", type=Path, default=RESULTS / "k_worker_lexical_val.json")
    args = parser.parse_args(argv)

    data, split, book, train, val, acc, best, ref = val_reference(args.data)
    rule = make_router("knn")  # any one-call router: the shared q̂ − λ·c rule and its knob grid
    rows: dict[str, dict] = {}
    quality: dict[str, np.ndarray] = {}

    def record(name: str, q: np.ndarray, **extra) -> None:
        r = readout(rule, q, q, val, val, ref, ref)
        rows[name] = {"val_acc_at_15": r["acc_at_15"], "val_acc_at_50": r["acc_at_50"],
                      "val_best_accuracy": r["best_accuracy"], **extra}
        quality[name] = q
        print(f"{name:44s} ≤15%: {r['acc_at_15']:.3f}  ≤50%: {r['acc_at_50']:.3f}  best {r['best_accuracy']:.3f}",
              flush=True)

    def fitted(name: str, router) -> None:
        start = time.perf_counter()
        q = router.fit(train).predict_quality(val)
        record(name, q, fit_s=time.perf_counter() - start, k=getattr(router, "k_", None))

    fitted("logistic (MiniLM ⊕ surface)", make_router("logistic"))
    for c in C_GRID:
        fitted(f"lexical C={c:g}", LexicalLogisticRouter(C=c))
    q, chosen = inner_cv_quality(LexicalLogisticRouter(), train, val)
    record("lexical, C by inner 5-fold log loss", q, chosen_C=chosen)
    fitted("lexical C=0.3 without MiniLM", LexicalLogisticRouter(use_embedding=False))
    fitted("knn (k by leave-one-out Brier)", KNNRouter())
    fitted("knn_lexical (k by leave-one-out Brier)", LexicalKNNRouter())
    for k in K_GRID:
        fitted(f"knn k={k}", KNNRouter(k=k))
        fitted(f"knn_lexical k={k}", LexicalKNNRouter(k=k))
    knn, lex, knn_lex = (quality[n] for n in ("knn (k by leave-one-out Brier)", "lexical C=0.3",
                                              "knn_lexical (k by leave-one-out Brier)"))
    record("mean knn + lexical", (knn + lex) / 2)
    record("mean knn + lexical + knn_lexical (lexical_ensemble)", (knn + lex + knn_lex) / 3)
    record("mean knn + lexical + knn_lexical + logistic", (knn + lex + knn_lex + quality["logistic (MiniLM ⊕ surface)"]) / 4)
    fitted("stacked_lexical", make_router("stacked_lexical"))
    if not args.skip_hgb:
        start = time.perf_counter()
        hgb = hgb_quality(train, val)
        record("hgb (SVD-100 of TF-IDF ⊕ MiniLM ⊕ markers)", hgb, fit_s=time.perf_counter() - start)
        record("mean knn + lexical + hgb", (knn + lex + hgb) / 3)

    result = {
        "benchmark": "k_worker_lexical_val", "issue": 28, "price_book": book, "seed": 0,
        "n": {"train": len(train), "val": len(val)},
        "val_best_single": {"worker": data.workers[best], "accuracy": float(acc[best]), "usd_per_query": ref},
        "protocol": ("k_worker_routing's seeded split; every candidate fitted on train (seed 0) and read on val "
                     "only; budgets are fractions of val's best single model's val USD per query"),
        "rows": rows,
        "command": "python experiments/k_worker_lexical_val.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    write_json_atomic(result, args.out)
    lines = ["| candidate (fitted on train, read on val) | ≤ 15 % | ≤ 50 % | best on curve |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['val_acc_at_15']:.3f} | {r['val_acc_at_50']:.3f} | {r['val_best_accuracy']:.3f} |"
              for name, r in rows.items()]
    lines += ["", f"Val's best single model: {data.workers[best]} ({acc[best]:.3f}). Protocol: {result['protocol']}."]
    write_text_atomic("\n".join(lines) + "\n", args.out.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
