"""The verifier-gated curriculum (004 §4 eq. 3, App. A.4): controller episodes collected resumably,
then every training task sorted into D_SFT (a verifier-passing teacher trajectory to imitate), D_RL
(the residual hard pool no teacher trajectory solved) or dropped (the cold-start controller π(0)
already solves it: no learning signal), with the reason for every trajectory kept or dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from routerops import schema
from routerops.envs.qa import score_answer
from routerops.orchestra.controller import Controller
from routerops.orchestra.executor import Executor
from routerops.orchestra.render import parse_observations
from routerops.orchestra.teacher import answer_in
from routerops.rollout import JOURNAL_NAME, append_journal, read_journal, write_tables
from routerops.types import Task
from routerops.validation import m

# Why a trajectory was kept or dropped (the `reason` column of the decisions table).
KEPT_CHEAPEST = "kept: cheapest verifier-passing trajectory of its task"
KEPT_REPAIR = "kept: cheapest verifier-passing repair of a wrong first round (004 App. A.4 keeps repairs)"
DROP_FAILED = "dropped: the verifier rejects its answer"
DROP_INFRA = "dropped: infrastructure artefact (worker error, malformed turn or refused call)"
DROP_COSTLIER = "dropped: a cheaper verifier-passing trajectory of the task is kept"
DROP_SOLVED = "dropped: the cold-start controller already solves the task (no learning signal)"
REASON_CODES = {KEPT_CHEAPEST: "kept_cheapest", KEPT_REPAIR: "kept_repair", DROP_FAILED: "dropped_failed",
                DROP_INFRA: "dropped_infrastructure", DROP_COSTLIER: "dropped_costlier", DROP_SOLVED: "dropped_solved"}
REASONS = tuple(REASON_CODES)


# ---------------------------------------------------------------- collecting episodes


async def collect_episodes(executor: Executor, batches: Sequence[tuple[Controller, Sequence[Task], str]],
                           out_dir: Path, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every (controller, tasks, run id) batch through `executor`, one episode per task (seed `seed`),
    journaled one line per episode under out_dir: a rerun runs only what the journal lacks, then both
    tables are written in plan order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    journal_path = out_dir / JOURNAL_NAME
    done = read_journal(journal_path)
    planned: list[str] = []
    with open(journal_path, "ab") as journal:
        for controller, tasks, run_id in batches:
            ids = {t.task_id: schema.episode_id(run_id, t.task_id, controller.name, seed) for t in tasks}
            planned += ids.values()
            todo = [(t, seed) for t in tasks if ids[t.task_id] not in done]
            if not todo:
                continue
            for result in await executor.run_batch(todo, controller, run_id):
                append_journal(journal, result.episode, result.turns)
                done[result.episode["episode_id"]] = {"episode": result.episode, "turns": result.turns}
    return write_tables([done[eid] for eid in planned], out_dir)


# ---------------------------------------------------------------- the filter


@dataclass(frozen=True)
class Curriculum:
    sft: pd.DataFrame  # one row per kept trajectory: task_id, episode_id, messages (JSON), strategy, …
    rl_tasks: list[Task]  # D_RL
    decisions: pd.DataFrame  # one row per teacher trajectory (and per task π(0) solves): why


def solved_tasks(probe: pd.DataFrame | None) -> set[str]:
    """Task ids the cold-start controller π(0) solved in any of its probe episodes (pass@k, A.4)."""
    if probe is None or probe.empty:
        return set()
    return set(probe.loc[probe.success.astype(bool), "task_id"])


def polluted(turns: pd.DataFrame) -> set[str]:
    """Episodes with an infrastructure artefact: a failed worker call or a malformed controller turn
    (A.4 drops "trajectories polluted by infrastructure artefacts")."""
    bad = turns[turns.errors.map(lambda errors: any(e.get("severity") == "high" for e in _errors(errors)))]
    return set(bad.episode_id)


def _errors(value: Any) -> list[dict]:
    return json.loads(value) if isinstance(value, str) else list(value if value is not None else [])


STRATEGY_SEPARATOR = "#"  # run id = <collection run id>#<strategy name> (stages/orchestra/)


def strategy_of(run_id: str) -> str:
    """The teacher's strategy name, from the run id its episodes were collected under."""
    return run_id.rsplit(STRATEGY_SEPARATOR, 1)[-1]


def first_round_was_wrong(conversation: str, task: Task) -> bool:
    """True when the answer in the first <obs> message fails the task's verifier (a genuine repair)."""
    messages = json.loads(conversation)
    observations = [m["content"] for m in messages[2:] if m["role"] == "user" and m["content"].startswith("<obs")]
    if not observations:
        return False
    found = parse_observations(observations[0])
    return not found or score_answer(task, answer_in(found[-1][1])) < 1.0


