"""MTRouter's estimator router on a real two-model logged-outcome table (RouteLLM's GSM8K).

Cross-fitted with routerops.replay_bench (k folds; each fold scored by a router fitted on the
others; every hyper-parameter choice inside a fit uses that fit's training folds only), once per
seed; APGR and CPT(50%)/CPT(80%) as RouteLLM's evaluate.py computes them, with router score
ŝ(q, strong) − ŝ(q, weak). RouteLLM's paper (Table 3) reports APGR 0.622 for its best router on
this table and 0.497 for a random router.

    python benchmarks/mtrouter_replay.py [--data ../shared/data] [--seeds 0 1 2] [--folds 5]
        [--set key=value ...] [--ablations] [--out benchmarks/results/mtrouter_replay.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from models.mtrouter.config import MTRouterConfig  # noqa: E402

PUBLISHED_BEST_APGR = 0.622  # RouteLLM (arXiv 2406.18665) Table 3, GSM8K
PRICE_BOOK = REPO / "configs" / "prices" / "routellm-2024.yaml"


def load_table(data_dir: Path):
    """RouteLLM's GSM8K outcomes (contaminated prompts dropped) as RoutingData, priced."""
    from routerops.envs.replay import import_routellm_gsm8k, to_routing_data
    from routerops.pricing import load_price_book

    frame = import_routellm_gsm8k(data_dir / "routellm" / "gsm8k_responses.csv",
                                  data_dir / "routellm" / "gsm8k_contaminated_prompts.jsonl",
                                  train_path=data_dir / "gsm8k" / "train.jsonl")
    return to_routing_data(frame, load_price_book(PRICE_BOOK))


def parse_overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key] = json.loads(value) if value[:1] in "[{0123456789-tfn" else value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--set", dest="overrides", nargs="*", default=[], help="MTRouterConfig key=value")
    parser.add_argument("--ablations", action="store_true", help="also run the single-turn ablations")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "mtrouter_replay.json")
    args = parser.parse_args(argv)

    import torch

    from models.mtrouter.history import build_history_encoder
    from models.mtrouter.router import MTRouterRouter
    from routerops.replay_bench import evaluate_router

    torch.set_num_threads(1)
    cfg = MTRouterConfig.from_dict(parse_overrides(args.overrides), source="--set")
    data = load_table(args.data)
    encoder = build_history_encoder(cfg)  # shared by every fold's router: each query is embedded once
    started = time.perf_counter()
    row, _ = evaluate_router("mtrouter", lambda seed: MTRouterRouter(cfg, encoder, seed=seed), data,
                             k=args.folds, seeds=args.seeds, n_boot=1000)
    result = {
        "benchmark": "mtrouter_replay",
        "table": "RouteLLM GSM8K (lm-sys/RouteLLM gsm8k_responses.csv, contaminated prompts dropped)",
        "queries": len(data), "workers": list(data.workers),
        "command": "python benchmarks/mtrouter_replay.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "protocol": f"{args.folds}-fold cross-fit per seed, seeds {args.seeds}; metrics averaged over seeds",
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()},
        "published_best_apgr": PUBLISHED_BEST_APGR,
        "mtrouter": {k: (float(v) if isinstance(v, (int, float, np.floating)) else v) for k, v in row.items()},
        "seconds": round(time.perf_counter() - started, 1),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    if args.ablations:
        from models.mtrouter.ablations import replay_ablations

        result["ablations"] = replay_ablations(data, k=args.folds, seeds=args.seeds, base=cfg,
                                               history_encoder=encoder).to_dict("records")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    m = result["mtrouter"]
    print(f"APGR {m['apgr']:.4f} (seed std {m.get('apgr_seed_std', float('nan')):.4f}; 95% CI "
          f"{m.get('apgr_lo', float('nan')):.3f}–{m.get('apgr_hi', float('nan')):.3f})  "
          f"CPT50 {m['cpt50']:.2f}%  CPT80 {m['cpt80']:.2f}%   wrote {args.out}")
    return 0 if m["apgr"] > PUBLISHED_BEST_APGR else 1


if __name__ == "__main__":
    raise SystemExit(main())
