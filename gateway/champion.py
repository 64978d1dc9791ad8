"""The champion the gateway serves (a servable of any family of gateway/families), and its hot-swap.

`Champions` holds, per registered name, the version that holds the registry's `champion` alias,
loaded (evaluation/registry.py `load_registered`). A watcher thread polls the alias; when it moves,
the new version is loaded *in that thread* and checked against the gateway's pool and price book, then
swapped in with one assignment. A request reads the current champion once, at its start, and keeps
that object: in-flight requests finish on the old router while new ones get the new one.

A champion that cannot serve the current pool is refused, for the reason its family gives
(`GatewayFamily.problem`): a router (single-turn, MTRouter, critique) that routes to a worker the pool
has no LLM endpoint for, or the price book does not price; an orchestrator whose (worker, primitive)
routes the pool does not offer, whose controller or workers the book does not price, or whose
code-running worker has no sandbox here; a servable of no family the gateway serves
(gateway/families). The old one keeps serving, and the reason is logged and
kept in `refusals` (shown by GET /v1/models).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass
from typing import Callable

from evaluation.registry import champion_version, load_registered
from gateway.families import FAMILIES, GatewayFamily, Scorer, family_of, gateway_family, scorer_for
from gateway.routing import EmbeddingCache
from routerops.pricing import Pool, PriceBook

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Champion:
    name: str
    version: str
    router: object  # the registered servable (evaluation/serving: ServedRouter, ServedMTRouter, …)
    loaded_at: str
    embed: EmbeddingCache | None = None  # the router's encoder behind an LRU (None: reads no embedding)
    scorer: Scorer | None = None  # its quality estimate per request (None: an episode family's champion)

    def __post_init__(self) -> None:
        if self.scorer is None:
            object.__setattr__(self, "scorer", scorer_for(self.router, self.embed))

    @property
    def family(self) -> str | None:
        return family_of(self.router)

    @property
    def adapter(self) -> GatewayFamily | None:
        """Its family's gateway adapter (how a request to it is answered)."""
        return gateway_family(self.router)


def serving_problem(servable: object, pool: Pool, book: PriceBook) -> str | None:
    """Why `servable` cannot serve this gateway's pool, or None if it can: its family's own check
    (gateway/families)."""
    family = gateway_family(servable)
    if family is None:
        return (f"a {type(servable).__name__} is of no family the gateway serves ({', '.join(FAMILIES)}: "
                f"gateway/families)")
    return family.problem(servable, pool, book)


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
