"""The four trajectory behaviour modes of Uno-Orchestra (004 App. E, Tab. 14 and Fig. 6), derived from
the kinds of an episode's controller turns.

| mode          | defining structure (Tab. 14)                                                        |
|---------------|-------------------------------------------------------------------------------------|
| lazy          | no <plan>: the controller answers with a <final_answer> alone                        |
| oneshot       | exactly one <plan> round, its routes dispatched together (dependencies inside it allowed: |
|               | App. G's oneshot cases aggregate parallel checks in a dependent subtask)            |
| continuation  | several plan rounds, each opened after a <verify> that did not fail: one step at a time, |
|               | each conditioned on the previous <obs> (the paper's "one <route> per round" is the     |
|               | typical shape, not a requirement here)                                               |
| decomp_repair | a <verify> flagged failure (<replan/>) and a <plan round=k+1> repaired it            |

An episode with neither a plan nor a final answer (every turn malformed, or ended before its first
turn) has mode "none". Flat-router episodes carry "" in the episodes table.
"""

from __future__ import annotations

from typing import Iterable

import pandas as pd

# What a controller turn was; the executor writes it in the turn row's `primitive` column.
KIND_FINAL_ANSWER, KIND_PLAN, KIND_REPAIR, KIND_MALFORMED = "final_answer", "plan", "repair", "malformed"
TURN_KINDS = (KIND_FINAL_ANSWER, KIND_PLAN, KIND_REPAIR, KIND_MALFORMED)
LAZY, ONESHOT, CONTINUATION, DECOMP_REPAIR, NO_MODE = "lazy", "oneshot", "continuation", "decomp_repair", "none"
MODES = (LAZY, ONESHOT, CONTINUATION, DECOMP_REPAIR, NO_MODE)
CONTROLLER_ACTOR = "controller"  # the `actor` of controller turns in the turns table


def behaviour_mode(kinds: Iterable[str]) -> str:
    """The mode of an episode whose controller turns had these kinds, in order."""
    kinds = list(kinds)
    unknown = sorted(set(kinds) - set(TURN_KINDS))
    if unknown:
        raise ValueError(f"unknown controller turn kind {unknown[0]!r}; expected one of {TURN_KINDS}")
    if KIND_REPAIR in kinds:
        return DECOMP_REPAIR
    rounds = kinds.count(KIND_PLAN)
    if rounds == 0:
        return LAZY if KIND_FINAL_ANSWER in kinds else NO_MODE
    return ONESHOT if rounds == 1 else CONTINUATION


def modes_of_turns(turns: pd.DataFrame) -> pd.Series:
    """Mode per episode id, recomputed from a turns table (the controller rows' `primitive`)."""
    controller = turns[turns["actor"] == CONTROLLER_ACTOR].sort_values(["episode_id", "turn_index"])
    return controller.groupby("episode_id")["primitive"].agg(behaviour_mode)
