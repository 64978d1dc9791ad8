"""Every served family behind one registry: family name → its servable (the evaluation side).

A *served family* is a kind of champion the registry logs and the gateway serves; each has one
`Servable` class (evaluation/servable.py's contract: save, load, signature, tags, predict) in a module
of this package:

single-turn   `single_turn.ServedRouter` (`router-<family>`): any router of models/registry.py, a
              query and a budget in, the chosen worker and every worker's score out.
mtrouter      `mtrouter.ServedMTRouter` (`mtrouter-<suite>`, paper 000): a task and its history in,
              the next worker (or STOP) out.
orchestrator  `orchestra.ServedOrchestrator` (`orchestrator`, paper 004): the LM controller's first
              turn; the gateway runs whole episodes with it.
critique      `critique.ServedCritique` (`critique-lm`, paper 002): the LM critique-and-route
              controller's route or verdict.

The gateway's half of each family (how it reads a chat, what it refuses, how it answers) is its
adapter in gateway/families/, which looks the family up here by name; this package never imports
the gateway. Adding a family is one entry in `SERVED_FAMILIES` plus its servable module here and its
adapter there (docs/guides/add-served-family.md). Like models/registry.py (RouteLLM's router
registry): one table a newcomer reads to learn what exists, names resolved in one place.

Each entry loads its class inside a function, so that importing the registry (the gateway does at
start-up) imports no family's stack (the LM controllers' transformers) until a champion of it is
loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evaluation.servable import SERVABLE_FILE, SERVABLE_FORMAT
from routerops import schema
from routerops.errors import InputError

SINGLE_TURN, MTROUTER, ORCHESTRATOR, CRITIQUE = "single-turn", "mtrouter", "orchestrator", "critique"


@dataclass(frozen=True)
class ServedFamily:
    """One served family: its name (a servable's `served_as`), the registered-model name(s) it logs
    under, and a function returning its `Servable` class (imported on first use)."""

    name: str
    registered_as: str  # how its champions are named in the MLflow registry (for the docs and errors)
    servable: Callable[[], type]
    summary: str  # one line: what it reads and answers


def _single_turn() -> type:
    from evaluation.serving.single_turn import ServedRouter

    return ServedRouter


def _mtrouter() -> type:
    from evaluation.serving.mtrouter import ServedMTRouter

    return ServedMTRouter


def _orchestrator() -> type:
    from evaluation.serving.orchestra import ServedOrchestrator

    return ServedOrchestrator


def _critique() -> type:
    from evaluation.serving.critique import ServedCritique

    return ServedCritique


SERVED_FAMILIES: dict[str, ServedFamily] = {f.name: f for f in (
    ServedFamily(SINGLE_TURN, "router-<router>", _single_turn,
                 "a single-turn router of models/registry.py: query + budget → worker and every worker's score"),
    ServedFamily(MTROUTER, "mtrouter-<suite>", _mtrouter,
                 "MTRouter (paper 000): task + history → the next worker or STOP"),
    ServedFamily(ORCHESTRATOR, "orchestrator", _orchestrator,
                 "the LM orchestrator (paper 004): task → the controller's plan; the gateway runs the episode"),
    ServedFamily(CRITIQUE, "critique-lm", _critique,
                 "LM critique-and-route (paper 002): task (+ draft) → route or verdict and escalation"),
)}

# servable.json names its family (`served_as`); one written before this package existed names only
# the class, where it lived then: read as that class's family, so every registered champion still loads.
FAMILY_OF_OLD_CLASS: dict[str, str] = {
    "evaluation.serving:ServedRouter": SINGLE_TURN,
    "evaluation.mtrouter_serving:ServedMTRouter": MTROUTER,
    "evaluation.orchestra_serving:ServedOrchestrator": ORCHESTRATOR,
    "evaluation.critique_serving:ServedCritique": CRITIQUE,
}


def served_family(name: str) -> ServedFamily:
    if name not in SERVED_FAMILIES:
        raise KeyError(f"unknown served family {name!r}; known: {sorted(SERVED_FAMILIES)}")
    return SERVED_FAMILIES[name]


def served_family_of(servable: object) -> str | None:
    """The family `servable` is served as, or None for an object of no registered family. The class
    is checked too (a stray object with a `served_as` attribute is not a servable); only the named
    family's class is looked up, which is already imported when one of its servables exists."""
    name = getattr(type(servable), "served_as", None)
    family = SERVED_FAMILIES.get(name) if isinstance(name, str) else None
    return name if family is not None and isinstance(servable, family.servable()) else None


def servable_class(meta: dict) -> type | None:
    """The servable class of a saved servable.json (`meta`): its family's, or None when it names no
    registered family. Only that family's module is imported."""
    name = meta.get("served_as") or FAMILY_OF_OLD_CLASS.get(str(meta.get("class")))
    family = SERVED_FAMILIES.get(name) if isinstance(name, str) else None
    return None if family is None else family.servable()


def load_servable(directory: str | Path):
    """The servable saved in `directory`, loaded by the class of the family its servable.json names
    (only a registered family's class is ever imported)."""
    directory = Path(directory)
    meta = schema.read_format_meta(directory / SERVABLE_FILE, SERVABLE_FORMAT, "saved router")
    cls = servable_class(meta)
    if cls is None:
        raise InputError(directory / SERVABLE_FILE, "served_as", f"{meta.get('served_as', meta.get('class'))!r} is "
                         f"not a served family ({', '.join(SERVED_FAMILIES)}: evaluation/serving)")
    return cls.load(directory)


def _load_pyfunc(data_path: str):
    """MLflow's loader-module entry point (evaluation/registry.py logs every servable with this
    package as its loader module): `data_path` is the directory the servable saved."""
    return load_servable(data_path)
