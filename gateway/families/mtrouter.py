"""The MTRouter family's adapter (`ServedMTRouter`, `mtrouter-<suite>`, paper 000): a chat is an
episode in progress, read as MTRouter's history h_t = [q, ⟨u_0, o_1⟩, …, ⟨u_{t−1}, o_t⟩] (000 eq. 2)
by `chat_episode`; the quality of a worker is its estimated outcome ŝ(h_t, a) (000 eq. 8).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from evaluation.servable import cap_text
from evaluation.serving import MTROUTER, served_family
from evaluation.serving.mtrouter import STOP_CHOICE, ServedMTRouter
from gateway.families.base import ChatMappingError, GatewayFamily
from gateway.routing import Estimate, content_text
from models.mtrouter.history import Interaction, pair_block, task_block


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


def turns_left_of(body: dict[str, Any]) -> float:
    """The request's `turns_left` (MTRouter's T_max − t, 000 eq. 1); none given: no limit."""
    value = body.get("turns_left")
    if value is None:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ChatMappingError(f"`turns_left` must be a number ≥ 0, got {value!r}")
    return float(value)


FAMILY = GatewayFamily(served_family(MTROUTER), scorer=lambda servable, embed: MTRouterScorer(servable))
