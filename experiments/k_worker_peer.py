"""Side by side with the peer (issue 28, item 4): llmrouter-lib's routers on our nine-model table.

    bash experiments/peer_env.sh /work/peer-venv        # once: the peer's own venv (its pins clash with ours),
    #   i.e. python3 -m venv /work/peer-venv && /work/peer-venv/bin/pip install torch==2.13.0 llmrouter-lib==0.4.0
    cd <repo> && nice -n 19 env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 \\
        python experiments/k_worker_peer.py [--peer-python /work/peer-venv/bin/python] [--seeds 0 1 2]

What: the iso-cost read-outs of experiments/k_worker_routing.py (accuracy at ≤ 15 % / ≤ 50 % of the
best single model's test cost, best on the curve, the val-chosen operating point, paired 95 %
bootstrap gaps to the best single model) for llmrouter-lib 0.4.0's kNN, SVM, MLP and matrix-
factorisation routers, beside our routers' rows from experiments/results/k_worker_routing.json, with
the ratio of each peer router to its counterpart of ours at each budget.

Why this way: both sides must see the same data, so ours exports it and the peer only fits and routes.
1. Our side (this file, the project's venv) loads the table, its seeded split (train / val / test =
   60 / 20 / 20 %, split seed 0) and the shared encoder's query vectors with k_worker_routing's own
   `load_table`, and writes them with the train split's logged scores and costs and a λ grid to
   .routerops/k_workers/peer/inputs.npz.
2. experiments/k_worker_peer_side.py, run by the peer venv's python in a subprocess, trains each peer
   router on train alone, once per (seed, λ), on the peer's label (the model with the highest
   performance = score − λ·cost/ref_cost; λ = 0 is the peer as shipped), and writes the worker each
   val and test query is sent to.
3. Our side replays those decisions through k_worker_routing's `readout` (PeerDecisions below turns
   them into a router whose knob walks the λ grid), so every number is read by the same code as ours.

Tuned on what: the peer's hparams are its shipped defaults (nothing tuned); λ only traces the curve;
val picks the val-chosen point; test is never used to fit or choose. Writes
experiments/results/k_worker_peer.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluation import kworker_readout as kw  # noqa: E402
from evaluation.replay import knob_grid  # noqa: E402
from models.base import Router, RoutingData  # noqa: E402
from routerops import metrics  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

PEER_SIDE = REPO / "experiments" / "k_worker_peer_side.py"
WORK = kw.CACHE / "peer"
DEFAULT_PEER_PYTHON = Path(os.environ.get("ROUTEROPS_PEER_PYTHON", "/work/peer-venv/bin/python"))
PEER_ROUTERS = ("knn", "svm", "mlp", "mf")
# λ of the peer's label score − λ·cost/ref_cost (ref_cost: the dearest worker's mean train cost). 0 is
# the peer as shipped; 0.01 breaks every tie towards the cheapest correct model; the rest walk the
# labels from the cheapest correct one to "gemma on nearly everything" (λ = 100).
LAMBDAS = (0.0, 0.01, 0.6, 1.2, 2.5, 4.0, 6.0, 9.0, 14.0, 25.0, 100.0)
# Our router closest to each peer router: same estimator on the same vectors where we have one.
# (Ours predict each worker's quality and sweep λ on it; the peer classifies one label per λ.)
COUNTERPART = {"knn": "knn", "svm": "logistic", "mlp": "mlp", "mf": "mf"}
OURS_SHOWN = ("knn", "logistic", "mlp", "mf", "mtrouter", "ensemble", "cost_label", "cost_label_mlp",
              "calibrated_ensemble", "random", "oracle")
READOUTS = ("acc_at_15", "acc_at_50", "best_accuracy")


class PeerDecisions(Router):
    """Precomputed decisions (one row of workers per operating point) dressed as a router, so that
    k_worker_routing.readout reads them exactly as it reads ours.

    `quality` carries the decisions: column m holds operating point m's worker k of each query as
    m + (k + ½)/W. With knob_name "threshold", readout's grid is quantiles of those values, so every
    floor(knob) = m is on it (asserted by `grid_covers_every_point`); decide reads column floor(knob).
    """

    name = "peer"
    knob_name = "threshold"

    def __init__(self, n_workers: int):
        self.n_workers = n_workers

    def fit(self, data: RoutingData) -> "PeerDecisions":
        return self  # fitted elsewhere: the peer's venv

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        raise NotImplementedError("PeerDecisions replays decisions; build its quality with encode()")

    def encode(self, choices: np.ndarray) -> np.ndarray:
        """(points, n) worker indices → (n, points) quality matrix carrying them."""
        choices = np.asarray(choices, dtype=float)
        return (np.arange(len(choices))[:, None] + (choices + 0.5) / self.n_workers).T

    def decide(self, quality: np.ndarray, costs: np.ndarray, knob: float) -> tuple[np.ndarray, np.ndarray]:
        point = int(np.clip(np.floor(knob), 0, quality.shape[1] - 1))
        choice = np.floor((quality[:, point] - point) * self.n_workers).astype(int)
        return choice, costs[np.arange(len(choice)), choice]


def grid_covers_every_point(router: PeerDecisions, quality: np.ndarray, costs: np.ndarray) -> bool:
    points = np.floor(knob_grid(router, quality, costs)).astype(int)
    return set(range(quality.shape[1])) <= set(points.tolist())


def split_parts(data: RoutingData, split: np.ndarray) -> dict[str, RoutingData]:
    return {name: data.subset(np.flatnonzero(split == name)) for name in ("train", "val", "test")}


def reference(val: RoutingData, test: RoutingData) -> tuple[int, float, float]:
    """The best single model on test (k_worker_routing's choice) and its USD per query on val / test."""
    best = metrics.best_single(test.costs.mean(axis=0), test.scores.mean(axis=0))
    return best, float(val.costs.mean(axis=0)[best]), float(test.costs.mean(axis=0)[best])


def export_inputs(path: Path, train: RoutingData, val: RoutingData, test: RoutingData, lambdas) -> float:
    """What the peer side reads: the same vectors our routers read, train's outcomes, the λ grid.
    Returns ref_cost (the dearest worker's mean train cost), the unit λ multiplies."""
    ref_cost = float(train.costs.max(axis=1).mean())
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, workers=np.array(train.workers), train_vectors=train.embeddings.astype(np.float32),
             scored_vectors=np.vstack([val.embeddings, test.embeddings]).astype(np.float32),
             train_scores=train.scores.astype(float), train_costs=train.costs.astype(float),
             lambdas=np.asarray(lambdas, dtype=float), ref_cost=ref_cost)
    return ref_cost


