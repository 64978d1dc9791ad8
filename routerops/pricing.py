"""Worker pools and versioned price books; costs are always derived from tokens and a price book.

A pool file lists workers (endpoint, model, primitives, attributes) and may declare the closed
primitive vocabulary they draw on (`routerops.primitives`); a price book gives, per worker,
$/1M input tokens, $/1M output tokens, $/1M cached input tokens and a per-call fee, with a version
and an effective date. Nothing stores a typed-in cost: `derive_costs` recomputes every turn's cost
from its token counts, so a new price book re-prices logged trajectories without a single call.
"""

from __future__ import annotations

import datetime as dt
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from routerops.errors import InputError
from routerops.files import read_text
from routerops.primitives import DEFAULT_PRIMITIVES, PRIMITIVE_KEYS, PRIMITIVE_NAME, PRIMITIVE_RUNS, PrimitiveSpec

WORKER_KINDS = ("llm", "python", "sympy")
PRICE_FIELDS = ("input_per_1m", "output_per_1m", "cached_input_per_1m", "per_call")
# Upper bounds: 100x the dearest model listed in 2026 ($150 / 1M output), and $100 a call; a price past
# them is a typo (1e300 would turn every cost into inf), refused by `prices publish` before it is in force.
MAX_PRICE = {"input_per_1m": 15_000.0, "output_per_1m": 15_000.0, "cached_input_per_1m": 15_000.0, "per_call": 100.0}
BOOK_KEYS = ("version", "effective_date", "currency", "prices")
POOL_KEYS = ("name", "primitives", "workers")
# What a worker's `accepts` may name: media content parts, and tool definitions (WorkerSpec.accepts).
ACCEPTABLE = ("image_url", "input_audio", "file", "tools")
# Budgets, costs and every report are in USD; a book in another currency would be read as dollars.
CURRENCY = "USD"


@dataclass(frozen=True)
class WorkerSpec:
    """One worker of the pool: an LLM endpoint or a tool."""

    name: str
    kind: str  # one of WORKER_KINDS
    # What flat routers (MTRouter, the collection pipeline) may ask of this worker: one call on the
    # whole task per (worker, primitive) action (`Pool.actions`).
    primitives: tuple[str, ...]
    endpoint: str = "local"  # "local" = the llama.cpp server the pipeline launches; else a base URL
    model: str = ""
    api_key_env: str = ""  # name of the env var holding the key; empty for local servers
    generation: dict[str, Any] = field(default_factory=dict)  # max_tokens, temperature, system
    attributes: dict[str, float] = field(default_factory=dict)  # numeric features for routers
    concurrency: int = 4
    timeout_s: float = 60.0
    max_retries: int = 4
    # What the orchestrator may also route a subtask to on this worker, beyond `primitives` (004 §4:
    # each subtask goes to an admissible (model, primitive) pair). Kept apart so that adding an
    # orchestration primitive does not add actions to every flat router's pool.
    subtask_primitives: tuple[str, ...] = ()
    # What an LLM worker accepts beyond text, each with the most prompt tokens one item may cost it: a
    # media content part (`image_url`, `input_audio`, `file`: its bytes do not bound its tokens) or, for
    # `tools`, the chat template's text around the tool definitions. The gateway sends a worker nothing
    # else, so its budget reservation bounds every token the worker can bill (gateway/routing.py).
    accepts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Lists from YAML or JSON become tuples, so a spec read back from a saved model equals the original.
        object.__setattr__(self, "primitives", tuple(self.primitives))
        object.__setattr__(self, "subtask_primitives", tuple(self.subtask_primitives))


