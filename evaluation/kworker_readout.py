"""The read-outs shared by the K-worker routing studies (experiments/k_worker_*.py, issue 28).

The nine-model table loaded once and cached, each router's predictions cached per (router, seed),
the curve and val-chosen read-outs at the budgets (15 % and 50 % of the best single model's USD per
query), paired bootstrap intervals (Efron & Tibshirani 1993, ch. 13; Koehn 2004), and the JSON +
Markdown writers. The protocol these implement is stated in experiments/k_worker_routing.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from evaluation.replay import knob_grid, operating_points, resample_counts, routing_data_from_table
from models.base import RoutingData
from models.baselines.knn import KNNRouter
from models.registry import ENSEMBLES, make_router, same_predictions
from routerops import metrics
from routerops.envs.llmrouter import import_llmrouter, price_book_from_candidates, write_price_book
from routerops.pricing import load_price_book
from routerops.schema import write_json_atomic, write_text_atomic

REPO = Path(__file__).resolve().parents[1]

CACHE = REPO / ".routerops" / "k_workers"  # fitted tables and predictions, reused across runs
BUDGETS = (0.15, 0.50)
BASELINES = ("random", "cascade", "knn", "logistic", "logistic_tfidf", "mf", "mlp", "ensemble", "mtrouter")
NEW = ("cost_label", "cost_label_mlp", "calibrated", "calibrated_ensemble", "kcascade")
# The routing literature's K-worker routers and the stacked ensembles (models/kworkers).
LITERATURE = ("routerdc", "routerdc_cal", "embedllm", "graphrouter", "stacked", "stacked_all")
# Whole-query lexical features (models/kworkers/lexical.py): TF-IDF word + character n-grams.
LEXICAL = ("lexical", "knn_lexical", "lexical_ensemble", "stacked_lexical")
# kNN on the controller LM's (SmolLM2-135M) vectors of the whole query, alone and with `lexical` (issue 28, item 2)
LM_VECTORS = ("knn_smollm2", "smollm2_ensemble")


def load_table(data_dir: Path) -> tuple[RoutingData, np.ndarray, str]:
    """The imported table (cached as Parquet), its price book, RoutingData with query vectors, and
    each query's split label."""
    src = data_dir / "llmrouter"
    table, prices = CACHE / "dcrouter.parquet", CACHE / "prices.yaml"
    if not table.is_file():
        from routerops.envs.replay import write_logged_outcomes

        write_price_book(price_book_from_candidates(src / "llm_candidates.json"), prices)
        write_logged_outcomes(import_llmrouter(src / "dcrouter_train.json"), table)
    import pandas as pd

    frame = pd.read_parquet(table)
    book = load_price_book(prices)
    data = routing_data_from_table(frame, book)  # vectors from (or into) the on-disk cache
    split = frame.drop_duplicates("query_id").set_index("query_id")["split"].reindex(data.query_ids).to_numpy()
    return data, split, book.version



def val_reference(data_dir: Path) -> tuple:
    """For the scripts that choose on val: (data, split, price book, train, val, val accuracy per
    worker, val's best single worker, its val USD per query: the budgets' reference)."""
    data, split, book = load_table(data_dir)
    train, val = (data.subset(np.flatnonzero(split == name)) for name in ("train", "val"))
    acc, usd = val.scores.mean(axis=0), val.costs.mean(axis=0)
    best = metrics.best_single(usd, acc)
    return data, split, book, train, val, acc, best, float(usd[best])

def predictions(name: str, seed: int, train: RoutingData, scored: RoutingData, refit: bool) -> tuple[np.ndarray, float]:
    """(quality on `scored` of `name` fitted on `train`, seconds), cached on disk per (router, seed,
    rows). Ensembles: the mean of their members' predictions (as the replay harness computes them)."""
    if name in ENSEMBLES:
        parts = [predictions(m, seed, train, scored, refit) for m in ENSEMBLES[name]]
        return np.mean([q for q, _ in parts], axis=0), sum(s for _, s in parts)
    twin = same_predictions(name, scored.responses is not None)
    if twin:
        return predictions(twin, seed, train, scored, refit)
    key = hashlib.sha256(json.dumps([name, seed, train.query_ids, scored.query_ids]).encode()).hexdigest()[:16]
    path = CACHE / "quality" / f"{name}-s{seed}-{key}.npz"
    if path.is_file() and not refit:
        saved = np.load(path)
        return saved["quality"], float(saved["seconds"])
    start = time.perf_counter()
    quality = make_router(name, seed).fit(train).predict_quality(scored)
    seconds = time.perf_counter() - start
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, quality=quality, seconds=seconds)
    return quality, seconds


