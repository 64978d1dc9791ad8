"""Trained elsewhere: fit on two of the nine-model table's query clusters, score the third (issue 28, item 3).

    cd <repo> && nice -n 5 env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 \\
        python experiments/k_worker_transfer.py [--routers knn logistic mf mlp calibrated] [--sample 0.1] [--update]

Protocol: LLMRouter's `cluster_id` (kept by import-llmrouter as dataset `dcrouter/c<k>`) splits the
5,608 queries in three. For each held-out cluster, routers are fitted on every query of the other
two; a seeded `--sample` fraction of the held-out cluster is the "small labelled sample of the
target" (used only by the `+target-cal` variants, which refit CalibratedRouter's calibration maps on
it: `CalibratedRouter.recalibrate`); every variant is scored on the rest of the cluster. Seed 0
(the routers here are deterministic given their data but for inner-fold shuffles).

In-table reference (`--in-cluster`): the same scored queries, cross-fitted inside their own
cluster (5 folds), so the gap to it is what training elsewhere costs.

Two read-outs per (router, held-out cluster):
- APGR (RouteLLM's definition, evaluation.replay.two_worker_metrics) on the two-worker projection
  gemma-2-9b-it (weak, $0.1) vs llama-3.1-nemotron-51b-instruct (strong, $0.9), routers fitted on
  that projection: the issue's off-table goal is APGR ≥ 0.65; each held-out cluster's 95 % bootstrap
  interval, and one for the mean over the three (each cluster resampled on its own);
- nine workers: accuracy at ≤ 15 % / ≤ 50 % of the best single model's cost on the held-out queries.
Writes experiments/results/k_worker_transfer.json (+ .md). `--update` keeps the rows of the routers not
rerun from the existing file (same protocol, same seeded target samples), so adding a router fits only
it. `--pairs first:second ...` adds paired bootstrap intervals of APGR(first) − APGR(second) per
held-out cluster and for the mean over the three (`paired_rows`; both routers rerun in that run, so
their quality matrices are at hand; `--update` keeps the file's other pairs). An ensemble of
`models.registry.ENSEMBLES` is scored as the mean of its members' predictions, each member fitted
once per (held-out part, workers) however many listed routers share it.

`--protocol gsm8k-steps` (issue 28's "GSM8K → MATH-500 style" transfer): MATH-500 in ../shared has
problems but no logged outcomes of any model, let alone RouteLLM's two, so no router can be scored
on it. The nearest honest substitute is RouteLLM's own GSM8K table (Mixtral-8x7B vs GPT-4-1106,
1,307 kept prompts) split by a property that moves the distribution the way MATH-500 does, towards
longer, harder problems: the number of calculator steps (`<<…>>` annotations) in GSM8K's reference
solution (row i of the table is line i of gsm8k/test.jsonl). Source: ≤ 3 steps (797 prompts,
Mixtral right on 0.693, GPT-4 on 0.878); target: ≥ 4 steps (510 prompts, 0.551 / 0.825). Both
directions are run (easy → hard, hard → easy). As above, a seeded `--sample` of the target is the
labelled target sample only the `+target-cal` variants read, and `--in-cluster` routers are also
cross-fitted (5 folds) inside the scored target queries as the in-table reference. Costs are the
prompt's tokens under RouteLLM's price book (completion tokens zeroed: a router must not read the
logged answer's length). Writes experiments/results/k_worker_transfer_gsm8k.json (+ .md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluation import kworker_readout as kw  # noqa: E402
from evaluation.replay import (cross_fit, knob_grid, operating_points, resample_counts, strong_call_score, strong_weak,  # noqa: E402
                               two_worker_metrics)
from routerops import metrics  # noqa: E402
from models.base import RoutingData  # noqa: E402
from models.kworkers import CalibratedRouter  # noqa: E402
from models.registry import ENSEMBLES, make_router  # noqa: E402
from routerops.schema import write_json_atomic, write_text_atomic  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

WEAK, STRONG = "gemma-2-9b-it", "llama-3.1-nemotron-51b-instruct"
IN_CLUSTER = "[in-cluster 5-fold]"  # suffix of the in-table reference rows' router names


def project(data: RoutingData, workers: list[str]) -> RoutingData:
    cols = [data.workers.index(w) for w in workers]
    return RoutingData(query_ids=data.query_ids, queries=data.queries, workers=list(workers),
                       scores=data.scores[:, cols], costs=data.costs[:, cols], embeddings=data.embeddings)


def curve_at_budgets(router, quality: np.ndarray, data: RoutingData) -> dict:
    acc_s, usd_s = data.scores.mean(axis=0), data.costs.mean(axis=0)
    best = int(np.lexsort((usd_s, -acc_s))[0])
    ops = operating_points(router, quality, data, knob_grid(router, quality, data.costs))
    acc, usd = ops.correct.mean(axis=1), ops.paid.mean(axis=1)
    out = {"best_single_accuracy": float(acc_s[best])}
    for f in kw.BUDGETS:
        out[f"acc_at_{round(100 * f)}"] = kw.at_budget(acc, usd, f * float(usd_s[best]))
    return out


def apgr_resamples(quality: np.ndarray, data: RoutingData, n_boot: int = 1000,
                   counts: np.ndarray | None = None) -> np.ndarray:
    """(n_boot,) APGR on bootstrap resamples of the scored queries (NaN where undefined): `counts`
    (n_boot × n draws per query) if given, else seed 0's, so every router scored on the same queries
    is read on the same resamples."""
    strong, weak = strong_weak(data)
    counts = resample_counts(len(data), n_boot, 0) if counts is None else counts
    return metrics.apgr_of_resamples(strong_call_score(quality, data), data.scores[:, strong], data.scores[:, weak],
                                     counts)


def paired_resamples(quality: np.ndarray, other: np.ndarray, data: RoutingData, n_boot: int = 1000) -> np.ndarray:
    """(n_boot,) APGR(quality) − APGR(other), both read on one draw of resamples of the scored queries
    (seed 0, as each router's own interval; fits held fixed): paired bootstrap resampling, as Koehn
    (2004, "Statistical Significance Tests for Machine Translation Evaluation") compares two systems
    on one test set. The query-to-query variation the two routers share cancels in each replicate,
    which the overlap of their separate intervals cannot show."""
    counts = resample_counts(len(data), n_boot, 0)
    return apgr_resamples(quality, data, counts=counts) - apgr_resamples(other, data, counts=counts)


# 95 % percentile interval of bootstrap replicates, undefined (NaN) ones dropped: k_worker_routing's.
percentile_interval = kw.percentile_95


def apgr_interval(quality: np.ndarray, data: RoutingData, n_boot: int = 1000) -> tuple[float, float]:
    """95 % percentile bootstrap interval of APGR over resamples of the scored queries."""
    return percentile_interval(apgr_resamples(quality, data, n_boot))


def mean_interval(by_part: dict[str, np.ndarray], parts: list[str]) -> tuple[float, float] | None:
    """95 % interval of the mean APGR over held-out parts: the parts' queries are disjoint, so each is
    resampled on its own and replicate b's mean is the mean of the parts' replicates b (a stratified
    bootstrap, Efron & Tibshirani 1993 §8.2). None unless every part was scored."""
    if any(p not in by_part for p in parts):
        return None
    return percentile_interval(np.mean([by_part[p] for p in parts], axis=0))


def paired_rows(pairs: list[tuple[str, str]], quality: dict, scored: dict, parts: list[str]) -> list[dict]:
    """Per pair (first, second) and held-out part, and for the mean over the parts: APGR(first) −
    APGR(second) on the same scored queries with its 95 % paired bootstrap interval (`paired_resamples`;
    the mean's replicates averaged over the parts as `mean_interval`'s). `quality[name, part]` is a
    router's two-worker predicted quality on `scored[part]`."""
    rows = []
    for first, second in pairs:
        diffs, points = {}, {}
        for part in parts:
            data = scored[part]
            diffs[part] = paired_resamples(quality[first, part], quality[second, part], data)
            points[part] = two_worker_metrics(quality[first, part], data)["apgr"] - \
                two_worker_metrics(quality[second, part], data)["apgr"]
            rows.append(_difference_row(first, second, part, points[part], percentile_interval(diffs[part])))
        rows.append(_difference_row(first, second, "mean", float(np.mean(list(points.values()))),
                                    mean_interval(diffs, parts)))
    return rows


def _difference_row(first: str, second: str, part: str, difference: float, interval: tuple[float, float]) -> dict:
    row = {"first": first, "second": second, "held_out": part, "apgr_difference": difference,
           "lo": interval[0], "hi": interval[1]}
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return row


def difference_table(differences: list[dict]) -> str:
    """Markdown: one line per pair, one column per held-out part (and the mean): difference [lo, hi]."""
    import pandas as pd

    frame = pd.DataFrame(differences)
    frame["pair"] = frame["first"] + " − " + frame["second"]
    frame["cell"] = [f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for d, lo, hi in zip(frame.apgr_difference, frame.lo, frame.hi)]
    return frame.pivot(index="pair", columns="held_out", values="cell").to_markdown()


def fitted(name: str, train: RoutingData, sample: RoutingData):
    """(router, fitted on train) for a registry name, or for '<calibrated name>+target-cal' the same
    router with its calibration maps refitted on the target sample."""
    base, _, variant = name.partition("+")
    router = make_router(base, 0).fit(train)
    if variant == "target-cal":
        if not isinstance(router, CalibratedRouter):
            raise ValueError(f"{name}: only calibrated routers recalibrate")
        router.recalibrate(sample)
    return router


def quality_of(name: str, train: RoutingData, sample: RoutingData, scored: RoutingData, memo: dict) -> np.ndarray:
    """`name`'s predicted quality on `scored`, fitted on `train` (see `fitted`), memoised in `memo`
    (one dict per train / scored pair). An ensemble is its members' mean, as EnsembleRouter and
    k_worker_routing.predictions compute it, so a member listed on its own is not fitted twice."""
    if name not in memo:
        if name in ENSEMBLES:
            memo[name] = np.mean([quality_of(m, train, sample, scored, memo) for m in ENSEMBLES[name]], axis=0)
        else:
            memo[name] = fitted(name, train, sample).predict_quality(scored)
    return memo[name]


def merged_rows(out: Path, rows: list[dict], fraction: float) -> list[dict]:
    """`--update`: the existing file's rows of every router not in `rows`, then `rows`."""
    if not out.is_file():
        raise FileNotFoundError(f"--update: {out} does not exist; run without --update first")
    old = json.loads(out.read_text(encoding="utf-8"))
    if old.get("sample_fraction") != fraction:
        raise ValueError(f"--update: {out} was written with --sample {old.get('sample_fraction')}, not {fraction}")
    rerun = {r["router"] for r in rows}
    return [r for r in old["rows"] if r["router"] not in rerun] + rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--routers", nargs="+", default=["random", "knn", "logistic", "mf", "mlp", "calibrated",
                                                          "calibrated+target-cal", "calibrated_ensemble",
                                                          "calibrated_ensemble+target-cal"])
    parser.add_argument("--in-cluster", nargs="*", default=["knn", "logistic"],
                        help="routers also cross-fitted inside the held-out cluster (5 folds): the in-table reference")
    parser.add_argument("--sample", type=float, default=0.1, help="share of the target cluster given as labels")
    parser.add_argument("--out", type=Path, default=None, help="default: experiments/results/k_worker_transfer[_gsm8k].json")
    parser.add_argument("--protocol", choices=["clusters", "gsm8k-steps"], default="clusters")
    parser.add_argument("--update", action="store_true",
                        help="keep the existing --out file's rows of the routers not rerun (adds routers to its tables)")
    parser.add_argument("--pairs", nargs="*", type=kw.parse_pair, default=[], metavar="FIRST:SECOND",
                        help="clusters protocol: paired bootstrap intervals of APGR(first) − APGR(second); both routers "
                             "must be scored in this run (--routers, or '<name> [in-cluster 5-fold]' of --in-cluster)")
    args = parser.parse_args(argv)
    if args.protocol == "gsm8k-steps":
        return gsm8k_steps(args)
    kw.check_pairs(parser, args.pairs, {*args.routers, *(f"{n} {IN_CLUSTER}" for n in args.in_cluster)})
    args.out = args.out or RESULTS / "k_worker_transfer.json"

    data, _, book = kw.load_table(args.data)
    import pandas as pd

    frame = pd.read_parquet(kw.CACHE / "dcrouter.parquet")
    cluster = frame.drop_duplicates("query_id").set_index("query_id")["dataset"].reindex(data.query_ids).to_numpy()
    rows, boots = [], {}  # boots: router → held-out cluster → its bootstrap APGRs
    two_quality, two_scored = {}, {}  # (router, held-out cluster) → two-worker quality; cluster → its scored queries
    parts = sorted(set(cluster))
    for held in parts:
        source = np.flatnonzero(cluster != held)
        target = np.flatnonzero(cluster == held)
        rng = np.random.default_rng(0)
        sample_rows = np.sort(rng.choice(target, size=int(round(args.sample * len(target))), replace=False))
        scored_rows = np.setdiff1d(target, sample_rows)
        for k_workers in ("two", "nine"):
            view = project(data, [WEAK, STRONG]) if k_workers == "two" else data
            train, sample, scored = view.subset(source), view.subset(sample_rows), view.subset(scored_rows)
            memo: dict = {}
            for name in args.routers:
                quality = quality_of(name, train, sample, scored, memo)
                row = {"held_out": held, "workers": k_workers, "router": name, "n_train": len(train),
                       "n_scored": len(scored)}
                if k_workers == "two":
                    row.update(two_worker_metrics(quality, scored))
                    boots.setdefault(name, {})[held] = values = apgr_resamples(quality, scored)
                    two_quality[name, held], two_scored[held] = quality, scored
                    row["apgr_lo"], row["apgr_hi"] = percentile_interval(values)
                else:
                    row.update(curve_at_budgets(make_router(name.partition("+")[0], 0), quality, scored))
                rows.append(row)
                print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        # In-table reference: the same scored queries, each scored by a router fitted on the other
        # folds of its own cluster, so "what transfer costs" is the gap between the two rows.
        view = project(data, [WEAK, STRONG]).subset(scored_rows)
        for name in args.in_cluster:
            quality = cross_fit(view, lambda seed, _n=name: make_router(_n, seed), k=5, seed=0)
            row = {"held_out": held, "workers": "two", "router": f"{name} {IN_CLUSTER}", "n_train": len(view) - len(view) // 5,
                   "n_scored": len(view), **two_worker_metrics(quality, view)}
            boots.setdefault(row["router"], {})[held] = values = apgr_resamples(quality, view)
            two_quality[row["router"], held] = quality
            row["apgr_lo"], row["apgr_hi"] = percentile_interval(values)
            rows.append(row)
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    mean_ci = {name: ci for name, by_part in boots.items() if (ci := mean_interval(by_part, parts))}
    differences = paired_rows(args.pairs, two_quality, two_scored, parts)
    if args.update:
        rows = merged_rows(args.out, rows, args.sample)
        old = json.loads(args.out.read_text(encoding="utf-8"))
        mean_ci = {**{r: ci for r, ci in old.get("apgr_mean_95ci", {}).items() if r in {row["router"] for row in rows}},
                   **mean_ci}
        differences = [d for d in old.get("apgr_paired_differences", [])
                       if (d["first"], d["second"]) not in args.pairs] + differences
    table = pd.DataFrame(rows)
    two_rows = table[table.workers == "two"]
    two = two_rows.pivot(index="router", columns="held_out", values="apgr")
    two["mean"] = two.mean(axis=1)
    two["mean 95% CI"] = [f"[{mean_ci[r][0]:.3f}, {mean_ci[r][1]:.3f}]" if r in mean_ci else "" for r in two.index]
    ci = two_rows.assign(ci=[f"[{lo:.3f}, {hi:.3f}]" for lo, hi in zip(two_rows.apgr_lo, two_rows.apgr_hi)])
    two = two.round(3).join(ci.pivot(index="router", columns="held_out", values="ci").add_suffix(" 95% CI"))
    nine = table[table.workers == "nine"].groupby("router")[["acc_at_15", "acc_at_50", "best_single_accuracy"]].mean()
    result = {"benchmark": "k_worker_transfer", "issue": 28, "price_book": book, "sample_fraction": args.sample,
              "weak": WEAK, "strong": STRONG, "rows": rows, "apgr_mean_95ci": mean_ci,
              "apgr_paired_differences": differences,
              "apgr_by_held_out_cluster": two.reset_index().to_dict("records"),
              "nine_workers_mean_over_held_out": nine.reset_index().to_dict("records"),
              "machine": f"OMP/MKL 1 thread, nice {os.nice(0)}, beside another CPU job"}
    write_json_atomic(result, args.out)
    md = ["APGR (gemma-2-9b-it vs nemotron-51b), fitted on two clusters, scored on the third "
          f"(less a {args.sample:.0%} target sample):", "", two.to_markdown(), "",
          "Nine workers, mean over held-out clusters (accuracy at ≤ 15 % / ≤ 50 % of the best single model's cost):",
          "", nine.round(3).to_markdown()]
    if differences:
        md += ["", "Paired differences of APGR, first − second, on the same scored queries (95 % paired bootstrap "
               "intervals; the mean's stratified over the held-out clusters):", "", difference_table(differences)]
    write_text_atomic("\n".join(md) + "\n", args.out.with_suffix(".md"))
    print("\n".join(md))
    return 0


