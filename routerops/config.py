"""params.yaml → typed, documented config dataclasses; unknown keys are rejected, not ignored.

The sections stay plain frozen dataclasses (`dataclasses.replace` / `asdict` work on them everywhere);
`load_section` is the one loader, and pydantic does the checking: every key known, every value of its
field's type (an int is a valid float, a YAML list a tuple), the error naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Mapping

import pydantic
from pydantic import AfterValidator, Field

from routerops.errors import InputError
from routerops.files import read_yaml_mapping

if typing.TYPE_CHECKING:
    from routerops.layout import Layout
    from routerops.market import Market


# Value constraints (issue 42 item 8): a bad value is refused by the loader, naming its key, before any
# stage runs, not found mid-run after a flow started and retried (`collect.budget_usd: -1` took 91 s).
Count = Annotated[int, Field(ge=0)]  # tasks per split, resamples (0: none)
Positive = Annotated[int, Field(ge=1)]  # turns, episodes in flight, threads, shards
Folds = Annotated[int, Field(ge=2)]  # cross-fitting needs two folds
Seed = Annotated[int, Field(ge=0)]  # numpy's generators refuse negative seeds
Usd = Annotated[float, Field(gt=0, allow_inf_nan=False)]  # a budget: finite and above zero
Probability = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
FilePath = Annotated[str, Field(min_length=1)]  # run_command checks that the file is one of its kind
Names = Annotated[list[str], Field(min_length=1)]  # a list that must name at least one thing
Seeds = Annotated[list[Seed], Field(min_length=1)]  # one fit per seed: at least one


def _known_families(names: list[str]) -> list[str]:
    """Every name a reasoning-gym family; reasoning-gym (~1 s to import) is asked only about names
    outside the defaults."""
    from routerops.envs.suites import DEFAULT_FAMILIES, DEFAULT_OOD_FAMILIES

    unusual = [n for n in names if n not in (*DEFAULT_FAMILIES, *DEFAULT_OOD_FAMILIES)]
    if unusual:
        from reasoning_gym.factory import DATASETS

        unknown = [n for n in unusual if n not in DATASETS]
        if unknown:
            raise ValueError(f"unknown reasoning-gym family {unknown[0]!r} (known: e.g. "
                             f"{', '.join(DEFAULT_FAMILIES)}; all: reasoning_gym.factory.DATASETS)")
    if len(set(names)) != len(names):
        raise ValueError("a family is listed twice")
    return names


Families = Annotated[list[str], AfterValidator(_known_families)]


@dataclass(frozen=True)
class PoolConfig:
    file: FilePath = "configs/pool.yaml"  # pool file: workers, endpoints, primitives, attributes


@dataclass(frozen=True)
class MaterialiseConfig:
    # "suites": reasoning-gym's families below; "table": the questions of the replay table (the
    # `outcomes` stage's data/replay/routellm_gsm8k.parquet), one seeded split by query, scored by
    # math-verify against `answers` (routerops/envs/table_tasks.py). The default pool's tasks.
    source: typing.Literal["suites", "table"] = "suites"
    families: Annotated[Families, Field(min_length=1)] = field(
        default_factory=lambda: ["basic_arithmetic", "chain_sum", "gcd", "lcm"])
    ood_families: Families = field(default_factory=lambda: ["decimal_chain_sum"])  # only in split "ood"
    train: Count = 6  # tasks per in-distribution family, per split ("table": queries per split)
    val: Count = 2
    test: Count = 4
    ood: Count = 6  # tasks per held-out family ("table": none, the table has no held-out family)
    seed: int = 7
    answers: str = "datasets/gsm8k/test_answers.jsonl"  # "table": reference answer per query id


@dataclass(frozen=True)
class PricesConfig:
    """The price books, one top-level section (issue 41 item 2): every stage and pipeline takes its book
    from here, and dvc.yaml's deps name these keys (`${prices.collection}`), so they follow an edit.
    A run resolves its pool and books once into a routerops.market.Market."""

    collection: FilePath = "configs/prices/collection-2026-11.yaml"  # budgets are enforced under this book
    # The book trajectories are re-priced and scored under (edit it to re-price offline, without a single
    # LLM call); the MTRouter and orchestrator pipelines enforce their budgets under it too.
    evaluation: FilePath = "configs/prices/current.yaml"
    replay: FilePath = "configs/prices/routellm-2024.yaml"  # RouteLLM's logged GSM8K models, 2024 list prices


@dataclass(frozen=True)
class CollectConfig:
    budget_usd: Usd = 0.01  # per-episode budget, checked before every call
    turn_limit: Positive = 3
    concurrency: Positive = 4  # episodes in flight
    seed: int = 11
    train_policies: Names = field(default_factory=lambda: ["uniform_random", "random_multi_turn"])
    stop_prob: Probability = 0.5  # random multi-turn policy: P(stop) once an answer exists
    server_ctx: Annotated[int, Field(ge=256)] = 2048  # context window of the embedded llama.cpp server
    server_threads: Positive = 2  # llama.cpp generation threads; 1 is faster on a machine busy with other work
    # Distribution (README "Sharded collection"); none of these changes an episode or its id.
    shards: Positive = 1  # each part of the plan is split into this many shards, collected exactly once each
    dask_address: str = ""  # a team's Dask scheduler ("tcp://host:8786"); "" starts a local cluster
    dask_workers: Positive = 2  # worker processes of that local cluster (one thread each)


@dataclass(frozen=True)
class EvaluateConfig:
    splits: Names = field(default_factory=lambda: ["test", "ood"])
    bootstrap: Count = 1000  # bootstrap resamples for 95% intervals
    seed: int = 0


@dataclass(frozen=True)
class RoutersConfig:
    """Leaderboard of the routers on the collected (task × worker) grid: fit on train, scored on each
    evaluation split apart."""

    routers: Names = field(default_factory=lambda: ["random", "oracle", "cascade", "knn", "logistic", "mf", "mlp"])
    seeds: Seeds = field(default_factory=lambda: [0, 1, 2])
    bootstrap: Count = 200  # resamples for the 95% intervals of AIQ / APGR


@dataclass(frozen=True)
class RegisterConfig:
    """Choose a learned family on train, fit it on train, register it in MLflow, gate it on val."""

    candidates: Names = field(default_factory=lambda: ["knn", "logistic", "mf", "mlp"])  # eligible families
    k: Folds = 5  # folds of the cross-fit on the train split that chooses the family
    objective: typing.Literal["aiq", "accuracy_at_budget"] = "aiq"  # gate objective on the val split
    budget_usd: Usd | None = None  # for accuracy_at_budget: the per-query budget
    n_boot: Positive = 2000
    seed: int = 0


@dataclass(frozen=True)
class ReplayConfig:
    """Routers on real model outcomes: RouteLLM's GSM8K table, bundled under datasets/ (no live call)."""

    table: str = "datasets/routellm/gsm8k_responses.csv"  # RouteLLM's logged outcomes (Apache-2.0)
    contaminated: str = "datasets/routellm/gsm8k_contaminated_prompts.jsonl"  # prompts RouteLLM drops
    fewshot: str = "datasets/gsm8k/train_first8.jsonl"  # RouteLLM's 8-shot prompt, for token estimates
    routers: Names = field(default_factory=lambda: ["random", "oracle", "knn", "logistic", "mf", "mlp"])
    k: Folds = 5  # the table has no split: cross-fitted, so no router scores a query it trained on
    seeds: Seeds = field(default_factory=lambda: [0])
    bootstrap: Count = 200