def at_budget(acc: np.ndarray, usd: np.ndarray, budget: float) -> float | None:
    ok = usd <= budget * (1 + 1e-9)
    return float(acc[ok].max()) if ok.any() else None


def accuracy_at_budget_resampled(ops, counts: np.ndarray, ref_usd: np.ndarray, fraction: float) -> np.ndarray:
    """(B,) the best accuracy among the operating points within `fraction` of the reference's cost,
    on each resample (counts: n × B weights summing to 1 per column); -inf where none is within."""
    acc, usd = ops.correct @ counts, ops.paid @ counts  # (knobs, B)
    within = usd <= fraction * ref_usd[None, :] * (1 + 1e-9)
    return np.where(within, acc, -np.inf).max(axis=0)


def percentile_95(values: np.ndarray) -> tuple:
    """The 2.5th and 97.5th percentiles of the finite replicates; (None, None) when there are none."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None, None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def gap_interval(ops, test: RoutingData, best: int, fraction: float, n_boot: int = 1000, seed: int = 0) -> tuple:
    """95 % percentile interval (Efron & Tibshirani 1993, ch. 13) of accuracy-at-budget minus the best
    single model's accuracy, over resamples of the test queries (paired: both read on each resample;
    the budget is the fraction of the best model's cost on that resample)."""
    counts = resample_counts(len(test), n_boot, seed).T / len(test)  # (n, B)
    ref_acc, ref_usd = test.scores[:, best] @ counts, test.costs[:, best] @ counts
    return percentile_95(accuracy_at_budget_resampled(ops, counts, ref_usd, fraction) - ref_acc)


def difference_interval(ops_a, ops_b, test: RoutingData, best: int, fraction: float, n_boot: int = 1000,
                        seed: int = 0) -> tuple:
    """95 % paired bootstrap interval of accuracy-at-budget of router A minus router B: both read on
    the same resamples of the test queries (the same draw `gap_interval` uses), so the variation of
    the queries they share cancels (Koehn 2004's paired bootstrap), which two separate gap intervals
    cannot show."""
    counts = resample_counts(len(test), n_boot, seed).T / len(test)
    ref_usd = test.costs[:, best] @ counts
    a, b = (accuracy_at_budget_resampled(ops, counts, ref_usd, fraction) for ops in (ops_a, ops_b))
    both = np.isfinite(a) & np.isfinite(b)  # a resample where either has no point within the budget drops out
    return percentile_95(a[both] - b[both])


def shared_grid(router, q_val: np.ndarray, q_test: np.ndarray, val: RoutingData, test: RoutingData) -> np.ndarray:
    """The knob values a read-out sweeps: the router's grid on val and on test, together."""
    return np.unique(np.concatenate([knob_grid(router, q_val, val.costs), knob_grid(router, q_test, test.costs)]))


def operating_points_on_test(router, q_val: np.ndarray, q_test: np.ndarray, val: RoutingData, test: RoutingData):
    """The router's operating points on test, on the knob grid `readout` sweeps."""
    return operating_points(router, q_test, test, shared_grid(router, q_val, q_test, val, test))