# ---------------------------------------------------------------- GSM8K split by solution length


GSM8K_MAX_EASY_STEPS = 3  # ≤ 3 calculator steps: source; ≥ 4: target (see the module docstring)


def load_routellm_gsm8k(data_dir: Path) -> tuple[RoutingData, np.ndarray]:
    """RouteLLM's GSM8K table as RoutingData (prompt-only costs, no responses) and each query's number
    of calculator steps in GSM8K's reference solution."""
    import json

    from evaluation.replay import to_routing_data
    from models.embeddings import default_encoder
    from routerops.envs.replay import import_routellm_gsm8k
    from routerops.pricing import load_price_book

    src = data_dir / "routellm"
    frame = import_routellm_gsm8k(src / "gsm8k_responses.csv", src / "gsm8k_contaminated_prompts.jsonl")
    # Completion tokens would price the logged answer's length into every query's cost, which the
    # routers read at decision time: zero them, so a cost is the prompt's alone.
    frame = frame.assign(completion_tokens=0).drop(columns=["response"])
    data = to_routing_data(frame, load_price_book(REPO / "configs" / "prices" / "routellm-2024.yaml"),
                           embed=default_encoder().encode)
    lines = (data_dir / "gsm8k" / "test.jsonl").read_text(encoding="utf-8").splitlines()
    steps = np.array([json.loads(lines[int(q.rsplit("/", 1)[1])])["answer"].count("<<") for q in data.query_ids])
    return data, steps


