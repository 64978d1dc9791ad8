"""Every family the gateway serves, looked up by name: the gateway's half of evaluation/serving's registry.

Each served family (evaluation/serving: `SERVED_FAMILIES`, the servable side) has one adapter here,
a `GatewayFamily` (gateway/families/base.py) in a module of its own:

single-turn   single_turn.py  per call: the user turns flattened to one query, q̂(query, worker).
mtrouter      mtrouter.py     per call: the chat read as MTRouter's history h_t (000 eq. 2), ŝ(h_t, a).
orchestrator  orchestra.py    episode: the chat is one controller episode run by the executor (004).
critique      critique.py     episode: the weakest agent drafts, the controller checks and escalates (002).

A per-call family's `Scorer` gives an `Estimate`, which gateway/routing.py's one budget rule turns into
a decision, fallback order and explanation, whatever the family; an episode family answers the whole
request itself. gateway/champion.py asks the family of a champion why it cannot serve (`problem`) and
for its scorer; gateway/app.py asks it how to answer. Adding a family: its servable and its entry in
evaluation/serving, an adapter module here and its line in `GATEWAY_FAMILIES`
(docs/guides/add-served-family.md); a test fails while the two registries disagree.
"""

from __future__ import annotations

from evaluation.serving import CRITIQUE, MTROUTER, ORCHESTRATOR, SINGLE_TURN, served_family_of
from gateway.families import critique, mtrouter, orchestra, single_turn
from gateway.families.base import ChatMappingError, GatewayFamily, Scorer

__all__ = ["GATEWAY_FAMILIES", "FAMILIES", "ChatMappingError", "GatewayFamily", "Scorer", "family_of",
           "gateway_family", "scorer_for", "SINGLE_TURN", "MTROUTER", "ORCHESTRATOR", "CRITIQUE"]

GATEWAY_FAMILIES: dict[str, GatewayFamily] = {f.name: f for f in (
    single_turn.FAMILY, mtrouter.FAMILY, orchestra.FAMILY, critique.FAMILY,
)}
FAMILIES = tuple(GATEWAY_FAMILIES)  # the names, in the order /v1/models and errors list them


def family_of(servable: object) -> str | None:
    """The family the gateway serves `servable` as, or None for a servable it cannot serve."""
    name = served_family_of(servable)
    return name if name in GATEWAY_FAMILIES else None


def gateway_family(servable: object) -> GatewayFamily | None:
    """The adapter of `servable`'s family, or None when the gateway serves no such family."""
    name = family_of(servable)
    return None if name is None else GATEWAY_FAMILIES[name]


def scorer_for(servable: object, embed=None) -> Scorer | None:
    """The servable's per-call Scorer; None for an episode family (or no family)."""
    family = gateway_family(servable)
    return None if family is None or family.scorer is None else family.scorer(servable, embed)