def run_peer_side(python: Path, inputs: Path, out: Path, routers, seeds, log: Path) -> float:
    """Run the peer's half in its own venv; its chatter goes to `log`. Returns wall seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("PYTHONPATH", None)  # the peer must not import our packages
    command = [str(python), str(PEER_SIDE), "--inputs", str(inputs), "--out", str(out),
               "--routers", *routers, "--seeds", *map(str, seeds)]
    start = time.perf_counter()
    with log.open("w") as f:
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
    if done.returncode != 0:
        raise RuntimeError(f"peer side failed ({done.returncode}); last lines of {log}:\n"
                           + "\n".join(log.read_text().splitlines()[-20:]))
    return time.perf_counter() - start


def peer_readout(choices: np.ndarray, val: RoutingData, test: RoutingData, best: int, ref_val: float,
                 ref_test: float) -> dict:
    """k_worker_routing.readout of one peer router and seed: choices is (points, n_val + n_test)."""
    router = PeerDecisions(len(test.workers))
    q_val, q_test = router.encode(choices[:, :len(val)]), router.encode(choices[:, len(val):])
    assert grid_covers_every_point(router, q_val, val.costs) and grid_covers_every_point(router, q_test, test.costs)
    return kw.readout(router, q_val, q_test, val, test, ref_val, ref_test, best=best)


def curve_points(choices: np.ndarray, test: RoutingData, ref_test: float) -> list[dict]:
    """Test accuracy and cost ratio of each operating point (one per λ)."""
    rows = np.arange(len(test))
    scored = choices[:, -len(test):]
    return [{"accuracy": float(test.scores[rows, c].mean()), "cost_ratio": float(test.costs[rows, c].mean() / ref_test),
             "share_cheapest": float(np.mean(test.costs[rows, c] <= test.costs.min(axis=1)))} for c in scored]


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    return platform.processor() or platform.machine()


def ratio(peer: float | None, ours: float | None) -> float | None:
    return None if peer is None or ours is None or ours == 0 else peer / ours


def side_by_side(peer_rows: dict, ours_rows: dict) -> dict:
    """Per peer router and read-out: peer / our counterpart."""
    out = {}
    for name, row in peer_rows.items():
        mine = ours_rows[COUNTERPART[name]]
        out[name] = {"counterpart": COUNTERPART[name], **{k: ratio(row[k], mine[k]) for k in READOUTS}}
    return out


def check_same_table(ours: dict, test: RoutingData, best: int, n: dict) -> None:
    """Our rows were computed on this split: same sizes, same best single model and accuracy."""
    assert ours["n"] == n, (ours["n"], n)
    assert ours["best_single"]["worker"] == test.workers[best]
    assert abs(ours["best_single"]["accuracy"] - float(test.scores[:, best].mean())) < 1e-9


def markdown(result: dict) -> str:
    def cell(v):
        return "—" if v is None else f"{v:.3f}"

    def ci(r, tag):
        lo, hi = r.get(f"gap_at_{tag}_lo"), r.get(f"gap_at_{tag}_hi")
        return "" if lo is None or hi is None else f"[{lo:+.3f}, {hi:+.3f}]"

    lines = ["| router | acc ≤ 15 % cost | acc ≤ 50 % | best on curve (cost ratio) | val-chosen ≤ 15 % "
             "| gap ≤ 15 % [95 % CI] | gap ≤ 50 % [95 % CI] | peer / ours: ≤ 15 % · ≤ 50 % · best |",
             "|---|---|---|---|---|---|---|---|"]
    for side, rows in (("llmrouter-lib", result["peer"]["rows"]), ("ours", result["ours"]["rows"])):
        for name, r in rows.items():
            vs = result["ratios"].get(name) if side == "llmrouter-lib" else None
            ratios = "" if vs is None else (f"vs our {vs['counterpart']}: {cell(vs['acc_at_15'])} · "
                                            f"{cell(vs['acc_at_50'])} · {cell(vs['best_accuracy'])}")
            lines.append(f"| {side} {name} | {cell(r['acc_at_15'])} | {cell(r['acc_at_50'])} | "
                         f"{cell(r['best_accuracy'])} ({cell(r.get('cost_ratio_at_best'))}) | "
                         f"{cell(r.get('val_chosen_acc_at_15'))} | {ci(r, 15)} | {ci(r, 50)} | {ratios} |")
    ref = result["best_single"]
    lines += ["", f"Best single model on test: {ref['worker']} (accuracy {ref['accuracy']:.3f}). Mean over seeds "
              f"{result['seeds']}; {result['n']['train']} train / {result['n']['val']} val / {result['n']['test']} "
              f"test queries. Peer: llmrouter-lib {result['peer']['version']}, λ grid {list(result['peer']['lambdas'])}.",
              "", "Peer operating points on test (mean over seeds), λ: accuracy @ cost ratio", ""]
    for name, points in result["peer"]["curves"].items():
        pts = ", ".join(f"{lam:g}: {p['accuracy']:.3f} @ {p['cost_ratio']:.3f}"
                        for lam, p in zip(result["peer"]["lambdas"], points))
        lines.append(f"- {name}: {pts}")
    return "\n".join(lines) + "\n"


def mean_curves(per_seed: list[list[dict]]) -> list[dict]:
    return [{k: float(np.mean([seed[i][k] for seed in per_seed])) for k in per_seed[0][i]}
            for i in range(len(per_seed[0]))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--routers", nargs="+", default=list(PEER_ROUTERS), choices=list(PEER_ROUTERS))
    parser.add_argument("--lambdas", type=float, nargs="+", default=list(LAMBDAS))
    parser.add_argument("--peer-python", type=Path, default=DEFAULT_PEER_PYTHON)
    parser.add_argument("--reuse-decisions", action="store_true",
                        help="read the last run's decisions instead of running the peer side again")
    parser.add_argument("--ours", type=Path, default=RESULTS / "k_worker_routing.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "k_worker_peer.json")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    data, split, book = kw.load_table(args.data)
    parts = split_parts(data, split)
    train, val, test = parts["train"], parts["val"], parts["test"]
    best, ref_val, ref_test = reference(val, test)
    ours = json.loads(args.ours.read_text())
    check_same_table(ours, test, best, {k: len(v) for k, v in parts.items()})
    load_s = time.perf_counter() - start

    inputs, decisions = WORK / "inputs.npz", WORK / "decisions.npz"
    ref_cost = export_inputs(inputs, train, val, test, args.lambdas)
    if not args.reuse_decisions:
        if not args.peer_python.is_file():
            raise SystemExit(f"no peer venv at {args.peer_python}: run experiments/peer_env.sh first")
        peer_s = run_peer_side(args.peer_python, inputs, decisions, args.routers, args.seeds, WORK / "peer_side.log")
        meta = json.loads(decisions.with_suffix(".json").read_text())
        decisions.with_suffix(".json").write_text(json.dumps({**meta, "wall_s": peer_s}, indent=2))
    saved, meta = np.load(decisions), json.loads(decisions.with_suffix(".json").read_text())

    peer_rows, curves, per_seed_rows = {}, {}, {}
    for name in args.routers:
        choices = {seed: saved[f"{name}/s{seed}"].astype(int) for seed in args.seeds}
        per_seed = [peer_readout(choices[s], val, test, best, ref_val, ref_test) for s in args.seeds]
        per_seed_rows[name] = dict(zip(map(str, args.seeds), per_seed))
        peer_rows[name] = kw.mean_rows(per_seed)
        curves[name] = mean_curves([curve_points(choices[s], test, ref_test) for s in args.seeds])
        r = peer_rows[name]
        print(f"peer {name:5s} ≤15%: {r['acc_at_15']}  ≤50%: {r['acc_at_50']}  best: {r['best_accuracy']:.3f}", flush=True)
    ours_rows = {name: ours["rows"][name] for name in OURS_SHOWN if name in ours["rows"]}
    result = {
        "benchmark": "k_worker_peer", "issue": 28, "item": 4,
        "table": ours["table"], "price_book": book, "workers": list(data.workers), "seeds": args.seeds,
        "n": {k: len(v) for k, v in parts.items()},
        "best_single": {"worker": test.workers[best], "accuracy": float(test.scores[:, best].mean()),
                        "usd_per_query": ref_test},
        "protocol": ("same table, split (train/val/test 60/20/20, split seed 0), seeds and query vectors (the shared "
                     "MiniLM encoder, exported by our side) for both; the peer's routers are fitted on train only, "
                     "with its shipped hparams, on the label argmax_k score − λ·cost/ref_cost, one fit per λ; "
                     "our routers as in k_worker_routing (their own tuning on train). Read-outs on test by "
                     "k_worker_routing.readout; val only picks the val-chosen point; budgets are fractions of the "
                     "best single model's test USD per query"),
        "tuned_on_what": {
            "peer": "nothing tuned: shipped hparams (kNN k=5 Euclidean; SVC rbf C=1; MLP 128-64, 100 epochs; "
                    "MF latent 128, 5 epochs); λ traces the curve; val picks the val-chosen point",
            "ours": "k_worker_routing: kNN's k by leave-one-out on train, logistic C by inner folds on train, MLP "
                    "early stopping on a train fold, MF on train; val picks the val-chosen point",
        },
        "peer": {"package": "llmrouter-lib", "version": meta["llmrouter_lib"], "torch": meta["torch"],
                 "scikit_learn": meta["scikit_learn"], "python": meta["python"], "hparams": meta["hparams"],
                 "lambdas": list(args.lambdas), "ref_cost_usd": ref_cost,
                 "fit_and_route_s": meta["seconds"], "rows": peer_rows, "per_seed": per_seed_rows,
                 "curves": curves,
                 "routers_left_out": {
                     "elorouter": "one Elo ranking for all queries: routes every query to one model (a single-model row)",
                     "hybrid_llm, automix": "two models only (small / large); automix also needs self-verification "
                                            "of logged answers, which this table lacks",
                     "routerdc, causallm_router, router_r1": "fine-tune a transformer encoder / LLM (hub weights, GPU)",
                     "graphrouter": "needs LLM description embeddings from a hub encoder; not run in the time given",
                     "gmtrouter, personalizedrouter, knnmultiroundrouter, llmmultiroundrouter, tsrouter":
                         "multi-turn, per-user or time-series data, or sources outside the wheel",
                 }},
        "ours": {"source": str(args.ours.relative_to(REPO)), "command": ours.get("command"), "rows": ours_rows},
        "counterparts": COUNTERPART,
        "ratios": side_by_side(peer_rows, ours_rows),
        "timings_s": {"load_and_embed": load_s, "peer_side_wall": meta.get("wall_s"),
                      "peer_side_decisions_reused": args.reuse_decisions},
        "machine": {"python": platform.python_version(), "cpu": cpu_name(),
                    "threads": "OMP/MKL/torch 1, nice 19, beside another CPU job"},
        "command": "python experiments/k_worker_peer.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    kw.write_result(result, args.out, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
