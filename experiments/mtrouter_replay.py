"""MTRouter's estimator router on a logged-outcome table, cross-fitted (default: RouteLLM's GSM8K).

Cross-fitted with evaluation.replay (k folds; each fold scored by a router fitted on the
others; every hyper-parameter choice inside a fit uses that fit's training folds only), once per
seed. Any table in docs/replay_format.md works (`--table`, priced by `--prices`):

- two workers: APGR and CPT(50%)/CPT(80%) as RouteLLM's evaluate.py computes them, with router
  score ŝ(q, strong) − ŝ(q, weak). Only on RouteLLM's GSM8K table is there a published number to
  beat: APGR 0.622 for RouteLLM's best router (its paper, Table 3; random: 0.497).
- more workers: AIQ (RouterBench), gain over the best single worker and cost saved at its accuracy
  (LLMRouterBench), for MTRouter and for the strongest baseline routers on the same folds, so the
  comparison is like for like.

    python experiments/mtrouter_replay.py [--table T.parquet --prices P.yaml] [--data ../shared/data]
        [--seeds 0 1 2] [--folds 5] [--set key=value ...] [--baselines NAME ...] [--ablations] [--out PATH]

The exit code is 1 only when a published reference exists and MTRouter does not beat it.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from models.mtrouter.config import MTRouterConfig  # noqa: E402

PUBLISHED_BEST_APGR = 0.622  # RouteLLM (arXiv 2406.18665) Table 3, GSM8K
ROUTELLM_WORKERS = frozenset({"gpt-4-1106-preview", "mistralai/Mixtral-8x7B-Instruct-v0.1"})
PRICE_BOOK = REPO / "configs" / "prices" / "routellm-2024.yaml"
RESULTS = REPO / "experiments" / "results"
# The strongest one-call baselines of the router leaderboard, run beside MTRouter on K > 2 tables.
STRONG_BASELINES = ("logistic_tfidf", "knn", "mlp", "mf", "ensemble")
SUMMARY_KEYS = {
    2: ("apgr", "apgr_seed_std", "apgr_lo", "apgr_hi", "cpt50", "cpt80", "aiq"),
    "many": ("aiq", "aiq_seed_std", "aiq_lo", "aiq_hi", "best_accuracy", "usd_per_query_at_best",
             "gain_any_cost", "gain_matched_cost", "cost_saved_vs_best_single"),
}


def load_routellm_gsm8k(data_dir: Path):
    """RouteLLM's GSM8K outcomes (contaminated prompts dropped), in the logged-outcome format."""
    from routerops.envs.replay import import_routellm_gsm8k

    return import_routellm_gsm8k(data_dir / "routellm" / "gsm8k_responses.csv",
                                 data_dir / "routellm" / "gsm8k_contaminated_prompts.jsonl",
                                 train_path=data_dir / "gsm8k" / "train.jsonl")


def is_routellm_gsm8k(frame) -> bool:
    """The one table with a published APGR: GSM8K queries, GPT-4-1106 vs Mixtral-8x7B."""
    return set(frame["dataset"].unique()) == {"gsm8k"} and set(frame["worker"].unique()) == ROUTELLM_WORKERS


def default_out(table: Path | None) -> Path:
    """experiments/results/mtrouter_replay.json for RouteLLM's table, else ..._<table name>.json."""
    if table is None:
        return RESULTS / "mtrouter_replay.json"
    return RESULTS / f"mtrouter_replay_{re.sub(r'[^A-Za-z0-9_.-]+', '_', table.stem)}.json"


def parse_overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key] = json.loads(value) if value[:1] in "[{0123456789-tfn" else value
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, help="logged outcomes (.parquet or .csv); default RouteLLM GSM8K")
    parser.add_argument("--prices", type=Path, help="price book of --table (default: routellm-2024.yaml)")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data",
                        help="folder with routellm/ and gsm8k/ (for the default table)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--set", dest="overrides", nargs="*", default=[], help="MTRouterConfig key=value")
    parser.add_argument("--baselines", nargs="*", default=None,
                        help=f"registry routers to run beside MTRouter (default: {' '.join(STRONG_BASELINES)} "
                             "on tables of more than two workers, none on two; give no name for none)")
    parser.add_argument("--ablations", action="store_true", help="also run the single-turn ablations")
    parser.add_argument("--out", type=Path, help="result JSON (default: derived from the table name)")
    args = parser.parse_args(argv)
    if args.table is not None and args.prices is None:
        parser.error("--table needs --prices: costs are derived from tokens under a price book")
    return args