def paired_difference(first: str, second: str, seeds, train, scored, val, test, best: int, ref_test: float) -> dict:
    """Accuracy at each budget of `first` minus `second` (mean over seeds) with the paired interval of
    each seed's difference, the interval's ends averaged over seeds as the gap intervals are."""
    nv = len(val)
    per_seed = []
    for seed in seeds:
        ops = []
        for name in (first, second):
            quality, _ = predictions(name, seed, train, scored, refit=False)
            ops.append(operating_points_on_test(make_router(name, seed), quality[:nv], quality[nv:], val, test))
        row = {}
        for f in BUDGETS:
            tag = f"{round(100 * f)}"
            at = [at_budget(o.correct.mean(axis=1), o.paid.mean(axis=1), f * ref_test) for o in ops]
            row[f"difference_at_{tag}"] = None if None in at else at[0] - at[1]
            row[f"difference_at_{tag}_lo"], row[f"difference_at_{tag}_hi"] = difference_interval(*ops, test, best, f)
        per_seed.append(row)
    return {"first": first, "second": second, **mean_rows(per_seed)}


def readout(router, q_val, q_test, val: RoutingData, test: RoutingData, ref_val: float, ref_test: float,
            best: int | None = None) -> dict:
    """Curve and val-chosen read-outs of one fitted router (see the module docstring); with `best`
    (the best single model's column), paired bootstrap intervals of the gap to it at each budget."""
    grid = shared_grid(router, q_val, q_test, val, test)
    ops_t = operating_points(router, q_test, test, grid)
    ops_v = operating_points(router, q_val, val, grid)
    acc_t, usd_t = ops_t.correct.mean(axis=1), ops_t.paid.mean(axis=1)
    acc_v, usd_v = ops_v.correct.mean(axis=1), ops_v.paid.mean(axis=1)
    top = int(np.lexsort((usd_t, -acc_t))[0])
    row = {"best_accuracy": float(acc_t[top]), "cost_ratio_at_best": float(usd_t[top] / ref_test)}
    if best is not None:  # the cheapest operating point at least as accurate as the best single model
        match = acc_t >= float(test.scores[:, best].mean()) - 1e-12
        row["cost_ratio_to_match_best"] = float(usd_t[match].min() / ref_test) if match.any() else None
    for f in BUDGETS:
        tag = f"{round(100 * f)}"
        row[f"acc_at_{tag}"] = at_budget(acc_t, usd_t, f * ref_test)
        if best is not None:
            row[f"gap_at_{tag}_lo"], row[f"gap_at_{tag}_hi"] = gap_interval(ops_t, test, best, f)
        ok = np.flatnonzero(usd_v <= f * ref_val * (1 + 1e-9))
        if ok.size:
            pick = ok[np.lexsort((usd_v[ok], -acc_v[ok]))[0]]
            row[f"val_chosen_acc_at_{tag}"] = float(acc_t[pick])
            row[f"val_chosen_cost_ratio_at_{tag}"] = float(usd_t[pick] / ref_test)
        else:
            row[f"val_chosen_acc_at_{tag}"] = row[f"val_chosen_cost_ratio_at_{tag}"] = None
    return row


def mean_rows(rows: list[dict]) -> dict:
    out = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        if any(v is None for v in values):
            out[key] = None
            continue
        out[key] = float(np.mean(values))
        if len(values) > 1:
            out[f"{key}_seed_std"] = float(np.std(values))
    return out