def filter_curriculum(tasks: Sequence[Task], episodes: pd.DataFrame, turns: pd.DataFrame,
                      probe: pd.DataFrame | None = None) -> Curriculum:
    """Eq. 3 of 004: D_SFT = {(q, τ*): b⁽⁰⁾ = 0, b* = 1}, D_RL = {q: b⁽⁰⁾ = 0, b* = 0}.

    Per task, among the verifier-passing, artefact-free teacher trajectories the cheapest is kept
    (ties: fewer turns, then episode id); a passing decomp_repair trajectory whose first round was
    really wrong is kept beside it (the cheapest such one: repairs are rare in the paper's corpus,
    4.4 % in Tab. 14, and should not crowd out the direct routes). Tasks π(0) solves are dropped."""
    by_id = {t.task_id: t for t in tasks}
    solved, dirty = solved_tasks(probe), polluted(turns)
    decisions, kept, rl = [], [], []
    for task_id, group in episodes.groupby("task_id", sort=False):
        task = by_id[task_id]
        group = group.assign(strategy=group.run_id.map(strategy_of))
        if task_id in solved:
            decisions += [_decision(row, DROP_SOLVED) for row in group.itertuples()]
            continue
        passing = group[group.success.astype(bool) & ~group.episode_id.isin(dirty)]
        passing = passing.sort_values(["cost_usd", "turns", "episode_id"], kind="mergesort")
        best = passing.episode_id.iloc[0] if len(passing) else None
        repair = next((r.episode_id for r in passing.itertuples() if r.episode_id != best
                       and r.mode == "decomp_repair" and first_round_was_wrong(r.conversation, task)), None)
        for row in group.itertuples():
            reason = _reason(row, best, repair, dirty)
            decisions.append(_decision(row, reason))
            if reason in (KEPT_CHEAPEST, KEPT_REPAIR):
                kept.append({"task_id": task_id, "episode_id": row.episode_id, "strategy": row.strategy,
                             "mode": row.mode, "cost_usd": float(row.cost_usd), "teacher": row.policy,
                             "messages": row.conversation})
        if best is None:
            rl.append(task)
    decisions_frame = pd.DataFrame(decisions, columns=["task_id", "episode_id", "strategy", "mode", "success",
                                                       "cost_usd", "kept", "reason"])
    sft = pd.DataFrame(kept, columns=["task_id", "episode_id", "strategy", "mode", "cost_usd", "teacher", "messages"])
    return Curriculum(sft, rl, decisions_frame)


def _reason(row, best: str | None, repair: str | None, dirty: set[str]) -> str:
    if row.episode_id in dirty:
        return DROP_INFRA
    if not bool(row.success):
        return DROP_FAILED
    if row.episode_id == best:
        return KEPT_CHEAPEST
    return KEPT_REPAIR if row.episode_id == repair else DROP_COSTLIER


def _decision(row, reason: str) -> dict:
    return {"task_id": row.task_id, "episode_id": row.episode_id, "strategy": row.strategy, "mode": row.mode,
            "success": bool(row.success), "cost_usd": float(row.cost_usd), "kept": reason.startswith("kept"),
            "reason": reason}


# ---------------------------------------------------------------- the data gate on its outputs


def curriculum_expectations(gxe: Any) -> dict[str, list[Any]]:
    """great-expectations suites for the filter's outputs: every decision has a known reason, every
    kept trajectory is a conversation that ends in a controller's final answer, nothing kept failed."""
    return {
        "decisions": [
            gxe.ExpectColumnValuesToNotBeNull(column="episode_id", **m("decision_has_episode")),
            gxe.ExpectColumnValuesToBeUnique(column="episode_id", **m("one_decision_per_trajectory")),
            gxe.ExpectColumnValuesToBeInSet(column="reason", value_set=list(REASONS), **m("reason_known")),
        ],
        "sft": [
            gxe.ExpectColumnValuesToBeUnique(column="episode_id", **m("kept_once")),
            gxe.ExpectColumnValuesToMatchRegex(column="messages", regex=r'</final_answer>"\}\]$',
                                               **m("ends_in_final_answer")),
            gxe.ExpectColumnValuesToBeBetween(column="cost_usd", min_value=0.0, **m("cost_non_negative")),
        ],
    }


def sft_records(sft: pd.DataFrame) -> list[dict]:
    """D_SFT as the SFT stage reads it: one {"task_id", "messages", provenance…} per kept trajectory."""
    return [{"task_id": r.task_id, "episode_id": r.episode_id, "strategy": r.strategy, "mode": r.mode,
             "teacher": r.teacher, "distillation_pass": "primary", "messages": json.loads(r.messages)}
            for r in sft.itertuples()]