def load_data(args: argparse.Namespace):
    """(RoutingData priced under the book, table label, whether RouteLLM's published APGR applies)."""
    from evaluation.replay import to_routing_data
    from routerops.envs.replay import load_logged_outcomes
    from routerops.pricing import load_price_book

    if args.table is None:
        frame, label = load_routellm_gsm8k(args.data), \
            "RouteLLM GSM8K (lm-sys/RouteLLM gsm8k_responses.csv, contaminated prompts dropped)"
    else:
        frame, label = load_logged_outcomes(args.table), str(args.table)
    data = to_routing_data(frame, load_price_book(args.prices or PRICE_BOOK))
    return data, label, is_routellm_gsm8k(frame)


def numbers(row: dict) -> dict:
    return {k: (float(v) if isinstance(v, (int, float, np.floating)) else v) for k, v in row.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    import torch

    from models.registry import make_router
    from models.mtrouter.history import build_history_encoder
    from models.mtrouter.router import MTRouterRouter
    from evaluation.replay import evaluate_router
    from routerops.metrics import best_single

    torch.set_num_threads(1)
    cfg = MTRouterConfig.from_dict(parse_overrides(args.overrides), source="--set")
    data, label, has_reference = load_data(args)
    two_workers = len(data.workers) == 2
    baselines = list(args.baselines) if args.baselines is not None else ([] if two_workers else list(STRONG_BASELINES))
    if baselines:  # the baselines read cached MiniLM query embeddings; MTRouter runs its own φ
        from models.embeddings import default_encoder

        data.embeddings = default_encoder().encode(data.queries)
    encoder = build_history_encoder(cfg)  # shared by every fold's router: each query is embedded once
    started = time.perf_counter()
    row, _ = evaluate_router("mtrouter", lambda seed: MTRouterRouter(cfg, encoder, seed=seed), data,
                             k=args.folds, seeds=args.seeds, n_boot=args.bootstrap)
    seconds = round(time.perf_counter() - started, 1)
    others = {name: numbers(evaluate_router(name, lambda seed, n=name: make_router(n, seed), data, k=args.folds,
                                            seeds=args.seeds, n_boot=args.bootstrap)[0])
              for name in baselines}
    cost, acc = data.costs.mean(axis=0), np.nanmean(data.scores, axis=0)
    best = best_single(cost, acc)  # LLMRouterBench's reference worker
    reference = PUBLISHED_BEST_APGR if has_reference else None
    result = {
        "benchmark": "mtrouter_replay",
        "table": label,
        "queries": len(data), "workers": list(data.workers),
        "best_single": {"worker": data.workers[best], "accuracy": float(acc[best]), "usd_per_query": float(cost[best])},
        "command": "python experiments/mtrouter_replay.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "protocol": f"{args.folds}-fold cross-fit per seed, seeds {args.seeds}; metrics averaged over seeds",
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()},
        "published_best_apgr": reference,
        "mtrouter": numbers(row),
        "baselines": others,
        "seconds": seconds,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    if args.ablations:
        from evaluation.replay import replay_ablations

        result["ablations"] = replay_ablations(data, k=args.folds, seeds=args.seeds, base=cfg,
                                               history_encoder=encoder).to_dict("records")
    out = args.out or default_out(args.table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print_summary(result, two_workers)
    print(f"wrote {out}")
    return 1 if reference is not None and not result["mtrouter"]["apgr"] > reference else 0


def print_summary(result: dict, two_workers: bool) -> None:
    keys = SUMMARY_KEYS[2] if two_workers else SUMMARY_KEYS["many"]
    print(f"{result['table']}: {result['queries']} queries x {len(result['workers'])} workers; best single "
          f"{result['best_single']['worker']} (accuracy {result['best_single']['accuracy']:.4f})")
    for name, row in {"mtrouter": result["mtrouter"], **result["baselines"]}.items():
        print(f"  {name:16s} " + "  ".join(f"{k} {row.get(k, float('nan')):.4f}" for k in keys))
    if result["published_best_apgr"] is not None:
        print(f"  published best APGR (RouteLLM) {result['published_best_apgr']}")


if __name__ == "__main__":
    raise SystemExit(main())
