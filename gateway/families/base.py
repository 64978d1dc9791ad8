"""What every family adapter of the gateway shares: the adapter's shape (`GatewayFamily`), the
per-call `Scorer`, the services an episode family uses of the app, the refusal they share, and the
episode families' common parts (the chat as a task, the row of a failed episode, the one-chunk stream).

The adapters live beside this module (single_turn, mtrouter, orchestra, critique); gateway/families
registers them by family name, the names of evaluation/serving's registry.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from evaluation.serving import ServedFamily
from gateway.errors import RequestError
from gateway.routing import Estimate, content_text
from gateway.store import BudgetRefused, KeyInfo, Store
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


# ---------------------------------------------------------------- what the episode families share


def chat_task(messages: list[dict[str, Any]]) -> str:
    """The task the controller plans for. One user message: its text, as in training (004: the task is
    the first user message after the system prompt). A longer chat: its user and assistant turns as a
    transcript, so the last request is read in its context. The client's system messages are left
    out: the controller's system prompt is the grammar and the pool (004 App. F.1), and a second one
    would contradict it."""
    turns = [(m.get("role"), content_text(m.get("content"))) for m in messages if m.get("role") in ("user", "assistant")]
    if not any(role == "user" and text.strip() for role, text in turns):
        raise RequestError(400, "an orchestrator champion needs a user message: the task it plans for")
    if len(turns) == 1:
        return turns[0][1]
    return "\n\n".join(f"{'User' if role == 'user' else 'Assistant'}: {text}" for role, text in turns)


async def hold_episode_budget(gw: GatewayServices, key: KeyInfo, budget: float) -> Any:
    """Reserve an episode's budget on the key before its first call; a concurrent request that took the
    rest first is a 429, as a single call's reservation is."""
    try:
        return await gw.store.areserve(key, budget)
    except BudgetRefused:
        raise RequestError(429, f"key {key.key_id}: concurrent requests used the remaining budget",
                           "insufficient_quota", "budget_exceeded") from None


def episode_row(gw: GatewayServices, key: KeyInfo, champion: ServedChampion, task: str) -> dict[str, Any]:
    """The decision-log fields every episode's row starts with, under a fresh decision id (the query's
    text only when the gateway logs texts)."""
    return {"decision_id": uuid.uuid4().hex, "key_id": key.key_id, "router": champion.name,
            "router_version": champion.version, "price_book_version": gw.book.version,
            "query_id": hashlib.sha256(task.encode()).hexdigest()[:16], "query": task if gw.cfg.log_texts else "",
            "propensity": 1.0}


def failed_record(exc: BaseException, budget: float, remaining: float, started: float) -> dict[str, Any]:
    """The decision-log row of an episode that did not finish: charged its whole reservation."""
    return {"created_at": _utc_now(), "worker": "", "status": "error",
            "explanation": {"family": "orchestrator", "budget_usd": budget, "key_remaining_usd": remaining,
                            "error": f"{type(exc).__name__}: {str(exc)[:300]}", "calls": []},
            "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": budget, "usage_source": "estimated",
            "response": "", "latency_s": time.monotonic() - started}


async def one_chunk_stream(completion: dict[str, Any]):
    """The answer as one content chunk, then the chunk with usage and routerops (module docstring)."""
    head = {k: completion[k] for k in ("id", "created", "model")}
    choice = completion["choices"][0]
    yield "data: " + json.dumps({**head, "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": choice["message"], "finish_reason": choice["finish_reason"]}]}) + "\n\n"
    yield "data: " + json.dumps({**head, "object": "chat.completion.chunk", "choices": [],
                                 "usage": completion["usage"], "routerops": completion["routerops"]}) + "\n\n"
    yield "data: [DONE]\n\n"


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