def gsm8k_steps(args) -> int:
    import pandas as pd

    data, steps = load_routellm_gsm8k(args.data)
    easy = steps <= GSM8K_MAX_EASY_STEPS
    rows = []
    for direction, source_mask in (("easy→hard", easy), ("hard→easy", ~easy)):
        source, target = np.flatnonzero(source_mask), np.flatnonzero(~source_mask)
        rng = np.random.default_rng(0)
        sample_rows = np.sort(rng.choice(target, size=int(round(args.sample * len(target))), replace=False))
        scored_rows = np.setdiff1d(target, sample_rows)
        train, sample, scored = data.subset(source), data.subset(sample_rows), data.subset(scored_rows)
        memo: dict = {}
        for name in args.routers:
            quality = quality_of(name, train, sample, scored, memo)
            rows.append(_apgr_row(direction, name, len(train), scored, quality))
        for name in args.in_cluster:
            quality = cross_fit(scored, lambda seed, _n=name: make_router(_n, seed), k=5, seed=0)
            rows.append(_apgr_row(direction, f"{name} [in-target 5-fold]", len(scored) - len(scored) // 5, scored,
                                  quality))
    out = args.out or RESULTS / "k_worker_transfer_gsm8k.json"
    if args.update:
        rows = merged_rows(out, rows, args.sample)
    table = pd.DataFrame(rows)
    apgr = table.pivot(index="router", columns="direction", values="apgr")
    apgr["mean"] = apgr.mean(axis=1)
    ci = table.assign(ci=[f"[{lo:.3f}, {hi:.3f}]" for lo, hi in zip(table.apgr_lo, table.apgr_hi)])
    apgr = apgr.round(3).join(ci.pivot(index="router", columns="direction", values="ci").add_suffix(" 95% CI"))
    result = {"benchmark": "k_worker_transfer", "protocol": "gsm8k-steps", "issue": 28,
              "table": "RouteLLM gsm8k_responses.csv (1,307 kept prompts), Mixtral-8x7B vs GPT-4-1106",
              "split": f"source/target by calculator steps in GSM8K's reference answer: ≤ {GSM8K_MAX_EASY_STEPS} vs more",
              "n": {"easy": int(easy.sum()), "hard": int((~easy).sum())}, "sample_fraction": args.sample, "seed": 0,
              "rows": rows, "apgr": apgr.reset_index().to_dict("records"),
              "machine": f"OMP/MKL 1 thread, nice {os.nice(0)}, beside another CPU job"}
    write_json_atomic(result, out)
    md = [f"APGR (Mixtral-8x7B vs GPT-4-1106) on RouteLLM's GSM8K table, fitted on problems with ≤ "
          f"{GSM8K_MAX_EASY_STEPS} calculator steps and scored on the rest (easy→hard), and the reverse; "
          f"less a {args.sample:.0%} target sample; 95 % bootstrap intervals over the scored queries:", "",
          apgr.to_markdown()]
    write_text_atomic("\n".join(md) + "\n", out.with_suffix(".md"))
    print("\n".join(md))
    return 0


def _apgr_row(direction: str, name: str, n_train: int, scored: RoutingData, quality: np.ndarray) -> dict:
    row = {"direction": direction, "router": name, "n_train": n_train, "n_scored": len(scored),
           **two_worker_metrics(quality, scored)}
    row["apgr_lo"], row["apgr_hi"] = apgr_interval(quality, scored)
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return row


if __name__ == "__main__":
    raise SystemExit(main())