@dataclass(frozen=True)
class Pool:
    name: str
    workers: tuple[WorkerSpec, ...]
    # The closed primitive vocabulary, by name (the pool file's `primitives:`; DEFAULT_PRIMITIVES when absent).
    primitives: dict[str, PrimitiveSpec] = field(default_factory=lambda: dict(DEFAULT_PRIMITIVES))

    def worker(self, name: str) -> WorkerSpec:
        for w in self.workers:
            if w.name == name:
                return w
        raise KeyError(f"unknown worker {name!r}; the pool has {self.names}")

    @property
    def names(self) -> list[str]:
        return [w.name for w in self.workers]

    def actions(self) -> list[tuple[str, str]]:
        """Every (worker, primitive) pair the pool supports, in file order."""
        return [(w.name, p) for w in self.workers for p in w.primitives]

    def admissible_pairs(self) -> list[tuple[str, str]]:
        """Every (worker, primitive) pair an orchestrator may route a subtask to (004 §4, the set 𝒫):
        each worker's `primitives` then its `subtask_primitives`, in file order."""
        return [(w.name, p) for w in self.workers for p in (*w.primitives, *w.subtask_primitives)]

    def primitive(self, name: str) -> PrimitiveSpec:
        if name not in self.primitives:
            raise KeyError(f"unknown primitive {name!r}; the pool's vocabulary has {sorted(self.primitives)}")
        return self.primitives[name]


@dataclass(frozen=True)
class Price:
    input_per_1m: float
    output_per_1m: float
    cached_input_per_1m: float = 0.0
    per_call: float = 0.0


@dataclass(frozen=True)
class PriceBook:
    version: str
    effective_date: dt.date
    prices: dict[str, Price]
    currency: str = "USD"

    def price(self, worker: str) -> Price:
        if worker not in self.prices:
            raise KeyError(f"price book {self.version} has no price for worker {worker!r}")
        return self.prices[worker]

    def cost(self, worker: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """USD for one call: uncached input + cached input + output + per-call fee."""
        p = self.price(worker)
        uncached = max(prompt_tokens - cached_tokens, 0)
        return (
            uncached * p.input_per_1m + cached_tokens * p.cached_input_per_1m + completion_tokens * p.output_per_1m
        ) / 1e6 + p.per_call


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load that refuses a key given twice in one mapping: YAML silently keeps the last,
    so a worker priced twice would quietly take its second price."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        self.flatten_mapping(node)  # resolve `<<` merge keys first, as SafeLoader does
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool, dt.date)):
                continue  # an unhashable key: safe_load reports it itself
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _read_yaml(path: Path) -> dict:
    path = Path(path)
    text = read_text(path)  # InputError naming the byte offset for a binary or non-UTF-8 file
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise InputError(path, "<file>", f"not valid YAML: {exc}") from exc
    except ValueError as exc:  # a scalar YAML reads as a date that is not one: `2024-13-45`
        raise InputError(path, "<file>", f"not valid YAML: {exc} (quote it if it is not meant as a date)") from exc
    except RecursionError:  # thousands of nested [ or {: PyYAML's constructor recurses per level
        raise InputError(path, "<file>", "not valid YAML: nested too deeply") from None
    if not isinstance(data, dict):
        raise InputError(path, "<file>", "expected a mapping at the top level")
    return data


