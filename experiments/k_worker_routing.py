"""Iso-cost table of every router family on LLMRouter's nine-model development table (issue 28).

    cd <repo> && nice -n 15 env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 \\
        python experiments/k_worker_routing.py [--data ../shared/data] [--seeds 0 1 2] [--routers NAME ...]

Protocol (fixed, seeded): `routerops import-llmrouter` splits the 5,608 queries by query into
train / val / test = 60 / 20 / 20 % (split seed 0). Every router is fitted on train alone, once per
seed (0, 1, 2: the routers' own randomness, e.g. inner folds, MLP initialisation, the K-worker
routers' internal validation fold, which is carved out of train). Nothing is fitted or tuned on
test. Two read-outs per router, both on test:

- curve: the highest test accuracy among the router's operating points (its knob swept) whose test
  USD per query is ≤ 15 % / ≤ 50 % of the best single model's test USD per query, and the best
  accuracy anywhere on the curve (what issue 28's table reports);
- val-chosen: the operating point picked on val (highest val accuracy whose val cost is within the
  budget), then scored on test: what a deployment that fixes λ in advance gets (its test cost may
  overshoot the budget slightly; the JSON records it).

The best single model is the most accurate on test (ties: cheaper); the oracle (cheapest correct
worker, its λ swept) bounds every router. Query vectors: the shared MiniLM encoder (128-token
window), embedded once into the on-disk SQLite cache (models/embeddings.py). Predictions are cached
per (router, seed) under .routerops/k_workers/, so a rerun only fits what changed (--refit to redo).
Writes experiments/results/k_worker_routing.json and .md; --update keeps the rows of the routers not
named in --routers from the earlier run (same table, split and seeds), so one family can be added alone.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from evaluation.kworker_readout import (  # noqa: E402
    BASELINES, LEXICAL, LITERATURE, LM_VECTORS, NEW, check_pairs, load_table, markdown, mean_rows, paired_difference,
    parse_pair, predictions, readout, updated, write_result,
)
from models.base import RoutingData  # noqa: E402
from models.registry import make_router  # noqa: E402
from routerops import metrics  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--routers", nargs="+", default=[*BASELINES, *NEW, *LITERATURE, *LEXICAL, *LM_VECTORS])
    parser.add_argument("--refit", action="store_true", help="ignore cached predictions")
    parser.add_argument("--out", type=Path, default=RESULTS / "k_worker_routing.json")
    parser.add_argument("--update", action="store_true",
                        help="keep the rows of --out's routers not run now (same table, split and seeds only)")
    parser.add_argument("--pairs", nargs="*", type=parse_pair, default=[], metavar="FIRST:SECOND",
                        help="paired bootstrap intervals of accuracy at each budget, FIRST − SECOND (both in --routers)")
    args = parser.parse_args(argv)
    check_pairs(parser, args.pairs, set(args.routers))

    start = time.perf_counter()
    data, split, book = load_table(args.data)
    embed_s = time.perf_counter() - start
    parts = {name: data.subset(np.flatnonzero(split == name)) for name in ("train", "val", "test")}
    train, val, test = parts["train"], parts["val"], parts["test"]
    scored = RoutingData(query_ids=val.query_ids + test.query_ids, queries=val.queries + test.queries,
                         workers=data.workers, scores=np.vstack([val.scores, test.scores]),
                         costs=np.vstack([val.costs, test.costs]),
                         embeddings=np.vstack([val.embeddings, test.embeddings]))
    nv = len(val)

    acc_t, usd_t = test.scores.mean(axis=0), test.costs.mean(axis=0)
    best = metrics.best_single(usd_t, acc_t)
    ref_test, ref_val = float(usd_t[best]), float(val.costs.mean(axis=0)[best])
    rows: dict[str, dict] = {}
    for j, w in enumerate(data.workers):
        rows[f"single:{w}"] = {"acc_at_15": float(acc_t[j]) if usd_t[j] <= 0.15 * ref_test else None,
                               "acc_at_50": float(acc_t[j]) if usd_t[j] <= 0.5 * ref_test else None,
                               "best_accuracy": float(acc_t[j]), "cost_ratio_at_best": float(usd_t[j] / ref_test)}
    timings = {"load_and_embed_s": embed_s}
    for name in ["oracle", *args.routers]:
        seeds = args.seeds[:1] if name == "oracle" else args.seeds
        per_seed, seconds = [], 0.0
        for seed in seeds:
            quality, took = predictions(name, seed, train, scored, args.refit)
            seconds += took
            per_seed.append(readout(make_router(name, seed), quality[:nv], quality[nv:], val, test, ref_val, ref_test,
                                    best=best))
        rows[name] = mean_rows(per_seed)
        timings[name] = seconds
        r = rows[name]
        print(f"{name:22s} ≤15%: {r['acc_at_15']}  ≤50%: {r['acc_at_50']}  best: {r['best_accuracy']:.3f}  "
              f"val-chosen ≤15%: {r.get('val_chosen_acc_at_15')}  fit {seconds:.0f}s", flush=True)
    result = {
        "benchmark": "k_worker_routing", "issue": 28,
        "table": "LLMRouter dcrouter_train.json (nine models, 5,608 queries), imported by routerops import-llmrouter",
        "price_book": book, "workers": list(data.workers), "seeds": args.seeds,
        "n": {k: len(v) for k, v in parts.items()},
        "protocol": ("fixed seeded split by query (train/val/test 60/20/20, split seed 0); routers fitted on train "
                     "only (their own tuning: inner folds or an internal validation fold carved out of train); "
                     "curve read-outs on test; val-chosen: operating point chosen on val, scored on test; "
                     "budgets are fractions of the best single model's test USD per query"),
        "best_single": {"worker": data.workers[best], "accuracy": float(acc_t[best]), "usd_per_query": ref_test},
        "goal": {"acc_at_15_at_least": float(acc_t[best]), "acc_at_50_at_least": float(acc_t[best]) + 0.03},
        "rows": rows, "timings_s": timings,
        "paired_differences": [paired_difference(a, b, args.seeds, train, scored, val, test, best, ref_test)
                               for a, b in args.pairs],
        "machine": {"python": platform.python_version(), "threads": f"OMP/MKL 1, nice {os.nice(0)}, beside another CPU job"},
        "command": "python experiments/k_worker_routing.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    if args.update:
        result = updated(result, args.out)
    write_result(result, args.out, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
