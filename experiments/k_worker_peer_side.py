"""The peer's half of experiments/k_worker_peer.py: llmrouter-lib's routers, run in the peer's own venv.

    /work/peer-venv/bin/python experiments/k_worker_peer_side.py --inputs IN.npz --out OUT.npz \\
        [--routers knn svm mlp mf] [--seeds 0 1 2]

Reads what our side exported (query vectors, the train split's logged scores and costs, the λ grid)
and writes, per (router, seed, λ), the worker each val and test query is sent to. It imports only
numpy, torch, yaml and llmrouter (never routerops), so it runs under the peer's pins.

How each router is trained: exactly as llmrouter-lib does it. A YAML config (the hparams of the
peer's shipped `configs/model_config_train/<router>.yaml`) points the router at a routing-data JSONL
(one row per training query and model: `query`, `model_name`, `performance`, `embedding_id`) and a
.pt tensor of query vectors; the router's constructor derives its labels (the model with the highest
`performance` per query) and the peer's Trainer fits and saves the model. The peer's routers read
`performance` alone, so cost enters the way the peer's cost-aware use does: through the label,
performance = score − λ · cost / ref_cost, one fit per λ (λ = 0: the peer as shipped, performance
only; ties go to the first-listed model, pandas' idxmax). Decisions come from the fitted estimator's
own prediction call, the one `route_single` makes, fed our vectors in place of the Longformer
embedding it would compute (offline here, and the comparison wants identical vectors).

Changes to the shipped hparams, none of which changes a decision: kNN's n_jobs −1 → 1 (one core);
SVM's probability true → false (SVC.predict ignores the Platt model; fitting it costs a 5-fold
refit); MF's text_dim 768 → the vectors' width.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm (imported by llmrouter) stays offline
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

# The peer's shipped hparams (configs/model_config_train/*.yaml of ulab-uiuc/LLMRouter), per router.
HPARAMS = {
    "knn": {"n_neighbors": 5, "weights": "uniform", "algorithm": "auto", "leaf_size": 30, "p": 2,
            "metric": "minkowski", "n_jobs": 1},
    "svm": {"kernel": "rbf", "C": 1.0, "gamma": "scale", "probability": False},
    "mlp": {"hidden_layer_sizes": [128, 64], "activation": "relu", "lr": 0.001, "epochs": 100,
            "batch_size": 32, "alpha": 0.0001},
    "mf": {"latent_dim": 128, "lr": 0.001, "epochs": 5, "noise_alpha": 0.0},  # text_dim: the vectors' width
}
PEER_CLASSES = {"knn": ("KNNRouter", "KNNRouterTrainer"), "svm": ("SVMRouter", "SVMRouterTrainer"),
                "mlp": ("MLPRouter", "MLPTrainer"), "mf": ("MFRouter", "MFRouterTrainer")}


def seed_everything(seed: int) -> None:
    """The peer's trainers draw from torch's, numpy's and Python's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def write_routing_jsonl(path: Path, scores: np.ndarray, costs: np.ndarray, workers: list[str], lam: float,
                        ref_cost: float) -> None:
    """The peer's routing-data format: one row per (training query, model); `query` is a unique key
    (the peer groups by it), `embedding_id` the row of the query-vector tensor."""
    with path.open("w", encoding="utf-8") as f:
        for i in range(len(scores)):
            for k, worker in enumerate(workers):
                perf = float(scores[i, k]) - lam * float(costs[i, k]) / ref_cost
                f.write(json.dumps({"query": f"q{i:06d}", "model_name": worker, "performance": perf,
                                    "embedding_id": i}) + "\n")


def write_config(path: Path, work: Path, router: str, text_dim: int) -> None:
    hparam = dict(HPARAMS[router])
    if router == "mf":
        hparam["text_dim"] = text_dim
    config = {
        "data_path": {"routing_data_train": str(work / "routing_train.jsonl"),
                      "query_embedding_data": str(work / "train_vectors.pt"),
                      "llm_data": str(work / "llm_data.json")},
        "model_path": {"ini_model_path": "", "save_model_path": str(work / f"{router}.pkl")},
        "metric": {"weights": {"performance": 1, "cost": 0, "llm_judge": 0}},
        "hparam": hparam,
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")


def fit_peer_router(router: str, config: Path):
    """The peer's router and trainer, constructed and trained as its CLI does (router_train.py)."""
    import llmrouter.models as peer

    router_cls, trainer_cls = (getattr(peer, name) for name in PEER_CLASSES[router])
    model = router_cls(yaml_path=str(config))
    trainer = trainer_cls(router=model, device="cpu")
    trainer.train()
    return model, trainer


def predict_workers(router: str, model, trainer, vectors: np.ndarray) -> list[str]:
    """The model name the peer's route_single would return for each vector (its prediction call,
    batched where the estimator takes batches)."""
    if router in ("knn", "svm"):  # sklearn estimators: route_single calls .predict([vector])
        return [str(name) for name in trainer.model.predict(vectors)]
    x = torch.as_tensor(vectors, dtype=torch.float32)
    if router == "mlp":  # route_single: MLPClassifierNN.predict, then idx_to_model
        return [model.idx_to_model[int(i)] for i in trainer.model.predict(x)]
    net = trainer.model.eval()  # mf: route_single scores every model on the projected vector, argmax
    with torch.no_grad():
        return [model.idx_to_model[int(torch.argmax(net.score_all(net.project_text(q))))] for q in x]


def run(inputs: Path, out: Path, routers: list[str], seeds: list[int]) -> dict:
    data = np.load(inputs, allow_pickle=False)
    workers = [str(w) for w in data["workers"]]
    train_vectors, scored_vectors = data["train_vectors"], data["scored_vectors"]
    scores, costs, lambdas = data["train_scores"], data["train_costs"], data["lambdas"]
    ref_cost = float(data["ref_cost"])
    index = {w: k for k, w in enumerate(workers)}
    choices, seconds = {}, {}
    with tempfile.TemporaryDirectory(prefix="peer-") as tmp:
        work = Path(tmp)
        torch.save(torch.as_tensor(train_vectors, dtype=torch.float32), work / "train_vectors.pt")
        (work / "llm_data.json").write_text(json.dumps({w: {"model": w} for w in workers}), encoding="utf-8")
        for router in routers:
            write_config(work / f"{router}.yaml", work, router, train_vectors.shape[1])
            for seed in seeds:
                start, per_lambda = time.perf_counter(), []
                for lam in lambdas:
                    write_routing_jsonl(work / "routing_train.jsonl", scores, costs, workers, float(lam), ref_cost)
                    seed_everything(seed)
                    model, trainer = fit_peer_router(router, work / f"{router}.yaml")
                    per_lambda.append([index[name] for name in predict_workers(router, model, trainer, scored_vectors)])
                choices[f"{router}/s{seed}"] = np.asarray(per_lambda, dtype=np.int16)
                seconds[f"{router}/s{seed}"] = time.perf_counter() - start
                print(f"[peer-side] {router} seed {seed}: {len(lambdas)} fits in {seconds[f'{router}/s{seed}']:.0f}s",
                      file=sys.stderr, flush=True)
    np.savez(out, **choices)
    from importlib.metadata import version

    meta = {"seconds": seconds, "llmrouter_lib": version("llmrouter-lib"), "torch": torch.__version__,
            "scikit_learn": version("scikit-learn"), "python": sys.version.split()[0], "hparams": HPARAMS}
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return meta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--routers", nargs="+", default=list(PEER_CLASSES), choices=list(PEER_CLASSES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    run(args.inputs, args.out, args.routers, args.seeds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
