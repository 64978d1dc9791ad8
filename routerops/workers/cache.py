"""A persistent cache of deterministic workers' results (issue 23; design.md: "replay deterministic
workers from a cache").

RL rolls the same tasks out again and again (G rollouts per step, a curriculum cycled over steps), and
a controller that has learned a plan sends the same payloads to the same workers each time. A tool
(the Python sandbox, sympy) and an LLM decoding greedily (temperature 0) answer the same request the
same way, so their results are stored once and replayed. A sampling LLM (temperature > 0, or none
given: the server's default samples) is never cached: its next answer is meant to differ.

The key is everything the result depends on: the worker (name, kind, model, endpoint), the primitive,
the payload, the decoding settings (the whole `generation` mapping — system prompt, temperature,
top_p, seed, stop — and the completion cap of this call; a tool's timeout) and the price book's
version. The price book does not change a result; it is in the key because the issue's contract
says a new price book starts a fresh cache (a price change usually means the pool changed behind the
names). What is stored is the WorkerResult (text and the server's token counts, and the latency the
original call took); the cost is never stored: callers derive it from the tokens under the price
book they hold, as for every call (design.md: costs are derived, never typed in). A failed call
(WorkerResult.error) is not stored, nor a tool run stopped by a time limit (sympy's timeout, the
sandbox's cpu_time or wall_time): both depend on the machine's load, not on the request.

Storage: one SQLite file (under the Layout: `Layout.worker_cache`), WAL journal, one INSERT per result
(atomic; INSERT OR IGNORE, so two processes that computed the same result concurrently keep the first),
a busy timeout so concurrent stages wait for each other's writes. Within one event loop, concurrent
calls with the same key wait for the first (the G rollouts of one group often send the same payload
in the same round) and count as hits.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from routerops.pricing import WorkerSpec
from routerops.types import Payload, Worker, WorkerResult

SCHEMA = """CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    worker TEXT NOT NULL,
    primitive TEXT NOT NULL,
    price_book_version TEXT NOT NULL,
    result TEXT NOT NULL,
    created REAL NOT NULL
)"""
KEY_VERSION = 1  # bump when the key's contents change, so old rows are never read under a new meaning
# Tool results that depend on the machine's load (routerops/workers/tools.py writes these lines).
_TIMED_OUT = re.compile(r"sympy timed out after|stopped by the sandbox (?:cpu_time|wall_time) limit")


@dataclass
class CacheStats:
    """What the cache did since it was opened (this process)."""

    hits: int = 0  # results replayed (from the file, or shared with a concurrent identical call)
    misses: int = 0  # cacheable calls made to the worker
    uncacheable: int = 0  # calls to sampling workers, made every time
    stored: int = 0  # results written (misses without an error)

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


def is_deterministic(spec: WorkerSpec) -> bool:
    """Tools always; an LLM only when it decodes greedily (temperature given and 0)."""
    if spec.kind != "llm":
        return True
    temperature = spec.generation.get("temperature")
    return isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature == 0


def decoding_settings(spec: WorkerSpec, max_tokens: int | None) -> dict[str, Any]:
    """The settings a result depends on besides its payload: for an LLM its generation mapping and the
    call's completion cap (the worker's own when the call gives none); for a tool its timeout."""
    if spec.kind == "llm":
        cap = max_tokens if max_tokens is not None else spec.generation.get("max_tokens")
        return {"generation": dict(sorted(spec.generation.items())), "max_tokens": cap}
    return {"timeout_s": spec.timeout_s}


def cache_key(spec: WorkerSpec, primitive: str, payload: Payload, max_tokens: int | None,
              price_book_version: str) -> str:
    """sha256 of the canonical JSON of (worker, primitive, payload, decoding settings, price book)."""
    identity = {"v": KEY_VERSION, "worker": spec.name, "kind": spec.kind, "model": spec.model,
                "endpoint": spec.endpoint, "primitive": primitive, "payload": payload,
                "decoding": decoding_settings(spec, max_tokens), "price_book_version": price_book_version}
    text = json.dumps(identity, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class WorkerCache:
    """The results of deterministic worker calls, in one SQLite file (module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.stats = CacheStats()
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._in_flight: dict[tuple[int, str], asyncio.Future] = {}

    # ------------------------------------------------ storage

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA busy_timeout=60000")
            connection.execute(SCHEMA)
            self._connection = connection
        return self._connection

    def get(self, key: str) -> WorkerResult | None:
        with self._lock:
            row = self._db().execute("SELECT result FROM results WHERE key = ?", (key,)).fetchone()
        return WorkerResult(**json.loads(row[0])) if row else None

    def put(self, key: str, spec: WorkerSpec, primitive: str, price_book_version: str, result: WorkerResult) -> bool:
        """Store `result` under `key` unless it failed or timed out; a key already stored keeps its first
        result."""
        if not storable(result):
            return False
        stored = {"text": result.text, "prompt_tokens": result.prompt_tokens,
                  "completion_tokens": result.completion_tokens, "cached_tokens": result.cached_tokens,
                  "latency_s": result.latency_s}
        with self._lock:
            self._db().execute("INSERT OR IGNORE INTO results VALUES (?, ?, ?, ?, ?, ?)",
                               (key, spec.name, primitive, price_book_version, json.dumps(stored), time.time()))
        self.stats.stored += 1
        return True

    def __bool__(self) -> bool:  # an empty cache is still a cache: `if cache:` must not mean `if len(cache):`
        return True

    def __len__(self) -> int:
        with self._lock:
            return int(self._db().execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    # ------------------------------------------------ calls

    async def call(self, worker: Worker, payload: Payload, max_tokens: int | None, primitive: str,
                   price_book_version: str) -> WorkerResult:
        """The worker's result for this call: replayed when a deterministic worker already answered the
        same key, else made (`routerops.rollout.call_worker`) and stored if it did not fail."""
        from routerops.rollout import call_worker, spec_of

        spec = spec_of(worker)
        if not is_deterministic(spec):
            self.stats.uncacheable += 1
            return await call_worker(worker, payload, max_tokens)
        key = cache_key(spec, primitive, payload, max_tokens, price_book_version)
        found = self.get(key)
        if found is not None:
            self.stats.hits += 1
            return found
        slot = (id(asyncio.get_running_loop()), key)
        if slot in self._in_flight:  # the same call is being made right now: share its result
            result = await asyncio.shield(self._in_flight[slot])
            self.stats.hits += 1
            return copy_result(result)
        future = asyncio.get_running_loop().create_future()
        self._in_flight[slot] = future
        try:
            self.stats.misses += 1
            result = await call_worker(worker, payload, max_tokens)
            self.put(key, spec, primitive, price_book_version, result)
            future.set_result(result)
            return result
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # marked retrieved: waiting callers re-raise it, nobody else must
            raise
        finally:
            del self._in_flight[slot]


def storable(result: WorkerResult) -> bool:
    """A result the same request would give again: not failed, not stopped by a time limit."""
    return not result.error and not _TIMED_OUT.search(result.text)


def copy_result(result: WorkerResult) -> WorkerResult:
    return WorkerResult(**asdict(result))
