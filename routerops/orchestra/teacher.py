"""The search teacher: verifier-grounded controller trajectories for a pool without a strong model.

Uno-Orchestra distils a strong teacher orchestrator (004 §4, App. A.4, F.3: a frontier LLM writing
plans whose subtasks run on real workers). The embedded pool has no such model, so this teacher
*searches* instead: for every task it writes a few candidate trajectories from templates, runs each
through the real executor and workers (observations are runtime outputs, never simulated), and the
verifier filter (stages/orchestra/sft.py) keeps what the task's verifier accepts. At paper scale the
teacher is an LLM endpoint instead (configs/paper/orchestra.yaml); its turns go through the same
executor.

Candidates (each a `Strategy`, rendered in the grammar of App. F.1):
- lazy: `<final_answer>` at once, with the answer the controller's own model gives (`lazy_answers`);
- one route per admissible (worker, primitive) that solves a whole task: the question forwarded
  verbatim to an LLM primitive (the worker is blind, so the instruction carries the question), or an
  exact expression / program written from the question to the sympy and python tools;
- oneshot: two independent exact routes in one plan, answered when they agree;
- decomp_repair: the pool's first LLM route, then <verify> flags the unchecked result and
  <plan round="2"> recomputes it with an exact tool (kept by the filter only when round 1 was really
  wrong).
The final turn reads the answer from the last <obs> (a tool's printed value, else the LLM's answer).

Templates read only the question text, as the trained controller must: an arithmetic expression, or
"GCD / LCM of these numbers: a, b". A task they cannot read gets only the lazy and LLM candidates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from routerops.envs.qa import arithmetic_expression, extract_answer, tool_value
from routerops.orchestra.controller import ControllerTurn, Message
from routerops.orchestra.grammar import FinalAnswer, Plan, Subtask, Turn, Verify
from routerops.orchestra.render import parse_observations, render_turn
from routerops.pricing import Pool
from routerops.types import Task

TEACHER_NAME = "search-teacher"
_NUMBERS_OF = re.compile(r"(greatest common divisor|gcd|least common multiple|lcm)[^:]*:\s*([\d,\s]+)", re.I)
LLM_SOLVERS = ("answer", "reason", "execute_python")  # primitives that take the whole question


# ---------------------------------------------------------------- reading the question


@dataclass(frozen=True)
class ExactForm:
    """What the question asks, in the two exact tools' languages."""

    sympy: str
    python: str


def exact_form(question: str) -> ExactForm | None:
    """sympy and python for a GCD/LCM question or an arithmetic one; None if neither is found."""
    found = _NUMBERS_OF.search(question)
    if found:
        numbers = [n for n in re.split(r"[,\s]+", found.group(2)) if n]
        function = "gcd" if found.group(1).lower() in ("gcd", "greatest common divisor") else "lcm"
        args = ", ".join(numbers)
        if len(numbers) >= 2:
            return ExactForm(f"{function}({args})", f"import math\nprint(math.{function}({args}))")
    expression = arithmetic_expression(question.rstrip("= ").rstrip())
    if expression:
        return ExactForm(expression, f"print({expression})")
    return None


def answer_in(observation: str) -> str | None:
    """The answer an <obs> body holds: a tool's printed value, else an LLM reply's final answer."""
    return tool_value(observation) or extract_answer(observation)


# ---------------------------------------------------------------- strategies


@dataclass(frozen=True)
class Route:
    worker: str
    primitive: str
    instruction: str
    description: str


@dataclass(frozen=True)
class Strategy:
    """A candidate trajectory: `rounds` plans (each a tuple of parallel routes); after the last <obs>,
    the final answer. More than one round is a repair: each later round follows a failed <verify>."""

    name: str
    rounds: tuple[tuple[Route, ...], ...]
    lazy_answer: str | None = None


