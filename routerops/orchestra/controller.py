"""What the executor needs of a controller, whatever drives it (a fine-tuned LM in transformers, an
OpenAI-compatible endpoint, the search teacher's scripted turns).

A conversation is a list of OpenAI chat messages: the system prompt (grammar and the pool's admissible
(model, primitive) pairs), the task as the first user message, then alternating assistant turns (the
controller's own tokens: the only tokens SFT and RL train on, 004 App. E) and user turns holding the
executor's <obs> blocks (observation tokens, masked out of every loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


@dataclass(frozen=True)
class ControllerTurn:
    """One assistant turn of the controller."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Log-probabilities of the controller's own generated tokens under the policy that sampled them
    # (the old-policy ratio and KL terms of the RL stage need them); None when the backend gives none.
    token_logprobs: tuple[float, ...] | None = None
    token_ids: tuple[int, ...] | None = None


class Controller(Protocol):
    """Batched, synchronous: one call answers every conversation of a group (G rollouts of one task
    share a forward pass). The executor calls it from a worker thread."""

    name: str

    def respond(self, conversations: Sequence[list[Message]]) -> list[ControllerTurn]:
        ...