def markdown(result: dict) -> str:
    def cell(v):
        return "—" if v is None else f"{v:.3f}"

    def signed(v):
        return "—" if v is None else f"{v:+.3f}"

    def ci(r, tag):
        lo, hi = r.get(f"gap_at_{tag}_lo"), r.get(f"gap_at_{tag}_hi")
        return "" if lo is None or hi is None else f"[{lo:+.3f}, {hi:+.3f}]"

    lines = [
        "| router | acc ≤ 15 % cost | acc ≤ 50 % cost | best on curve (cost ratio) | val-chosen ≤ 15 % (cost ratio) "
        "| val-chosen ≤ 50 % (cost ratio) | gap to best single ≤ 15 % [95 % CI] | ≤ 50 % [95 % CI] "
        "| cost ratio to match the best single |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["rows"].items():
        lines.append(
            f"| {name} | {cell(r['acc_at_15'])} | {cell(r['acc_at_50'])} | {cell(r['best_accuracy'])} "
            f"({cell(r['cost_ratio_at_best'])}) | {cell(r.get('val_chosen_acc_at_15'))} "
            f"({cell(r.get('val_chosen_cost_ratio_at_15'))}) | {cell(r.get('val_chosen_acc_at_50'))} "
            f"({cell(r.get('val_chosen_cost_ratio_at_50'))}) | {ci(r, 15)} | {ci(r, 50)} "
            f"| {cell(r.get('cost_ratio_to_match_best'))} |")
    ref = result["best_single"]
    if result.get("paired_differences"):
        lines += ["", "Paired differences of accuracy at a budget (first − second, mean over seeds; 95 % paired "
                  "bootstrap interval of the test queries, its ends averaged over seeds):", "",
                  "| first − second | ≤ 15 % [95 % CI] | ≤ 50 % [95 % CI] |", "|---|---|---|"]
        for d in result["paired_differences"]:
            cells = [f"{signed(d[f'difference_at_{t}'])} [{signed(d[f'difference_at_{t}_lo'])}, "
                     f"{signed(d[f'difference_at_{t}_hi'])}]" for t in ("15", "50")]
            lines.append(f"| {d['first']} − {d['second']} | {cells[0]} | {cells[1]} |")
    lines += ["", f"Best single model on test: {ref['worker']} (accuracy {ref['accuracy']:.3f}, "
              f"${ref['usd_per_query']:.3g} per query). Mean over seeds {result['seeds']}; "
              f"{result['n']['train']} train / {result['n']['val']} val / {result['n']['test']} test queries. "
              f"Protocol: {result['protocol']}"]
    return "\n".join(lines) + "\n"


def updated(result: dict, path: Path) -> dict:
    """`result` with the rows, timings and commands of an earlier run at `path` that it did not redo,
    so one router family can be added without refitting the others. Refused unless the earlier run
    read the same table, split sizes, seeds and best single model (its rows would not be comparable)."""
    if not path.is_file():
        return result
    old = json.loads(path.read_text())
    same = ("price_book", "workers", "seeds", "n", "best_single")
    if any(old.get(k) != result[k] for k in same):
        raise SystemExit(f"--update: {path} was run on another table, split or seeds ({same}); rerun without it")
    rows = {**old["rows"], **result["rows"]}
    # The table's order, whatever order the JSON kept: single models, the oracle, then the routers as
    # the full run lists them (BASELINES, NEW, LITERATURE, LEXICAL), then any other.
    listed = ["oracle", *BASELINES, *NEW, *LITERATURE, *LEXICAL, *LM_VECTORS]
    rank = {**{f"single:{w}": i - len(result["workers"]) for i, w in enumerate(result["workers"])},
            **{name: i for i, name in enumerate(listed)}}
    rows = dict(sorted(rows.items(), key=lambda kv: rank.get(kv[0], len(listed))))
    timings = {**old.get("timings_s", {}), **result["timings_s"]}
    commands = [*old.get("commands", [old["command"]]), result["command"]]
    pairs = {(d["first"], d["second"]): d for d in [*old.get("paired_differences", []),
                                                    *result.get("paired_differences", [])]}
    return {**result, "rows": rows, "timings_s": timings, "commands": commands,
            "paired_differences": list(pairs.values())}


def parse_pair(text: str) -> tuple[str, str]:
    """'first:second' (router names as in the rows, e.g. 'knn:knn [in-cluster 5-fold]'): an argparse type."""
    first, sep, second = text.partition(":")
    if not (first and sep and second):
        raise argparse.ArgumentTypeError(f"{text!r}: expected first:second")
    return first, second


def check_pairs(parser: argparse.ArgumentParser, pairs: list[tuple[str, str]], scored: set[str]) -> None:
    """A parser error unless both routers of every --pairs entry are scored in this run."""
    if missing := {n for pair in pairs for n in pair} - set(scored):
        parser.error(f"--pairs: {sorted(missing)} not scored in this run (add them to --routers)")


def write_result(result: dict, out: Path, render) -> None:
    """A benchmark's JSON and its Markdown rendering (`render(result)`), each written atomically, and
    the Markdown printed."""
    write_json_atomic(result, out)
    text = render(result)
    write_text_atomic(text, out.with_suffix(".md"))
    print(text)



RATE_CLIP = 0.02


def loo_rates(router: KNNRouter) -> np.ndarray:
    """(n_train, w) each training query's mean outcome over its k_ nearest *other* training queries,
    for a fitted KNNRouter (or LexicalKNNRouter): the leave-one-out version of predict_quality."""
    if router.k_ is None:
        raise RuntimeError("loo_rates needs a fitted kNN router")
    n = router.unit_train_.shape[0]
    k = min(router.k_, n - 1)
    nearest = router.top_k(router.unit_train_, min(k + 1, n))
    others = np.stack([router.drop_self(row, i, k) for i, row in enumerate(nearest)])
    return router.scores_[others].mean(axis=1)


def clipped_logit(rates: np.ndarray) -> np.ndarray:
    p = np.clip(rates, RATE_CLIP, 1 - RATE_CLIP)  # a rate of 0 or 1 from k neighbours is not a certainty
    return np.log(p / (1 - p))


def read_on_test(rows: dict, on_val: dict, on_test: dict, rule, val, test, data, also: tuple = ()) -> dict:
    """The candidate with the best val accuracy at ≤ 15 % (the reference excluded) and the reference,
    read on test with k_worker_routing's read-out (budgets and intervals against test's best single
    model, as in its table), and the candidates named in `also` (declared before test is read). Every
    candidate here is deterministic, so one fit stands for its seeds."""
    name = max((n for n in rows if n != "lexical_ensemble (reference)"), key=lambda n: rows[n]["val_acc_at_15"])
    acc_t, usd_t = test.scores.mean(axis=0), test.costs.mean(axis=0)
    best = metrics.best_single(usd_t, acc_t)
    ref_test, ref_val = float(usd_t[best]), float(val.costs.mean(axis=0)[best])
    out = {"val_chosen": name, "best_single": {"worker": data.workers[best], "accuracy": float(acc_t[best])}}
    out["also"] = [n for n in also if n != name]
    for n in (name, *out["also"], "lexical_ensemble (reference)"):
        out[n] = readout(rule, on_val[n], on_test[n], val, test, ref_val, ref_test, best=best)
        print(f"TEST {n}: {out[n]}", flush=True)
    return out


def val_markdown(result: dict, best_worker: str, best_acc: float) -> str:
    """The candidates' val read-outs as a table, then (after --test) the val choice and the reference on test."""
    rows = result["rows"]
    lines = ["| candidate (fitted on train, read on val) | val ≤ 15 % | val ≤ 50 % | val best |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['val_acc_at_15']:.3f} | {r['val_acc_at_50']:.3f} | {r['val_best_accuracy']:.3f} |"
              for name, r in rows.items()]
    if result["test"]:
        t = result["test"]
        lines += ["", f"On **test**, read once after the val choice (test's best single model "
                      f"{t['best_single']['worker']} {t['best_single']['accuracy']:.3f}):", "",
                  "| router | ≤ 15 % | ≤ 50 % | val-chosen ≤ 15 % | gap ≤ 15 % [95 % CI] | cost to match the best single |",
                  "|---|---|---|---|---|---|"]
        for n in (t["val_chosen"], *t.get("also", []), "lexical_ensemble (reference)"):
            r = t[n]
            match = "—" if r["cost_ratio_to_match_best"] is None else f"{100 * r['cost_ratio_to_match_best']:.1f} %"
            lines.append(f"| {n} | {r['acc_at_15']:.3f} | {r['acc_at_50']:.3f} | {r['val_chosen_acc_at_15']:.3f} | "
                         f"[{r['gap_at_15_lo']:+.3f}, {r['gap_at_15_hi']:+.3f}] | {match} |")
    return "\n".join([f"val's best single model: {best_worker} {best_acc:.3f}", ""] + lines) + "\n"


def write_val_run(result: dict, argv, out: Path, best_worker: str, best_acc: float) -> None:
    """The run's command line added to `result`, then its JSON and val_markdown's table, each atomically."""
    script = Path(sys.argv[0]).name if argv is None else f"{result['benchmark']}.py"
    result["command"] = f"python experiments/{script} " + " ".join(sys.argv[1:] if argv is None else argv)
    write_json_atomic(result, out)
    write_text_atomic(val_markdown(result, best_worker, best_acc), out.with_suffix(".md"))
