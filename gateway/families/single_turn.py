"""The single-turn family's adapter (`ServedRouter`, `router-<router>`): the user turns flattened to
one query, every worker's quality q̂(query, worker) estimated by the registered router."""

from __future__ import annotations

from typing import Any

import numpy as np

from evaluation.serving import SINGLE_TURN, served_family
from evaluation.serving.single_turn import ServedRouter
from gateway.families.base import GatewayFamily
from gateway.routing import Estimate, flatten_messages


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


FAMILY = GatewayFamily(served_family(SINGLE_TURN), scorer=SingleTurnScorer)
