"""The controller's system prompt: the grammar, the rules, and the pool's admissible (model, primitive)
pairs with their prices (004 App. F.2: one prompt for every run; only the pool table changes).

Our own wording of F.2's sections (role, the two modes, the pool table, hard rules, cost guidance);
the task itself is the first user message, so that every episode of a pool shares this prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from routerops.pricing import Price
from routerops.primitives import PrimitiveSpec

# How a tool primitive reads its instruction, for the controller: tools take no prose.
TOOL_INPUT = {
    "python": "the instruction is Python code, run as given; the results of the subtasks it depends on "
              "are in the dict `inputs`, keyed by subtask id",
    "sympy": "the instruction is one math expression, evaluated as given",
}

GRAMMAR = """\
Write every turn as XML blocks only, with nothing outside them.

Answer yourself (lazy) when the task is one step you can do:
<final_answer>ANSWER</final_answer>

Otherwise decompose: a plan of subtasks with their dependencies, then one route per subtask:
<plan round="1">
<subtask id="1" depends_on="">what subtask 1 is for</subtask>
<subtask id="2" depends_on="">what subtask 2 is for</subtask>
<subtask id="3" depends_on="1,2">what subtask 3 is for</subtask>
</plan>
<route subtask="1" model="MODEL" skill="SKILL">the complete instruction for the worker</route>
<route subtask="2" model="MODEL" skill="SKILL">...</route>
<route subtask="3" model="MODEL" skill="SKILL">...</route>

The results come back as <obs subtask="K">...</obs>. Begin the next turn with your check of them:
<verify>what the results show and whether they answer the task</verify>
then either the <final_answer>, or a new <plan round="2"> for the next step. If the check fails, put
<replan/> inside the <verify> and write a <plan round="2"> that repairs the failure."""

RULES = """\
- Workers are blind: a worker sees its route's instruction and the results of the subtasks it depends
  on, never the task. Put everything the worker needs into the instruction.
- Subtask ids are integers, never reused in a task; an id is larger than every id it depends on.
  Later rounds may depend on earlier rounds' subtasks.
- Subtasks whose dependencies have finished run in parallel.
- Each route names a (model, skill) pair from the pool below.
- Rounds count up by one: 1, 2, 3, ...
- Write exactly one <final_answer>: the bare answer, with no explanation.
- Inside blocks, "&lt;" stands for "<" and "&amp;" for "&"."""


# The compact prompt: the same grammar, rules and pool table in 40% of the tokens (348 instead of 857
# SmolLM2 tokens for the embedded pool). For small controllers on a CPU: SmolLM2's SFT keeps 1,024 tokens of a
# conversation, and the full prompt alone filled 84% of them, cutting most teacher turns off.
COMPACT_GRAMMAR = """\
Reply with XML blocks only. Either answer yourself: <final_answer>ANSWER</final_answer>
or plan subtasks and route each to a (model, skill) pair:
<plan round="1">
<subtask id="1" depends_on="">purpose</subtask>
</plan>
<route subtask="1" model="MODEL" skill="SKILL">complete instruction</route>
Results come back as <obs subtask="K">...</obs>; then write <verify>your check</verify> and the
<final_answer>, or <verify>why it failed<replan/></verify> and a <plan round="2"> that repairs it.
Workers see only their instruction and their dependencies' results. One bare <final_answer>."""
PROMPT_STYLES = ("full", "compact")


@dataclass(frozen=True)
class PoolRow:
    """One model of the pool table: the label the controller writes, its skills and its price."""

    label: str
    primitives: tuple[str, ...]
    price: Price


def render_system_prompt(rows: Sequence[PoolRow], vocabulary: Mapping[str, PrimitiveSpec], budget_usd: float,
                         turn_limit: int, style: str = "full") -> str:
    """The system message of every episode over this pool (and budget and turn limit)."""
    used = [name for name in vocabulary if any(name in row.primitives for row in rows)]
    if style == "compact":
        return "\n".join([
            COMPACT_GRAMMAR, f"At most {turn_limit} turns and ${budget_usd:g} for this task.",
            "Skills: " + "; ".join(compact_skill(vocabulary[name]) for name in used) + ".",
            "Pool (USD per 1M in / out tokens, per call):", *(pool_line(row) for row in rows),
            "Prefer the cheapest pair that can do a subtask."])
    if style != "full":
        raise ValueError(f"prompt style {style!r} is not one of {PROMPT_STYLES}")
    sections = [
        "You orchestrate a pool of workers. Solve the user's task by answering it yourself, or by "
        "splitting it into subtasks and routing each one to a (model, skill) pair of the pool.",
        GRAMMAR,
        "Rules:\n" + RULES + f"\n- You have at most {turn_limit} turns, and ${budget_usd:g} to spend on this task.",
        "Skills:\n" + "\n".join(skill_line(vocabulary[name]) for name in used),
        "Pool (price in USD per 1M input tokens / per 1M output tokens / per call):\n"
        + "\n".join(pool_line(row) for row in rows),
        "Prefer the cheapest pair that can do a subtask well; call a dear model only for what the cheap "
        "ones cannot do.",
    ]
    return "\n\n".join(sections)


def skill_line(primitive: PrimitiveSpec) -> str:
    note = TOOL_INPUT.get(primitive.run)
    return f"- {primitive.name}: {primitive.contract}" + (f" ({note})" if note else "")


def compact_skill(primitive: PrimitiveSpec) -> str:
    if primitive.run == "python":
        return f"{primitive.name} (Python code; prints the result; `inputs` holds dependencies' results)"
    if primitive.run == "sympy":
        return f"{primitive.name} (one exact math expression)"
    return primitive.name


def pool_line(row: PoolRow) -> str:
    p = row.price
    return (f"- {row.label}: skills {', '.join(row.primitives)}; "
            f"${p.input_per_1m:g} / ${p.output_per_1m:g} / ${p.per_call:g}")
