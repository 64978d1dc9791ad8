"""One training of the LM critique-and-route controller (paper 002) at the CPU defaults of params.yaml's
`critique_lm` section, end to end: warm-up SFT from training outcomes → RL through the shared core
(Alg. 1 tree, eq. 14–16) → greedy evaluation on the fixed split's test queries, beside the logistic
router and the cascade at the controller's strong-agent share. Writes wall time, tokens/s (generated
+ trained) and peak memory (max RSS) beside the goal numbers of issue 24.

    OMP_WAIT_POLICY=PASSIVE flock /tmp/routerops-bench.lock nice -n 10 python experiments/critique_lm.py \\
        [--params params.yaml] [--variants with_multipliers] [--corl] [--seeds 0] \\
        [--out experiments/results/critique_lm.json] [--eval-queries N] [--steps S] [--queries-per-step Q] [--corl-steps S]
        [--multiplier-lr η] [--threads T]

`--variants` with no name and `--corl`: the CoRL controller only (no critique warm-up).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep: two shared cores
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import dataclasses  # noqa: E402

from evaluation.critique_lm import run_critique_lm  # noqa: E402
from models.critique.lm_config import load_critique_lm_config  # noqa: E402
from routerops import schema  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--variants", nargs="*", default=["with_multipliers"])
    parser.add_argument("--corl", action="store_true", help="also train and evaluate the CoRL controller")
    parser.add_argument("--seeds", nargs="*", type=int, default=None, help="default: protocol.seeds' first")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "critique_lm.json")
    parser.add_argument("--eval-queries", type=int, default=None, help="protocol.eval_queries (0 = the whole test split)")
    parser.add_argument("--steps", type=int, default=None, help="tree.steps (critique RL steps)")
    parser.add_argument("--queries-per-step", type=int, default=None, help="tree.queries_per_step (|D_b|)")
    parser.add_argument("--corl-steps", type=int, default=None, help="corl.steps")
    parser.add_argument("--multiplier-lr", type=float, default=None, help="rewards.multiplier_lr (dual ascent, ours)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--work", type=Path, default=None,
                        help="keep the adapters here (default: a temporary folder, removed at the end)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch

    torch.set_num_threads(args.threads)
    cfg = load_critique_lm_config(args.params)
    seeds = tuple(args.seeds) if args.seeds else cfg.protocol.seeds[:1]
    protocol = dataclasses.replace(cfg.protocol, seeds=seeds, **({} if args.eval_queries is None else
                                                                  {"eval_queries": args.eval_queries}))
    tree = dataclasses.replace(cfg.tree, **{k: v for k, v in (("steps", args.steps),
                                                                ("queries_per_step", args.queries_per_step)) if v is not None})
    corl_cfg = cfg.corl if args.corl_steps is None else dataclasses.replace(cfg.corl, steps=args.corl_steps)
    rewards = cfg.rewards if args.multiplier_lr is None else dataclasses.replace(cfg.rewards, multiplier_lr=args.multiplier_lr)
    cfg = dataclasses.replace(cfg, protocol=protocol, tree=tree, corl=corl_cfg, rewards=rewards)
    started = time.perf_counter()
    with (contextlib.nullcontext(str(args.work)) if args.work else tempfile.TemporaryDirectory(prefix="critique-lm-")) as work:
        def partial(state: dict) -> None:  # what is known so far, in case the run is cut short
            schema.write_json_atomic({"partial": True, "elapsed_s": time.perf_counter() - started,
                                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                                      **state}, args.out.with_name(args.out.stem + "_partial.json"))

        result = run_critique_lm(cfg, REPO, Path(work), variants=args.variants, corl=args.corl, on_progress=partial)
    result["command"] = " ".join(["python", "experiments/critique_lm.py", *(argv if argv is not None else sys.argv[1:])])
    result["wall_s"] = time.perf_counter() - started
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    result["machine"] = {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                         "torch_threads": torch.get_num_threads(), "cores": os.cpu_count(),
                         "load_average_at_end": os.getloadavg()}
    result["config"] = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    schema.write_json_atomic(result, args.out)
    print(json.dumps(result["summary"], indent=1))
    for seed, run in result["per_seed"].items():
        for name, t in run["training"].items():
            print(f"seed {seed} {name}: {t['seconds']:.0f} s, {t['tokens_per_s']:.1f} tokens/s, "
                  f"adapter change {t['adapter_relative_change']:.4f}, peak {t['peak_rss_mb']:.0f} MB")
    print(f"wall {result['wall_s']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
