"""Off-policy estimates vs the truth, on RouteLLM's logged GSM8K outcomes (routerops/ope.py validated).

The table logs both workers' outcomes on every query (Mixtral-8x7B and GPT-4-1106, 1307 queries), so
the value any router *would* have had on a set of queries is known exactly by replay. Protocol:

1. Routers are cross-fitted once (k = 5, evaluation/replay.py): every query's q̂ comes from a router
   that never saw it. The champion is `logistic` at the cost weight λ where it calls GPT-4 on about
   half of the queries; challengers: knn and mf at the same λ, logistic at λ/2 (a dearer operating
   point), each single worker, and the random router; plus the champion's own greedy rule.
2. Each simulated log: n queries drawn with replacement from the table (traffic), served by the
   gateway's rule — the champion's greedy choice, or with probability ε a uniformly drawn worker
   (gateway/routing.py) — with the propensity of the call logged and the logged outcome of the called
   worker revealed (its grade and its USD).
3. From that log alone, every challenger's accuracy, USD per request and objective (score − λ·USD)
   by IPS, SNIPS, DR with the router's own q̂ as the direct model (`dr`; single workers and random:
   the champion's logged q̂) and DR with an outcome model fitted on the log (`dr_fitted`), each
   with its 95 % percentile bootstrap interval; truth: the challenger's replay value on the same n
   queries.
4. Over `--logs` logs per ε: bias, RMSE and interval coverage per estimator, metric and ε.

    flock /tmp/routerops-bench.lock nice python experiments/ope_simulation.py --logs 200

writes experiments/results/ope_simulation.json and .png. The same protocol runs on any complete
logged-outcomes table of K workers — the demo's grid (`data/grid/outcomes.parquet` of a `make demo`
root: the embedded pool's single workers on every train task) with its price book:

    python experiments/ope_simulation.py --table ROOT/data/grid/outcomes.parquet \
        --prices ROOT/configs/prices/current.yaml --out experiments/results/ope_simulation_demo_grid.json

With K > 2 workers the champion's λ is where its greedy rule sends half the queries past the
cheapest worker (for K = 2, exactly "calls the dearer worker on half").
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
sys.path.insert(0, str(REPO))

from evaluation.replay import cross_fit, routing_data_from_table  # noqa: E402
from models.registry import make_router  # noqa: E402
from routerops.envs.replay import import_routellm_gsm8k  # noqa: E402
from routerops.ope import BanditLog, OPEConfig, epsilon_greedy, estimate_policies, fit_direct_model  # noqa: E402
from routerops.pricing import load_price_book  # noqa: E402

CHAMPION = "logistic"
GATE_MIN_ESS = 30.0  # `routerops ope --min-ess`'s default: the gate refuses estimates with less
LEARNED = ("knn", "mf")


ROUTELLM_TABLE = "RouteLLM GSM8K (datasets/routellm), 1307 queries × 2 workers, prices configs/prices/routellm-2024.yaml"


def load_data(table: str | None = None, prices: str | None = None):
    """RouteLLM's GSM8K table by default; otherwise a logged-outcomes table (every worker on every
    query, docs/replay_format.md) priced under `prices`."""
    book = load_price_book(prices or REPO / "configs/prices/routellm-2024.yaml")
    if table is None:
        frame = import_routellm_gsm8k(REPO / "datasets/routellm/gsm8k_responses.csv",
                                      REPO / "datasets/routellm/gsm8k_contaminated_prompts.jsonl",
                                      REPO / "datasets/gsm8k/train_first8.jsonl")
        return routing_data_from_table(frame, book)
    return routing_data_from_table(table, book)


def greedy(quality: np.ndarray, mean_cost: np.ndarray, lam: float) -> np.ndarray:
    """The gateway's rule: argmax q̂ − λ·c (ties: the cheaper), c each worker's expected USD per call."""
    rank = np.argsort(np.argsort(mean_cost))
    return np.argmax(quality - lam * mean_cost[None, :] - 1e-9 * rank[None, :], axis=1)


def half_strong_lambda(quality: np.ndarray, mean_cost: np.ndarray) -> float:
    """λ at which the router's greedy rule calls the dearer worker on half of the queries (K = 2),
    or sends half of them past the cheapest worker (K > 2: bisection, the share falls with λ)."""
    if quality.shape[1] == 2:
        strong = int(np.argmax(mean_cost))
        weak = 1 - strong
        return float(np.median((quality[:, strong] - quality[:, weak]) / (mean_cost[strong] - mean_cost[weak])).clip(0))
    cheapest = int(np.argmin(mean_cost))
    low, high = 0.0, 1.0
    while (greedy(quality, mean_cost, high) != cheapest).mean() > 0.5 and high < 1e12:
        high *= 10
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if (greedy(quality, mean_cost, mid) != cheapest).mean() > 0.5 else (low, mid)
    return high


def policies(data, qualities: dict[str, np.ndarray], lam: float, mean_cost: np.ndarray):
    """name → ((N, K) probabilities on the whole table, (N, K) the router's own q̂ for DR or None)."""
    n, k = data.scores.shape
    out = {"champion (greedy)": (np.eye(k)[greedy(qualities[CHAMPION], mean_cost, lam)], qualities[CHAMPION])}
    for name in LEARNED:
        out[name] = (np.eye(k)[greedy(qualities[name], mean_cost, lam)], qualities[name])
    out[f"{CHAMPION} at λ/2"] = (np.eye(k)[greedy(qualities[CHAMPION], mean_cost, lam / 2)], qualities[CHAMPION])
    for j, worker in enumerate(data.workers):
        out[f"single:{worker.split('/')[-1]}"] = (np.eye(k)[np.full(n, j)], None)
    out["random"] = (np.full((n, k), 1.0 / k), None)
    return out


def truth(data, probs: np.ndarray, rows: np.ndarray, lam: float) -> dict[str, float]:
    acc = float((probs[rows] * data.scores[rows]).sum(axis=1).mean())
    usd = float((probs[rows] * data.costs[rows]).sum(axis=1).mean())
    return {"accuracy": acc, "usd": usd, "objective": acc - lam * usd}


def simulate(data, pols, champion_q: np.ndarray, lam: float, epsilon: float, n_logs: int, n_boot: int, seed: int):
    """Per simulated log: every (policy, estimator, metric) estimate, interval and truth."""
    rng = np.random.default_rng(seed)
    n_table, k = data.scores.shape
    champion_choice = pols["champion (greedy)"][0].argmax(axis=1)
    records = []
    for b in range(n_logs):
        rows = rng.integers(0, n_table, n_table)
        mu = epsilon_greedy(champion_choice[rows], np.ones((n_table, k), bool), epsilon)
        action = np.minimum((rng.random(n_table)[:, None] > np.cumsum(mu, axis=1)).sum(axis=1), k - 1)
        log = BanditLog(list(data.workers), action, mu, data.scores[rows, action], data.costs[rows, action])
        targets = {name: probs[rows] for name, (probs, _) in pols.items()}
        usd_model = fit_direct_model(log, champion_q[rows], lam)["usd"]
        own = {}
        for name, (_, q) in pols.items():
            acc = np.clip((q if q is not None else champion_q)[rows], 0, 1)
            own[name] = {"accuracy": acc, "usd": usd_model, "objective": acc - lam * usd_model}
        cfg = OPEConfig(n_boot=n_boot, cost_weight=lam, seed=seed * 100_003 + b, min_support=0.0)
        result = estimate_policies(log, targets, cfg, own)
        fitted = fit_direct_model(log, champion_q[rows], lam, seed=b)
        result_fitted = estimate_policies(log, targets, OPEConfig(**{**cfg.__dict__, "estimators": ("dr",)}),
                                          {name: fitted for name in pols})
        for rec in result_fitted.rows:
            rec["estimator"] = "dr_fitted"
        truths = {name: truth(data, probs, rows, lam) for name, (probs, _) in pols.items()}
        for rec in result.rows + result_fitted.rows:
            t = truths[rec["policy"]][rec["metric"]]
            records.append({"log": b, "epsilon": epsilon, "policy": rec["policy"], "estimator": rec["estimator"],
                            "metric": rec["metric"], "estimate": rec["value"], "truth": t,
                            "covered": bool(rec["ci_low"] <= t <= rec["ci_high"]),
                            "width": rec["ci_high"] - rec["ci_low"], "ess": rec["ess"]})
    return records


def summarise(records: list[dict]) -> list[dict]:
    import pandas as pd

    frame = pd.DataFrame(records)
    frame["error"] = frame.estimate - frame.truth
    scale = frame.groupby(["metric"]).truth.transform(lambda t: np.abs(t).mean())
    frame["rel_error"] = frame.error / scale
    rows = []
    for (eps, estimator, metric), g in frame.groupby(["epsilon", "estimator", "metric"]):
        per_policy = g.groupby("policy")
        rows.append({"epsilon": float(eps), "estimator": estimator, "metric": metric, "logs": int(g.log.nunique()),
                     "bias": float(g.error.mean()), "rmse": float(np.sqrt((g.error ** 2).mean())),
                     "coverage": float(g.covered.mean()),
                     "worst_policy_coverage": float(per_policy.covered.mean().min()),
                     # what the off-policy gate would judge: it refuses an estimate below --min-ess
                     f"coverage_ess{GATE_MIN_ESS:g}": float(g[g.ess >= GATE_MIN_ESS].covered.mean())
                     if (g.ess >= GATE_MIN_ESS).any() else None,
                     f"share_ess{GATE_MIN_ESS:g}": float((g.ess >= GATE_MIN_ESS).mean()),
                     "mean_width": float(g.width.mean()), "mean_ess": float(g.ess.mean())})
    return rows


def per_policy(records: list[dict], epsilon: float, metric: str = "accuracy") -> list[dict]:
    import pandas as pd

    frame = pd.DataFrame(records)
    frame = frame[(frame.epsilon == epsilon) & (frame.metric == metric)]
    frame = frame.assign(error=frame.estimate - frame.truth)
    out = []
    for (policy, estimator), g in frame.groupby(["policy", "estimator"]):
        out.append({"policy": policy, "estimator": estimator, "truth": float(g.truth.mean()),
                    "bias": float(g.error.mean()), "rmse": float(np.sqrt((g.error ** 2).mean())),
                    "coverage": float(g.covered.mean())})
    return out


def plot(summary: list[dict], path: Path, title: str = "RouteLLM GSM8K") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    estimators = sorted({r["estimator"] for r in summary})
    for ax, (key, label) in zip(axes, [("coverage", "95% interval coverage"), ("rmse", "RMSE"), ("bias", "bias")]):
        for est in estimators:
            rows = sorted((r for r in summary if r["estimator"] == est and r["metric"] == "accuracy"),
                          key=lambda r: r["epsilon"])
            ax.plot([r["epsilon"] for r in rows], [r[key] for r in rows], marker="o", label=est)
        ax.set_xlabel("exploration ε of the logging policy")
        ax.set_title(f"{label} (accuracy)")
        if key == "coverage":
            ax.axhline(0.95, color="grey", ls="--", lw=1)
            ax.axhline(0.90, color="red", ls=":", lw=1)
        if key == "bias":
            ax.axhline(0, color="grey", lw=1)
        ax.set_xscale("log")
        epsilons = sorted({r["epsilon"] for r in summary})
        ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
        ax.minorticks_off()
    axes[0].legend()
    fig.suptitle(f"Off-policy estimates from ε-greedy logs of {title} traffic vs their replay truth")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", type=int, default=200, help="simulated logs per ε")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.2, 0.5])
    parser.add_argument("--n-boot", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", help="a complete logged-outcomes table (default: RouteLLM's GSM8K table)")
    parser.add_argument("--prices", help="its price book (default: configs/prices/routellm-2024.yaml)")
    parser.add_argument("--out", default=str(REPO / "experiments/results/ope_simulation.json"))
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON at --out")
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads(Path(args.out).read_text())["summary"], Path(args.out).with_suffix(".png"))
        return

    started = time.perf_counter()
    data = load_data(args.table, args.prices)
    qualities = {name: cross_fit(data, lambda s, name=name: make_router(name, s), k=5, seed=0)
                 for name in (CHAMPION, *LEARNED)}
    fitted_s = time.perf_counter() - started
    mean_cost = data.costs.mean(axis=0)
    lam = half_strong_lambda(qualities[CHAMPION], mean_cost)
    pols = policies(data, qualities, lam, mean_cost)
    records = []
    for i, eps in enumerate(args.epsilons):
        t0 = time.perf_counter()
        records += simulate(data, pols, qualities[CHAMPION], lam, eps, args.logs, args.n_boot, args.seed + i)
        print(f"ε={eps}: {args.logs} logs in {time.perf_counter() - t0:.1f} s", flush=True)
    summary = summarise(records)
    full = {name: truth(data, probs, np.arange(len(data)), lam) for name, (probs, _) in pols.items()}
    result = {
        "benchmark": "ope_simulation",
        "command": "python experiments/ope_simulation.py " + " ".join(sys.argv[1:]),
        "table": ROUTELLM_TABLE if args.table is None else
        f"{args.table}, {len(data)} queries × {len(data.workers)} workers, prices {args.prices}",
        "workers": list(data.workers), "n_queries": len(data), "queries_per_log": len(data),
        "logs_per_epsilon": args.logs, "epsilons": args.epsilons, "n_boot": args.n_boot, "confidence": 0.95,
        "champion": CHAMPION, "cost_weight": lam,
        "champion_gpt4_share": float(pols["champion (greedy)"][0][:, int(np.argmax(mean_cost))].mean()),
        "champion_share_past_cheapest": float(1 - pols["champion (greedy)"][0][:, int(np.argmin(mean_cost))].mean()),
        "champion_worker_shares": dict(zip(data.workers, pols["champion (greedy)"][0].mean(axis=0).round(4).tolist())),
        "policies_truth_on_table": full,
        "summary": summary,
        "per_policy_at_0.1": per_policy(records, 0.1) if 0.1 in args.epsilons else [],
        "router_fit_s": round(fitted_s, 1), "total_s": round(time.perf_counter() - started, 1),
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(summary, out.with_suffix(".png"), "RouteLLM GSM8K" if args.table is None else Path(args.table).name)
    for r in summary:
        if r["metric"] == "accuracy":
            print(f"ε={r['epsilon']:<5} {r['estimator']:<10} bias={r['bias']:+.4f} rmse={r['rmse']:.4f} "
                  f"coverage={r['coverage']:.3f} (worst policy {r['worst_policy_coverage']:.3f}; "
                  f"ESS ≥ {GATE_MIN_ESS:g}: {r[f'coverage_ess{GATE_MIN_ESS:g}']} of {r[f'share_ess{GATE_MIN_ESS:g}']:.2f})")
    print(f"wrote {out} in {result['total_s']} s")


if __name__ == "__main__":
    main()
