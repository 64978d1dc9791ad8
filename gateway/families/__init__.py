"""How each champion family reads a chat request: the per-family half of a routing decision.

The gateway serves three families (evaluation/servable.py's contract):

single-turn  `ServedRouter` (`router-<family>`): reads the user turns flattened to one query and
             estimates every worker's quality q̂(query, worker).
mtrouter     `ServedMTRouter` (`mtrouter-<suite>`, paper 000): a chat is an episode in progress, read
             as MTRouter's history h_t = [q, ⟨u_0, o_1⟩, …, ⟨u_{t−1}, o_t⟩] (000 eq. 2) by `chat_episode`;
             the quality of a worker is its estimated outcome ŝ(h_t, a) (000 eq. 8).
orchestrator `ServedOrchestrator` (`orchestrator`, paper 004): the chat is one controller episode
             run by the executor (gateway/orchestrated.py), not one routed call.
critique     `ServedCritique` (`critique-lm`, paper 002): the weakest agent drafts, the LM controller
             checks the draft and escalates while it says False (gateway/critiqued.py).

The first two give a `Scorer`: `estimate(messages, budget, turns_left)` → an `Estimate` (each
worker's quality, or why the router stops), which gateway/routing.py's one budget rule turns into a
decision, fallback order and explanation, whatever the family.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from evaluation.mtrouter_serving import STOP_CHOICE, ServedMTRouter
from evaluation.servable import cap_text
from evaluation.serving import ServedRouter
from gateway.routing import Estimate, content_text, flatten_messages
from models.mtrouter.history import Interaction, pair_block, task_block
from routerops.errors import InputError

SINGLE_TURN, MTROUTER, ORCHESTRATOR = "single-turn", "mtrouter", "orchestrator"
CRITIQUE = "critique"  # the LM critique-and-route controller (paper 002): gateway/critiqued.py
FAMILIES = (SINGLE_TURN, MTROUTER, ORCHESTRATOR, CRITIQUE)
ORCHESTRATOR_MODULE = "evaluation.orchestra_serving"  # imported only when such a champion is loaded
CRITIQUE_MODULE = "evaluation.critique_serving"


class ChatMappingError(InputError):
    """A chat this family cannot read (e.g. no user message to take the task from)."""

    def __init__(self, message: str):
        super().__init__("<chat request>", "messages", message)
        self.message = message


def family_of(servable: object) -> str | None:
    """The family the gateway serves `servable` as, or None for a servable it cannot serve."""
    if isinstance(servable, ServedRouter):
        return SINGLE_TURN
    if isinstance(servable, ServedMTRouter):
        return MTROUTER
    if type(servable).__module__ == ORCHESTRATOR_MODULE and getattr(servable, "family", None) == ORCHESTRATOR:
        return ORCHESTRATOR
    if type(servable).__module__ == CRITIQUE_MODULE and getattr(servable, "family", None) == CRITIQUE:
        return CRITIQUE
    return None


def chat_episode(messages: list[dict[str, Any]]) -> tuple[str, list[Interaction]]:
    """MTRouter's (task q, interactions ⟨u_i, o_{i+1}⟩) of a chat (000 eq. 2).

    - q: the user message(s) before the first assistant turn (normally the first user message).
    - u_i: each assistant turn's text. In training u_i is the turn's *response*
      (models/mtrouter/history.py `interactions_from_turns`), not the worker's name nor its
      instruction, so the text the client echoes back is exactly u_i; which worker wrote it (the
      decision log knows) is not part of h_t and is not looked up.
    - o_{i+1}: what came back after u_i: the user (and tool) messages up to the next assistant turn.
    System messages are not part of h_t: training histories hold none (a worker's own system prompt
    is its configuration, not the episode's).
    """
    task_parts: list[str] = []
    pairs: list[tuple[str, list[str]]] = []
    for message in messages:
        role, text = message.get("role"), content_text(message.get("content"))
        if role == "assistant":
            pairs.append((text, []))
        elif role in ("user", "tool") and pairs:
            pairs[-1][1].append(text)
        elif role == "user":
            task_parts.append(text)
    task = "\n".join(p for p in task_parts if p.strip())
    if not task.strip():
        raise ChatMappingError("an MTRouter champion takes the task from the first user message, and this chat "
                               "has no user message before its first assistant turn")
    # The newest characters of u_i and o_{i+1}, as §3.2's truncation keeps the newest tokens.
    return cap_text(task), [Interaction(cap_text(u, "tail"), cap_text("\n".join(o), "tail")) for u, o in pairs]


class Scorer(Protocol):
    family: str
    workers: list[str]

    def is_quick(self, messages: list[dict[str, Any]]) -> bool: ...  # cheap enough for the event loop

    def estimate(self, messages: list[dict[str, Any]], budget_usd: float, turns_left: float) -> Estimate: ...


class SingleTurnScorer:
    """q̂(query, worker) of a single-turn router on the flattened user turns."""

    family = SINGLE_TURN

    def __init__(self, router: ServedRouter, embed=None):
        self.router, self.embed = router, embed  # embed: gateway/routing.py's EmbeddingCache, or None
        self.workers = router.workers

    def is_quick(self, messages: list[dict[str, Any]]) -> bool:
        """Embedding cached: ~0.3 ms of numpy, less than a hop to a thread and back."""
        return self.embed is not None and self.embed.has(flatten_messages(messages))

    def estimate(self, messages: list[dict[str, Any]], budget_usd: float, turns_left: float) -> Estimate:
        query = flatten_messages(messages)
        embeddings = self.embed(query)[None, :] if self.embed is not None else None
        quality = self.router.quality(self.router.routing_data([query], embeddings))[0]
        return Estimate(self.workers, np.asarray(quality, dtype=float), query)


class MTRouterScorer:
    """ŝ(h_t, a) of MTRouter for every candidate worker (000 eq. 8), through the served model's own
    `decide`, so its STOP (no turns left, no candidate within the budget at its expected cost ĉ)
    is the one the registry's model gives; the gateway's worst-case budget rule then applies on top,
    with the gateway's λ on the worst-case cost (the request's `cost_weight`), not MTRouter's own λ
    on ĉ: one rule for every family."""

    family = MTROUTER

    def __init__(self, router: ServedMTRouter):
        self.router = router
        self.workers = list(router.workers)

    def is_quick(self, messages: list[dict[str, Any]]) -> bool:
        return False  # φ may be a sentence encoder (torch): off the event loop

    def estimate(self, messages: list[dict[str, Any]], budget_usd: float, turns_left: float) -> Estimate:
        task, history = chat_episode(messages)
        choice, scores = self.router.decide(task, history, self.workers, budget_usd, turns_left)
        query = "\n".join([task_block(task)] + [pair_block(i, x) for i, x in enumerate(history)])
        if choice != STOP_CHOICE:
            return Estimate(self.workers, np.asarray(scores, dtype=float), query)
        why = ("no turns left" if turns_left <= 0 else
               f"no worker's expected cost ĉ fits the budget ${budget_usd:.6g}")
        return Estimate(self.workers, np.asarray(scores, dtype=float), query, f"MTRouter says STOP: {why}")


def scorer_for(servable: object, embed=None) -> Scorer | None:
    """The servable's Scorer; None for the orchestrator and critique families (they run episodes)."""
    family = family_of(servable)
    if family == SINGLE_TURN:
        return SingleTurnScorer(servable, embed)
    if family == MTROUTER:
        return MTRouterScorer(servable)
    return None


def turns_left_of(body: dict[str, Any]) -> float:
    """The request's `turns_left` (MTRouter's T_max − t, 000 eq. 1); none given: no limit."""
    value = body.get("turns_left")
    if value is None:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ChatMappingError(f"`turns_left` must be a number ≥ 0, got {value!r}")
    return float(value)
