"""The champion the gateway serves (a single-turn router, MTRouter or the orchestrator), and its hot-swap.

`Champions` holds, per registered name, the version that holds the registry's `champion` alias,
loaded (evaluation/registry.py `load_registered`). A watcher thread polls the alias; when it moves,
the new version is loaded *in that thread* and checked against the gateway's pool and price book, then
swapped in with one assignment. A request reads the current champion once, at its start, and keeps
that object: in-flight requests finish on the old router while new ones get the new one.

A champion that cannot serve the current pool is refused: a router (single-turn or MTRouter) that
routes to a worker the pool has no LLM endpoint for, or the price book does not price; an
orchestrator whose (worker, primitive) routes the pool does not offer, whose controller or workers
the book does not price, or whose code-running worker has no sandbox here; a servable of no family
the gateway serves (gateway/families.py). The old one keeps serving, and the reason is logged and
kept in `refusals` (shown by GET /v1/models).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass
from typing import Callable

from evaluation.registry import champion_version, load_registered
from gateway.families import FAMILIES, ORCHESTRATOR, Scorer, family_of, scorer_for
from gateway.routing import EmbeddingCache
from routerops.pricing import Pool, PriceBook
from routerops.workers.sandbox import sandbox_problem

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Champion:
    name: str
    version: str
    router: object  # the registered servable: ServedRouter, ServedMTRouter or ServedOrchestrator
    loaded_at: str
    embed: EmbeddingCache | None = None  # the router's encoder behind an LRU (None: reads no embedding)
    scorer: Scorer | None = None  # its quality estimate per request (None: the orchestrator runs episodes)

    def __post_init__(self) -> None:
        if self.scorer is None:
            object.__setattr__(self, "scorer", scorer_for(self.router, self.embed))

    @property
    def family(self) -> str | None:
        return family_of(self.router)


def serving_problem(servable: object, pool: Pool, book: PriceBook) -> str | None:
    """Why `servable` cannot serve this gateway's pool, or None if it can."""
    family = family_of(servable)
    if family is None:
        return (f"a {type(servable).__name__} is of no family the gateway serves ({', '.join(FAMILIES)}: "
                f"gateway/families.py)")
    if family == ORCHESTRATOR:
        return orchestrator_problem(servable, pool, book)
    return routed_workers_problem(servable.workers, pool, book)


def routed_workers_problem(workers: list[str], pool: Pool, book: PriceBook) -> str | None:
    """A router calls its chosen worker over the chat API: each must be a priced LLM of the pool."""
    llm = {w.name for w in pool.workers if w.kind == "llm"}
    for worker in workers:
        if worker not in llm:
            return f"it routes to worker {worker!r}, which pool {pool.name!r} has no LLM endpoint for"
        if worker not in book.prices:
            return f"it routes to worker {worker!r}, which price book {book.version} does not price"
    return None


def orchestrator_problem(served, pool: Pool, book: PriceBook) -> str | None:
    """The executor runs the controller's routes through this pool: every (worker, primitive) pair the
    controller was trained to route (its system prompt lists them, 004 App. A.6) must be offered,
    by a worker of the same kind, priced; and its own turns must be priced (the budget counts them)."""
    offered = set(pool.admissible_pairs())
    for worker, primitive in served.pool.admissible_pairs():
        if (worker, primitive) not in offered:
            return (f"it routes ({worker!r}, {primitive!r}), which pool {pool.name!r} does not offer; it was "
                    f"trained on pool {served.pool.name!r}")
        if pool.worker(worker).kind != served.pool.worker(worker).kind:
            return f"its worker {worker!r} is a {served.pool.worker(worker).kind} worker, in pool {pool.name!r} a " \
                   f"{pool.worker(worker).kind} one"
        if worker not in book.prices:
            return f"it routes to worker {worker!r}, which price book {book.version} does not price"
    if served.controller.name not in book.prices:
        return f"price book {book.version} has no price for its controller {served.controller.name!r}"
    coders = sorted({w for w, _ in served.pool.admissible_pairs() if pool.worker(w).kind == "python"})
    problem = sandbox_problem() if coders else None
    if problem:
        return f"its worker(s) {coders} run model-written code, and the sandbox cannot start here: {problem}"
    return None


class Champions:
    """The served champion of each registered name, kept current by a watcher thread."""

    def __init__(self, names: list[str], pool: Pool, book: PriceBook,
                 loader: Callable[[str, str], object] = load_registered):
        self.names = list(names)
        self.pool, self.book = pool, book
        self._loader = loader
        self._current: dict[str, Champion] = {}
        self.refusals: dict[str, list[dict[str, str]]] = {n: [] for n in self.names}
        self._refused_versions: dict[str, set[str]] = {n: set() for n in self.names}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self, name: str) -> Champion | None:
        return self._current.get(name)

    def refresh(self) -> None:
        """Load every name's champion if its alias moved since the last look (blocking)."""
        for name in self.names:
            try:
                self._refresh_one(name)
            except Exception as exc:  # noqa: BLE001 - a registry hiccup must not stop the watcher
                log.warning("could not refresh the champion of %s: %s", name, exc)

    def _refresh_one(self, name: str) -> None:
        version = champion_version(name)
        held = self._current.get(name)
        if version is None or (held is not None and held.version == version) or version in self._refused_versions[name]:
            return
        servable = self._loader(name, version)
        problem = serving_problem(servable, self.pool, self.book)
        if problem:
            self._refused_versions[name].add(version)
            self.refusals[name].append({"version": version, "reason": problem, "at": _now()})
            log.warning("refused champion %s v%s: %s (still serving %s)", name, version, problem,
                        f"v{held.version}" if held else "nothing")
            return
        encoder = getattr(servable, "encoder", None)  # single-turn routers' sentence encoder
        embed = EmbeddingCache(encoder) if encoder is not None else None
        self._current[name] = Champion(name, version, servable, _now(), embed)  # one assignment: the swap
        log.info("serving %s v%s, a %s champion (was %s)", name, version, family_of(servable),
                 f"v{held.version}" if held else "none")

    def start(self, interval_s: float) -> None:
        """Load the champions now, then watch the aliases every `interval_s` in a daemon thread."""
        self.refresh()
        self._thread = threading.Thread(target=self._watch, args=(interval_s,), name="champion-watcher", daemon=True)
        self._thread.start()

    def _watch(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
