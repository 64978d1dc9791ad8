"""What every family adapter of the gateway shares: the adapter's shape (`GatewayFamily`), the
per-call `Scorer`, the services an episode family uses of the app, and the refusals they share.

The adapters live beside this module (single_turn, mtrouter, orchestra, critique); gateway/families
registers them by family name, the names of evaluation/serving's registry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from evaluation.serving import ServedFamily
from gateway.routing import Estimate
from gateway.store import KeyInfo, Store
from routerops.errors import InputError
from routerops.pricing import Pool, PriceBook


class ChatMappingError(InputError):
    """A chat this family cannot read (e.g. no user message to take the task from)."""

    def __init__(self, message: str):
        super().__init__("<chat request>", "messages", message)
        self.message = message


class Scorer(Protocol):
    """A per-call family's reading of a request: each worker's quality, or why the router stops."""

    family: str
    workers: list[str]

    def is_quick(self, messages: list[dict[str, Any]]) -> bool: ...  # cheap enough for the event loop

    def estimate(self, messages: list[dict[str, Any]], budget_usd: float, turns_left: float) -> Estimate: ...


class ServedChampion(Protocol):
    """What an adapter reads of gateway/champion.py's Champion (named here: the champion module looks
    families up in this package, so the adapters cannot import it)."""

    name: str
    version: str
    router: Any  # the registered servable
    family: str | None


class GatewayServices(Protocol):
    """What the episode families' answers use of gateway/app.py's Gateway, named here so that no
    adapter imports the app, which looks them up."""

    cfg: Any  # gateway.app.GatewayConfig
    pool: Pool
    book: PriceBook
    store: Store

    def orchestra_runner(self, champion: ServedChampion) -> Any: ...  # gateway.families.orchestra.OrchestraRunner

    async def post_chat(self, worker: str, request: dict[str, Any]) -> dict[str, Any]: ...


# An episode family's whole answer to one chat request: (gateway, key, body, champion, messages,
# the request's budget) -> the HTTP response.
EpisodeAnswer = Callable[[GatewayServices, KeyInfo, dict[str, Any], ServedChampion, list[dict[str, Any]], float],
                         Awaitable[Any]]


def routed_workers_problem(servable: Any, pool: Pool, book: PriceBook) -> str | None:
    """A router calls its chosen worker over the chat API: each must be a priced LLM of the pool."""
    llm = {w.name for w in pool.workers if w.kind == "llm"}
    for worker in servable.workers:
        if worker not in llm:
            return f"it routes to worker {worker!r}, which pool {pool.name!r} has no LLM endpoint for"
        if worker not in book.prices:
            return f"it routes to worker {worker!r}, which price book {book.version} does not price"
    return None


@dataclass(frozen=True)
class GatewayFamily:
    """The gateway's half of one served family (its servable is `served`, evaluation/serving).

    A *per-call* family gives a `scorer` (each request: one worker chosen by gateway/routing.py's one
    budget rule on its estimate); an *episode* family gives an `answer` instead (each request: a
    whole episode of calls, run and billed by the adapter). `problem` says why a champion cannot
    serve this gateway's pool and price book (None: it can)."""

    served: ServedFamily
    problem: Callable[[Any, Pool, PriceBook], str | None] = routed_workers_problem
    scorer: Callable[[Any, Any], Scorer] | None = None  # (servable, its EmbeddingCache or None) -> Scorer
    answer: EpisodeAnswer | None = None

    def __post_init__(self) -> None:
        if (self.scorer is None) == (self.answer is None):
            raise ValueError(f"family {self.name!r}: give exactly one of scorer (per call) and answer (episode)")

    @property
    def name(self) -> str:
        return self.served.name

    @property
    def runs_episodes(self) -> bool:
        return self.answer is not None