def strategies_for(task: Task, pool: Pool, lazy_answer: str | None = None) -> list[Strategy]:
    """Every candidate for `task` on `pool`, cheapest shapes first."""
    pairs = pool.admissible_pairs()
    form = exact_form(task.prompt)
    exact = _exact_routes(pairs, form)
    llm = [Route(w, p, task.prompt, "solve the question") for w, p in pairs if p in LLM_SOLVERS]
    out = [Strategy("lazy", (), lazy_answer)] if lazy_answer else []
    out += [Strategy(f"route:{r.worker}/{r.primitive}", ((r,),)) for r in exact + llm]
    if len(exact) >= 2:
        out.append(Strategy("oneshot:" + "+".join(f"{r.worker}/{r.primitive}" for r in exact[:2]), (tuple(exact[:2]),)))
    if exact and llm:  # one repair per task, from the cheapest-shaped LLM route (the pool's first)
        out.append(Strategy(f"repair:{llm[0].worker}/{llm[0].primitive}->{exact[-1].worker}", ((llm[0],), (exact[-1],))))
    return out


def _exact_routes(pairs: Sequence[tuple[str, str]], form: ExactForm | None) -> list[Route]:
    if form is None:
        return []
    routes = []
    for worker, primitive in pairs:
        if primitive == "sympy":
            routes.append(Route(worker, primitive, form.sympy, "evaluate the question's expression exactly"))
        elif primitive == "python":
            routes.append(Route(worker, primitive, form.python, "compute the question's result with a program"))
    return routes


# ---------------------------------------------------------------- the controller that writes them


# The final answer when a strategy found none (an empty worker reply, a refused turn): the grammar forbids
# an empty <final_answer>, the verifier rejects this one, and the filter drops the trajectory as failed.
NO_ANSWER = "none"


class TeacherController:
    """Writes a Strategy's turns (the Controller contract): plan round k, then after the last <obs> a
    <verify> and the <final_answer>. Conversations are matched to strategies by their task text."""

    def __init__(self, strategies: Mapping[str, Strategy], name: str = TEACHER_NAME):
        self.strategies = strategies  # task prompt → strategy
        self.name = name
        self.version = "search-1"

    def respond(self, conversations: Sequence[list[Message]]) -> list[ControllerTurn]:
        return [ControllerTurn(text=render_turn(self.turn(c))) for c in conversations]

    def turn(self, conversation: list[Message]) -> Turn:
        strategy = self.strategies[conversation[1]["content"]]
        k = sum(m["role"] == "assistant" for m in conversation)
        if not strategy.rounds:
            return Turn(FinalAnswer(strategy.lazy_answer or NO_ANSWER))
        found = observations_in(conversation[-1]["content"]) if k else []
        value = answer_in(found[-1][1]) if found else None
        if k and not found:  # the executor refused the last turn (an <error> block): nothing to build on
            return Turn(FinalAnswer(NO_ANSWER))
        if k < len(strategy.rounds):
            verify = None if k == 0 else Verify(
                f"subtask {found[-1][0]} returned {value!r}, which no exact tool has checked; recompute it.",
                replan=True)
            return Turn(_plan(strategy.rounds[k], k + 1, first_id=1 + sum(len(r) for r in strategy.rounds[:k])), verify)
        agreed = {answer_in(text) for _, text in found}
        check = "the results agree" if len(agreed) == 1 else "the last result is the exact one"
        return Turn(FinalAnswer(value or NO_ANSWER), Verify(f"subtask {found[-1][0]} returned {value!r}; {check}.",
                                                     replan=False))


def observations_in(message: str) -> list[tuple[int, str]]:
    """The <obs> blocks of an executor message; none when it is an <error> block instead."""
    try:
        return parse_observations(message)
    except ValueError:
        return []


def _plan(routes: Sequence[Route], round_: int, first_id: int) -> Plan:
    return Plan(round_, tuple(Subtask(first_id + i, r.description, (), r.worker, r.primitive, r.instruction)
                              for i, r in enumerate(routes)))


def teacher_controllers(tasks: Sequence[Task], pool: Pool, lazy_answers: Mapping[str, str]
                        ) -> dict[str, tuple[TeacherController, list[Task]]]:
    """One TeacherController per strategy name, with the tasks it has a candidate for: the executor
    then runs each candidate over many tasks in one batch."""
    by_name: dict[str, dict[str, Strategy]] = {}
    tasks_of: dict[str, list[Task]] = {}
    for task in tasks:
        for strategy in strategies_for(task, pool, lazy_answers.get(task.task_id)):
            by_name.setdefault(strategy.name, {})[task.prompt] = strategy
            tasks_of.setdefault(strategy.name, []).append(task)
    return {name: (TeacherController(strategies), tasks_of[name]) for name, strategies in by_name.items()}