@dataclass(frozen=True)
class ScoreGate:
    """A pipeline's promotion gate on per-episode scores (routerops/promotion.py), one shape for the
    MTRouter and orchestrator pipelines (`mtrouter.gate`, `orchestra.gate`): the candidate takes the
    `champion` alias only if its mean episode score beats the champion's, on the same tasks, by more
    than `min_improvement` at the lower end of a paired bootstrap interval."""

    confidence: Annotated[float, Field(gt=0, lt=1)] = 0.95  # two-sided level of the paired interval
    n_boot: Annotated[int, Field(ge=100)] = 2000  # bootstrap resamples of the tasks
    min_improvement: Annotated[float, Field(allow_inf_nan=False)] = 0.0  # in score units


@dataclass(frozen=True)
class TrackConfig:
    tracking_uri: str = "sqlite:///mlflow/mlflow.db"  # MLFLOW_TRACKING_URI overrides (tests use a temp dir)
    artifact_root: str = "mlflow/artifacts"  # where new experiments keep their artifacts
    experiment: str = "routerops-pipeline"


@dataclass(frozen=True)
class OpsConfig:
    """Retraining as a team's service (flows/retrain.py, flows/deployments.py, `make serve`)."""

    publish_dir: str = "data/published"  # versioned price books and pools (`routerops prices|pool publish`)
    workspace: str = "retrain"  # the retrain deployment's data, journals and reports (under the repository)
    retrain_cron: str = "0 4 * * 1"  # the retrain deployment's schedule (cron, UTC): Mondays 04:00
    work_pool: str = "cpu"  # the process work pool `make serve` creates and starts a worker on
    gpu_work_pool: str = "gpu"  # the pool the GPU deployments (orchestra-paper, pipeline-gpu) target
    s3_bucket: str = "routerops-published"  # published books and pools also go here when an S3 endpoint is set


