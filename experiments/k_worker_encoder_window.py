"""What the query encoder's 128-token window costs on the nine-model table (issue 28, item 2).

    cd <repo> && nice -n 5 env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 \\
        python experiments/k_worker_encoder_window.py [--seeds 0 1 2] [--routers knn logistic calibrated_ensemble]

Same split and read-outs as experiments/k_worker_routing.py (fit on train, iso-cost read-outs on
test, operating point chosen on val); only the query vectors differ:
- head: the shared encoder (MiniLM, onnx-int8), first 128 tokens: what every router reads today;
- chunk-mean: models.chunked_embeddings.ChunkPooledEncoder: the whole query in 128-token windows
  (at most 8: the first 7 and the last), mean-pooled.
Writes experiments/results/k_worker_encoder_window.json (+ .md), with the embedding seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluation import kworker_readout as kw  # noqa: E402
from models.chunked_embeddings import ChunkPooledEncoder  # noqa: E402
from models.registry import make_router  # noqa: E402
from routerops.schema import write_json_atomic, write_text_atomic  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--routers", nargs="+", default=["knn", "logistic", "calibrated_ensemble"])
    parser.add_argument("--out", type=Path, default=RESULTS / "k_worker_encoder_window.json")
    args = parser.parse_args(argv)

    data, split, book = kw.load_table(args.data)
    encoder = ChunkPooledEncoder()
    windows = [len(encoder.windows(q)) for q in data.queries]
    start = time.perf_counter()
    chunked = encoder.encode(data.queries)
    chunk_s = time.perf_counter() - start
    variants = {"head-128": data, "chunk-mean-128": dataclasses.replace(data, embeddings=chunked)}
    rows = {}
    for variant, table in variants.items():
        parts = {name: table.subset(np.flatnonzero(split == name)) for name in ("train", "val", "test")}
        train, val, test = parts["train"], parts["val"], parts["test"]
        best = int(np.lexsort((test.costs.mean(axis=0), -test.scores.mean(axis=0)))[0])
        ref_test, ref_val = float(test.costs.mean(axis=0)[best]), float(val.costs.mean(axis=0)[best])
        for name in args.routers:
            per_seed = []
            for seed in args.seeds:
                router = make_router(name, seed).fit(train)
                per_seed.append(kw.readout(router, router.predict_quality(val), router.predict_quality(test),
                                           val, test, ref_val, ref_test))
            rows[f"{name} [{variant}]"] = kw.mean_rows(per_seed)
            r = rows[f"{name} [{variant}]"]
            print(f"{name:20s} {variant:15s} ≤15%: {r['acc_at_15']}  ≤50%: {r['acc_at_50']}  best {r['best_accuracy']:.3f}",
                  flush=True)
    long = np.asarray(windows) > 1
    result = {
        "benchmark": "k_worker_encoder_window", "issue": 28, "seeds": args.seeds, "price_book": book,
        "windows_per_query": {"mean": float(np.mean(windows)), "share_longer_than_one_window": float(long.mean()),
                              "max": int(np.max(windows))},
        "chunk_mean_embedding_s": chunk_s,
        "rows": rows,
        "protocol": "as experiments/k_worker_routing.py; only the query vectors differ",
        "machine": "OMP/MKL 1 thread, nice 5, beside another CPU job",
    }
    write_json_atomic(result, args.out)
    lines = ["| router [vectors] | acc ≤ 15 % | acc ≤ 50 % | best on curve | val-chosen ≤ 15 % |", "|---|---|---|---|---|"]
    fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    for name, r in rows.items():
        lines.append(f"| {name} | {fmt(r['acc_at_15'])} | {fmt(r['acc_at_50'])} | {fmt(r['best_accuracy'])} | "
                     f"{fmt(r.get('val_chosen_acc_at_15'))} |")
    lines.append(f"\n{100 * long.mean():.1f} % of queries exceed one 128-token window (mean {np.mean(windows):.2f} "
                 f"windows per query); chunk-mean embedding took {chunk_s:.0f} s (cache misses only).")
    write_text_atomic("\n".join(lines) + "\n", args.out.with_suffix(".md"))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