def reject_unknown_keys(path: Path, data: dict, allowed: tuple[str, ...], where: str = "") -> None:
    """A key the format does not define is an error, never ignored: a typo (`versoin`) would
    otherwise leave the real field at its default. Suggests the closest allowed key."""
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        close = difflib.get_close_matches(unknown[0], allowed, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
        shown = unknown[0] if unknown[0].strip() == unknown[0] and unknown[0] else repr(unknown[0])  # '' or ' x'
        raise InputError(path, f"{where}{shown}", f"unknown key; {hint}")


def _require(path: Path, data: dict, key: str, where: str = "") -> Any:
    if key not in data:
        raise InputError(path, f"{where}{key}", "missing")
    return data[key]


def load_pool(path: str | Path) -> Pool:
    """A checked pool: InputError(path, field, problem) for anything wrong in it, including a worker
    that names a primitive outside the vocabulary or one its kind cannot run."""
    path = Path(path)
    data = _read_yaml(path)
    reject_unknown_keys(path, data, POOL_KEYS)
    vocabulary = _parse_vocabulary(path, data)
    raw_workers = _require(path, data, "workers")
    if not isinstance(raw_workers, list) or not raw_workers:
        raise InputError(path, "workers", "expected a non-empty list")
    workers, seen = [], set()
    for i, raw in enumerate(raw_workers):
        spec = _parse_worker(path, raw, f"workers[{i}]")
        if spec.name in seen:
            raise InputError(path, f"workers[{i}].name", f"duplicate worker {spec.name!r}")
        seen.add(spec.name)
        _check_admitted(path, spec, vocabulary, f"workers[{i}].")
        workers.append(spec)
    _check_runners(path, vocabulary, workers)
    return Pool(name=str(data.get("name", path.stem)), workers=tuple(workers), primitives=vocabulary)


def _parse_worker(path: Path, raw: Any, where_item: str) -> WorkerSpec:
    where = where_item + "."
    if not isinstance(raw, dict):
        raise InputError(path, where_item, "expected a mapping")
    reject_unknown_keys(path, raw, tuple(WorkerSpec.__dataclass_fields__), where)
    name = _require(path, raw, "name", where)
    if not isinstance(name, str) or not name.strip():
        raise InputError(path, where + "name", f"expected a non-empty text, got {_clip(name)}")
    kind = _require(path, raw, "kind", where)
    if not isinstance(kind, str) or kind not in WORKER_KINDS:
        raise InputError(path, where + "kind", f"{_clip(kind)} is not one of {WORKER_KINDS}")
    prims = _require(path, raw, "primitives", where)
    extra = raw.get("subtask_primitives", []) or []
    if not isinstance(extra, list):
        raise InputError(path, where + "subtask_primitives", "expected a list")
    # Empty only for a worker the orchestrator alone calls (a tool as a subtask primitive): flat
    # routers then never pick it for a whole task.
    if not isinstance(prims, list) or not (prims or extra):
        raise InputError(path, where + "primitives", "expected a non-empty list (or subtask_primitives)")
    for field_name, names in (("primitives", prims), ("subtask_primitives", extra)):
        for j, item in enumerate(names):
            if not isinstance(item, str):
                raise InputError(path, f"{where}{field_name}[{j}]", f"expected a primitive name, got {item!r}")
    for key in ("endpoint", "model", "api_key_env"):
        if not isinstance(raw.get(key, ""), str):
            raise InputError(path, where + key, f"expected text, got {_clip(raw[key])}")
    if not isinstance(raw.get("generation", {}) or {}, dict):
        raise InputError(path, where + "generation", f"expected a mapping, got {_clip(raw['generation'])}")
    _check_endpoint(path, raw.get("endpoint", "local"), where)
    _check_generation(path, raw.get("generation") or {}, where + "generation.")
    attrs = raw.get("attributes", {}) or {}
    if not isinstance(attrs, dict):
        raise InputError(path, where + "attributes", f"expected a mapping name -> number, got {_clip(attrs)}")
    for k, v in attrs.items():
        if not _finite_number(v):
            raise InputError(path, where + f"attributes.{k}", f"expected a finite number, got {_clip(v)}")
    accepts = raw.get("accepts", {}) or {}
    if not isinstance(accepts, dict):
        raise InputError(path, where + "accepts", "expected a mapping: content type -> most prompt tokens per item")
    for k, v in accepts.items():
        if k not in ACCEPTABLE:
            raise InputError(path, where + f"accepts.{_clip(k)}", f"{_clip(k)} is not one of {ACCEPTABLE}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(path, where + f"accepts.{k}", f"expected a token count ≥ 0, got {_clip(v)}")
    limits = {key: _check_limit(path, raw, key, where) for key in ("concurrency", "timeout_s", "max_retries")
              if key in raw}
    return WorkerSpec(**{**raw, **limits, "primitives": tuple(prims), "subtask_primitives": tuple(extra),
                         "generation": dict(raw.get("generation") or {}), "accepts": dict(accepts),
                         "attributes": {str(k): float(v) for k, v in attrs.items()}})


# The call limits a worker runs under: (integer?, smallest allowed). A concurrency of -3 or a timeout
# of NaN would be put in force by `pool publish` (issue 25): the semaphore, the HTTP client and the
# retry loop each take them at face value.
WORKER_LIMITS = {"concurrency": (True, 1), "timeout_s": (False, 0.0), "max_retries": (True, 0)}


# Endpoints a pool may name (issue 42 item 8: `pool publish` put `file:///etc/passwd` in force): the
# pipeline's own llama.cpp server, an in-process replay table, or an OpenAI-compatible base URL.
NAMED_ENDPOINTS = ("local", "replay")  # "replay": a logged-outcome worker built in code (routerops/envs/replay.py)
# Generation settings, with the ranges OpenAI's chat API documents (what every worker forwards them to).
GENERATION_RANGES: dict[str, tuple[type, float, float]] = {
    "max_tokens": (int, 1, 1_000_000), "temperature": (float, 0.0, 2.0), "top_p": (float, 0.0, 1.0),
    "presence_penalty": (float, -2.0, 2.0), "frequency_penalty": (float, -2.0, 2.0), "seed": (int, 0, 2**63 - 1),
}
GENERATION_TEXT = ("system", "stop")


def _check_endpoint(path: Path, endpoint: Any, where: str) -> None:
    from urllib.parse import urlsplit

    if endpoint in NAMED_ENDPOINTS:
        return
    if isinstance(endpoint, str) and endpoint.startswith("replay:") and endpoint[len("replay:"):].strip():
        return  # a logged-outcome table served by a replay endpoint (routerops/workers/endpoints.py)
    parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(path, where + "endpoint", f"expected {' or '.join(map(repr, NAMED_ENDPOINTS))}, 'replay:<table>' "
                         f"or an http(s):// base URL, got {_clip(endpoint)}")


def _check_generation(path: Path, generation: dict, where: str) -> None:
    for key, value in generation.items():
        if key in GENERATION_TEXT:
            texts = value if key == "stop" and isinstance(value, list) else [value]
            if not all(isinstance(t, str) for t in texts) or (key == "stop" and len(texts) > 4):
                raise InputError(path, where + str(key), f"expected text{' (or up to 4)' if key == 'stop' else ''}, "
                                 f"got {_clip(value)}")
            continue
        if key not in GENERATION_RANGES:
            known = ", ".join([*GENERATION_RANGES, *GENERATION_TEXT])
            raise InputError(path, where + (key if isinstance(key, str) else _clip(key)), f"unknown key; use {known}")
        kind, low, high = GENERATION_RANGES[key]
        typed = isinstance(value, int) if kind is int else _finite_number(value)
        if isinstance(value, bool) or not typed or not low <= value <= high:
            what = "an integer" if kind is int else "a finite number"
            raise InputError(path, where + key, f"expected {what} in [{low:g}, {high:g}], got {_clip(value)}")


def _clip(value: Any, limit: int = 60) -> str:
    """repr of a user's value, cut to `limit` characters (a 400-digit integer is one error line)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _finite_number(v: Any) -> bool:
    """A YAML number that is a float's worth: not a bool, not NaN or ±inf, no integer past 1.8e308."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer too large for a float
        return False


def _check_limit(path: Path, raw: dict, key: str, where: str) -> int | float:
    integer, low = WORKER_LIMITS[key]
    v = raw[key]
    if integer and (isinstance(v, bool) or not isinstance(v, int) or v < low):
        raise InputError(path, where + key, f"expected an integer ≥ {low}, got {_clip(v)}")
    if not integer and (not _finite_number(v) or v <= low):
        raise InputError(path, where + key, f"expected a finite number of seconds > {low:g}, got {_clip(v)}")
    return v if integer else float(v)


def _parse_vocabulary(path: Path, data: dict) -> dict[str, PrimitiveSpec]:
    """The pool's `primitives:` section (routerops.primitives), or the default vocabulary."""
    if "primitives" not in data:
        return dict(DEFAULT_PRIMITIVES)
    raw = data["primitives"]
    if not isinstance(raw, dict) or not raw:
        raise InputError(path, "primitives", "expected a non-empty mapping primitive name -> how it runs")
    return {str(name): _parse_primitive(path, str(name), entry) for name, entry in raw.items()}


def _parse_primitive(path: Path, name: str, raw: Any) -> PrimitiveSpec:
    where = f"primitives.{name}"
    if not PRIMITIVE_NAME.match(name):
        raise InputError(path, where, "a primitive name is a lower-case word (letters, digits, _), "
                                      "as the controller writes it in skill=\"...\"")
    if not isinstance(raw, dict):
        raise InputError(path, where, "expected a mapping with at least `run`")
    reject_unknown_keys(path, raw, PRIMITIVE_KEYS, where + ".")
    run = _require(path, raw, "run", where + ".")
    if run not in PRIMITIVE_RUNS:
        raise InputError(path, where + ".run", f"{_clip(run)} is not one of {PRIMITIVE_RUNS}")
    for key in ("contract", "instruction", "runner"):
        if not isinstance(raw.get(key, ""), str):
            raise InputError(path, f"{where}.{key}", f"expected text, got {_clip(raw[key])}")
    cap = raw.get("max_tokens")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
        raise InputError(path, where + ".max_tokens", f"expected a positive integer, got {_clip(cap)}")
    if run != "llm_program" and raw.get("runner"):
        raise InputError(path, where + ".runner", "only an llm_program primitive has a runner")
    if run in ("python", "sympy") and (raw.get("instruction") or cap is not None):
        bad = "instruction" if raw.get("instruction") else "max_tokens"
        raise InputError(path, f"{where}.{bad}", f"a {run} tool primitive runs its input as given: no {bad}")
    if run == "llm_program" and not raw.get("runner"):
        raise InputError(path, where + ".runner", "missing: name the python worker that runs the program")
    return PrimitiveSpec(name=name, run=run, contract=raw.get("contract", ""), instruction=raw.get("instruction", ""),
                         runner=raw.get("runner", ""), max_tokens=cap)


def _check_admitted(path: Path, spec: WorkerSpec, vocabulary: dict[str, PrimitiveSpec], where: str) -> None:
    """Every primitive a worker lists is in the vocabulary, listed once, and runnable by its kind."""
    listed: set[str] = set()
    for field_name in ("primitives", "subtask_primitives"):
        for j, name in enumerate(getattr(spec, field_name)):
            at = f"{where}{field_name}[{j}]"
            if name not in vocabulary:
                raise InputError(path, at, f"unknown primitive {name!r}; the vocabulary (primitives:) has "
                                           f"{', '.join(sorted(vocabulary))}")
            if name in listed:
                raise InputError(path, at, f"primitive {name!r} listed twice for worker {spec.name!r}")
            listed.add(name)
            needed = vocabulary[name].worker_kind
            if spec.kind != needed:
                raise InputError(path, at, f"primitive {name!r} runs on a {needed} worker; {spec.name!r} is "
                                           f"a {spec.kind} worker")


def _check_runners(path: Path, vocabulary: dict[str, PrimitiveSpec], workers: list[WorkerSpec]) -> None:
    """An llm_program primitive's runner is a python worker of this pool."""
    kinds = {w.name: w.kind for w in workers}
    for prim in vocabulary.values():
        if prim.run == "llm_program" and kinds.get(prim.runner) != "python":
            raise InputError(path, f"primitives.{prim.name}.runner", f"{prim.runner!r} is not a python worker "
                                                                    f"of this pool ({', '.join(kinds)})")


def _parse_price(path: Path, worker: str, raw: Any) -> Price:
    where = f"prices.{worker}"
    if not isinstance(raw, dict):
        raise InputError(path, where, "expected a mapping of price fields")
    reject_unknown_keys(path, raw, PRICE_FIELDS, f"{where}.")
    values = {}
    for key in PRICE_FIELDS:
        if key not in raw:
            if key in ("input_per_1m", "output_per_1m"):
                raise InputError(path, f"{where}.{key}", "missing")
            continue
        v = raw[key]
        if not _finite_number(v):
            raise InputError(path, f"{where}.{key}", f"expected a finite number, got {_clip(v)}")
        if v < 0:
            raise InputError(path, f"{where}.{key}", f"negative price {v}")
        if v > MAX_PRICE[key]:
            raise InputError(path, f"{where}.{key}", f"{_clip(v)} USD is above the {MAX_PRICE[key]:g} USD this field "
                             "accepts (a typo? prices are USD per 1M tokens, per_call USD per call)")
        values[key] = float(v)
    return Price(**values)


def _parse_version(path: Path, data: dict) -> str:
    """The book's version as text. Every re-priced episode records it (price_book_version), so an
    empty or null version would leave costs that cannot be traced back to their prices."""
    raw = _require(path, data, "version")
    if isinstance(raw, dt.date):  # `version: 2026-11-01` unquoted is a YAML date
        return str(raw)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return str(raw)
    if isinstance(raw, str) and raw.strip():
        return raw
    raise InputError(path, "version", f"expected a non-empty text such as \"2026-11-01\", got {_clip(raw)}")


def _parse_currency(path: Path, data: dict) -> str:
    currency = data.get("currency", CURRENCY)
    if currency != CURRENCY:
        raise InputError(path, "currency", f"only {CURRENCY} is supported (budgets and reports are in "
                                           f"{CURRENCY}), got {currency!r}")
    return currency


def load_price_book(path: str | Path) -> PriceBook:
    """A checked price book; InputError(path, field, problem) for anything wrong in it."""
    path = Path(path)
    data = _read_yaml(path)
    reject_unknown_keys(path, data, BOOK_KEYS)
    version = _parse_version(path, data)
    raw_date = _require(path, data, "effective_date")
    try:
        date = raw_date if isinstance(raw_date, dt.date) else dt.date.fromisoformat(str(raw_date))
    except ValueError as exc:
        raise InputError(path, "effective_date", f"not an ISO date: {raw_date!r}") from exc
    raw_prices = _require(path, data, "prices")
    if not isinstance(raw_prices, dict) or not raw_prices:
        raise InputError(path, "prices", "expected a non-empty mapping worker -> prices")
    prices = {str(w): _parse_price(path, str(w), raw) for w, raw in raw_prices.items()}
    return PriceBook(version=version, effective_date=date, prices=prices, currency=_parse_currency(path, data))


def check_pool_priced(pool: Pool, book: PriceBook, book_path: str | Path = "price book") -> None:
    """Every worker of the pool must have a price: an unpriced worker would make costs silently zero."""
    for w in pool.workers:
        if w.name not in book.prices:
            raise InputError(book_path, f"prices.{w.name}", "worker of the pool has no price")


def derive_costs(turns: pd.DataFrame, book: PriceBook) -> pd.Series:
    """Cost of every turn from its tokens under `book` (vectorised form of PriceBook.cost)."""
    unknown = sorted(set(turns["worker"]) - set(book.prices))
    if unknown:
        raise InputError(f"price book {book.version}", f"prices.{unknown[0]}", "no price for a worker in the turns")
    table = pd.DataFrame({w: vars(p) for w, p in book.prices.items()}).T
    p = table.loc[turns["worker"]].reset_index(drop=True)
    p.index = turns.index
    cached = turns["cached_tokens"].astype(float)
    uncached = (turns["prompt_tokens"].astype(float) - cached).clip(lower=0)
    return (
        uncached * p["input_per_1m"] + cached * p["cached_input_per_1m"]
        + turns["completion_tokens"].astype(float) * p["output_per_1m"]
    ) / 1e6 + p["per_call"]