@dataclass(frozen=True)
class Params:
    pool: PoolConfig = field(default_factory=PoolConfig)
    materialise: MaterialiseConfig = field(default_factory=MaterialiseConfig)
    prices: PricesConfig = field(default_factory=PricesConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    routers: RoutersConfig = field(default_factory=RoutersConfig)
    register: RegisterConfig = field(default_factory=RegisterConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    track: TrackConfig = field(default_factory=TrackConfig)
    ops: OpsConfig = field(default_factory=OpsConfig)
    # The MTRouter pipeline's section; typed and checked by stages.mtrouter.load_run.
    mtrouter: dict = field(default_factory=dict)
    # The orchestrator pipeline's section; typed and checked by stages.orchestra.load_run
    # (its LM sections by models.orchestrator.config).
    orchestra: dict = field(default_factory=dict)
    # The critique-and-route / CoRL section; typed and checked by models.critique.config.
    critique: dict = field(default_factory=dict)
    # The LM critique-and-route / CoRL controller's section; typed and checked by models.critique.lm_config.
    critique_lm: dict = field(default_factory=dict)
    # The arena's section (issue 39); typed and checked by evaluation.arena_config.
    arena: dict = field(default_factory=dict)

    def market(self, layout: "Layout") -> "Market":
        """The main pipeline's market: params.yaml's pool and its collection and evaluation books, under
        the layout's root, resolved once per content (routerops/market.py)."""
        from routerops.market import resolve_market

        return resolve_market(layout.resolve(self.pool.file), layout.resolve(self.prices.collection),
                              layout.resolve(self.prices.evaluation))


FORBID_UNKNOWN_KEYS = pydantic.ConfigDict(extra="forbid")


def _forbid_unknown_keys(cls: type) -> None:
    """`cls` and every config dataclass it nests reject keys they do not declare (pydantic reads a
    stdlib dataclass's `__pydantic_config__`; without it, unknown keys would be dropped silently)."""
    if "__pydantic_config__" not in cls.__dict__:
        cls.__pydantic_config__ = FORBID_UNKNOWN_KEYS
    for hint in typing.get_type_hints(cls).values():
        if dataclasses.is_dataclass(hint):
            _forbid_unknown_keys(hint)


@functools.cache
def _validator(cls: type) -> pydantic.TypeAdapter:
    _forbid_unknown_keys(cls)
    return pydantic.TypeAdapter(cls)


def load_section(cls: type, raw: Any, source: str | Path, where: str = "") -> Any:
    """The config dataclass `cls` from the YAML mapping at `where` (e.g. "orchestra") of file `source`.
    A key left empty in YAML (`section:` with nothing under it) takes its default. Unknown keys and
    values of the wrong type raise InputError naming the file and the dotted key."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise InputError(source, where or "(top level)", f"expected a mapping, got {type(raw).__name__}")
    try:
        return _validator(cls).validate_python({k: v for k, v in raw.items() if v is not None})
    except pydantic.ValidationError as error:
        first = error.errors(include_url=False)[0]
        key = ".".join(str(part) for part in ([where] if where else []) + list(first["loc"]))
        if first["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            raise InputError(source, key, "unknown key") from None
        raise InputError(source, key, f"{first['msg'].lower()}, got {first['input']!r}") from None


def checked_value(name: str, value: Any, default: Any, source: str) -> Any:
    """`value` in the type of the field's default (an int is a valid float, a list a tuple)."""
    expected = type(default)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is tuple and isinstance(value, list):
        value = tuple(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise InputError(source, name, f"expected {expected.__name__}, got {value!r}")
    if expected is tuple and default and not all(_same_kind(v, default[0]) for v in value):
        kinds = {str: "strings", float: "numbers", int: "integers"}
        raise InputError(source, name, f"expected a list of {kinds.get(type(default[0]), type(default[0]).__name__)}")
    if expected is tuple and default and isinstance(default[0], float):
        value = tuple(float(v) for v in value)
    return value


def _same_kind(value: Any, like: Any) -> bool:
    """`value` may stand where `like` does: a number for a float, the same type otherwise (no bool)."""
    if isinstance(value, bool) != isinstance(like, bool):
        return False
    if isinstance(like, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(like))


def section_from_mapping(cls: type, raw: Mapping[str, Any] | None, source: str, where: str) -> Any:
    """One settings dataclass from the mapping at `where` (e.g. "orchestra.sft") of file `source`:
    unknown keys and values of the wrong type raise InputError, and the values are validated."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise InputError(source, where, "expected a mapping")
    defaults = cls()
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise InputError(source, f"{where}.{unknown[0]}", "unknown key")
    settings = cls(**{k: checked_value(f"{where}.{k}", v, getattr(defaults, k), source) for k, v in raw.items()})
    if hasattr(settings, "validate"):  # a class may check itself in __post_init__ instead
        settings.validate(source, where)
    refuse_non_finite(settings, source, where)
    return settings


def refuse_non_finite(settings: Any, source: str, where: str) -> None:
    """NaN passes every `x < 0` check, and an infinity most `x > 0` ones: after the section's own
    checks, any number still not finite is refused (issue 42's rule, for the hand-checked sections)."""
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise InputError(source, f"{where}.{f.name}", f"expected a finite number, got {value!r}")


SHARED = {"track": "tracking is the top-level `track` section",
          "price_book": "price books are the top-level `prices` section"}


def reject_shared_keys(raw: Any, path: str | Path, section: str) -> None:
    """A pipeline section may not hold its own tracking store or price book: those are top-level."""
    for key, why in SHARED.items():
        if isinstance(raw, Mapping) and key in raw:
            raise InputError(path, f"{section}.{key}", f"unknown key ({why})")


def load_prices(path: str | Path) -> PricesConfig:
    """The top-level `prices` section of params file `path`."""
    return load_params(path, sections=("prices",)).prices


def load_pipeline_section(cls: type, path: str | Path, section: str, book: str = "evaluation",
                          parsers: Mapping[str, Callable[[Any], Any]] | None = None) -> Any:
    """A pipeline's own section (`orchestra`, `mtrouter`, `critique`) as `cls`, whose `track` field is
    filled from the file's top-level `track` section (one tracking store per project, not one per
    pipeline) and whose `price_book` from the top-level `prices` section's `book` key. `parsers` type
    the subsections whose checks are their own (the orchestrator's LM and RL sections), once, here."""
    raw = read_yaml_mapping(path).get(section, {}) or {}
    reject_shared_keys(raw, path, section)
    parsers = parsers or {}
    if isinstance(raw, Mapping) and parsers:
        typed = {key: parse(raw.get(key)) for key, parse in parsers.items()}
        run = dataclasses.replace(load_section(cls, {k: v for k, v in raw.items() if k not in parsers}, path, section),
                                  **typed)
    else:
        run = load_section(cls, raw, path, section)
    shared = load_params(path, sections=tuple(SHARED) + ("prices",))
    names = {f.name for f in dataclasses.fields(cls)}
    values = {"track": shared.track, "price_book": getattr(shared.prices, book)}
    return dataclasses.replace(run, **{k: v for k, v in values.items() if k in names})


def load_params(path: str | Path = "params.yaml", sections: tuple[str, ...] | None = None) -> Params:
    """Load params.yaml. With `sections`, only those sections are kept (the rest take defaults)."""
    path = Path(path)
    raw = read_yaml_mapping(path)
    if sections is not None:
        raw = {k: v for k, v in raw.items() if k in sections}
    return load_section(Params, raw, path)
