"""Question answering as an Environment: the LLM answers, the tools compute, a verifier scores.

Primitives and their payloads (`request`):
- `answer` (LLM): a chat message list — the task prompt; on later turns followed by a short summary
  of the previous turns and a request for the final answer. The final answer is read from the
  reply: the last 'Answer: X', else the last \\boxed{X}, else '#### X', else the last number, else
  the last line.
- `python` (tool): a string of code — the last ```python block of the latest LLM reply; without
  one, `print(<expression>)` when the task prompt holds a pure arithmetic expression; else "".
- `sympy` (tool): a string — the last arithmetic expression in the latest LLM reply, else the one
  in the task prompt; else "".
A tool's output becomes the new candidate answer when its last line looks like a value (an
integer, decimal, fraction or number in e-notation).

Error rules recorded in Observation.errors (MTRouter-style error-penalty targets):
| rule           | severity | when                                                                  |
|----------------|----------|-----------------------------------------------------------------------|
| no_answer      | medium   | the LLM reply is empty, so no answer can be read from it              |
| no_code        | medium   | `python` was called with no code block to run and no arithmetic       |
| no_expression  | medium   | `sympy` was called with no arithmetic expression to evaluate          |
| tool_error     | high     | the tool reported a failure (a line starting 'Error:' — the tool      |
|                |          | workers' convention for exceptions, timeouts and sandbox limits)      |
| tool_no_value  | low      | the tool ran but printed nothing that looks like a value              |
| unknown_primitive | high  | a primitive this environment does not define                          |

Score (`score`, in [0, 1], success at 1.0): reasoning-gym tasks use the family's own
`score_answer` (graded: partial credit for near misses); GSM8K / MATH tasks use math-verify
(1 or 0); other tasks, exact match of the stripped strings.
"""

from __future__ import annotations

import ast
import functools
import re
from routerops.envs.jsonl_qa import VERIFIER as MATH_VERIFIER
from routerops.envs.jsonl_qa import last_boxed, verify_math
from routerops.envs.suites import VERIFIER as RG_VERIFIER
from routerops.types import EpisodeState, Observation, Payload, TurnRecord

SEVERITY = {
    "no_answer": "medium", "no_code": "medium", "no_expression": "medium", "tool_error": "high",
    "tool_no_value": "low", "unknown_primitive": "high",
}
PRIMITIVES = ("answer", "python", "sympy")
SUMMARY_TURNS = 4  # previous turns shown to the LLM on a later turn
SUMMARY_CHARS = 160  # of each previous reply
SIGNIFICANT_DIGITS = 12  # decimals longer than this from a tool are floating-point noise (0.1+0.2)

_ANSWER_TAG = re.compile(r"answer\s*(?:is)?\s*[:=]\s*(.+)", re.IGNORECASE)
_HASHES = re.compile(r"####\s*(.+)")
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_PYTHON_BLOCK = re.compile(r"```[ \t]*(?:python|py|python3)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_ARITH_RUN = re.compile(r"[0-9.+\-*/%()^×÷ ]+")
_ANSWER_IS = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s+is\s*:?\s*(.+)$", re.IGNORECASE)
_NUMBER_WITH_UNIT = re.compile(r"^\$?(-?\d[\d,]*(?:\.\d+)?)\s*[A-Za-z%]*\.?$")
_VALUE = re.compile(r"^[-+]?(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\d+/\d+)$")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_ARITH_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator, ast.unaryop)


def error(rule: str) -> dict[str, str]:
    return {"rule": rule, "severity": SEVERITY[rule]}


# ---------------------------------------------------------------- reading answers


def clean_answer(text: str) -> str:
    """Strip markdown, dollar signs and a trailing period; 'the answer is X' → 'X'; '1,234' → '1234';
    '12 legs' → '12'."""
    text = _strip_decoration(text)
    inner = _ANSWER_IS.match(text)
    text = _strip_decoration(inner.group(1)) if inner else text
    unit = _NUMBER_WITH_UNIT.match(text)
    if unit:
        text = unit.group(1)
    return text.replace(",", "") if _THOUSANDS.match(text) else text


def _strip_decoration(text: str) -> str:
    return text.strip().rstrip(".").strip().strip("*$ ").strip()


def extract_answer(reply: str) -> str | None:
    """The final answer in an LLM reply, by the first rule that finds one (module docstring)."""
    text = reply.strip()
    if not text:
        return None
    for found in (_last_match(_ANSWER_TAG, text), last_boxed(text), _last_match(_HASHES, text)):
        if found and clean_answer(found):
            return clean_answer(found)
    numbers = _NUMBER.findall(text)
    if numbers:
        return clean_answer(numbers[-1])
    return clean_answer(text.splitlines()[-1]) or None


def _last_match(pattern: re.Pattern, text: str) -> str | None:
    matches = pattern.findall(text)
    return matches[-1] if matches else None


def tool_value(output: str) -> str | None:
    """The value a tool printed (its last non-empty line), normalised; None if it is no value."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines or not _VALUE.match(lines[-1]):
        return None
    return normalise_number(lines[-1])


def normalise_number(text: str) -> str:
    """'6.0' → '6', '1.50000000000000' → '1.5', '92.97000000000001' → '92.97'; integers unchanged."""
    if "/" in text or not any(c in text for c in ".eE"):
        return text.lstrip("+")
    value = float(text)
    short = format(value, f".{SIGNIFICANT_DIGITS}g")
    if "e" in short:
        return short
    return short.rstrip("0").rstrip(".") if "." in short else short


# ---------------------------------------------------------------- finding code and expressions


def arithmetic_expression(text: str) -> str | None:
    """The last pure arithmetic expression in `text` (numbers, + - * / // % ** ^ × ÷, parentheses,
    at least one binary operation), in Python syntax; None if there is none."""
    for run in reversed(_ARITH_RUN.findall(text)):
        candidate = _trim_parentheses(run.strip().rstrip(".").strip())
        candidate = candidate.replace("×", "*").replace("÷", "/").replace("^", "**")
        if candidate and _is_arithmetic(candidate):
            return candidate
    return None


def _trim_parentheses(run: str) -> str:
    """Drop parentheses a run caught from the text around it: 'g(x) + 3' gives ') + 3', '(see 7 + 1)'
    gives '7 + 1)'."""
    run = run.lstrip(")").rstrip("(").strip()
    while run.endswith(")") and run.count(")") > run.count("("):
        run = run[:-1].rstrip()
    while run.startswith("(") and run.count("(") > run.count(")"):
        run = run[1:].lstrip()
    return run


def _is_arithmetic(candidate: str) -> bool:
    try:
        tree = ast.parse(candidate, mode="eval")
    except SyntaxError:
        return False
    nodes = list(ast.walk(tree))
    numbers_only = all(isinstance(n, _ARITH_NODES) for n in nodes) and all(
        isinstance(n.value, (int, float)) for n in nodes if isinstance(n, ast.Constant))
    return numbers_only and any(isinstance(n, ast.BinOp) for n in nodes)


def last_llm_reply(state: EpisodeState) -> str:
    """The latest non-empty reply to an `answer` call ("" if there is none)."""
    for turn in reversed(state.turns):
        if turn.primitive == "answer" and turn.response.strip():
            return turn.response
    return ""


def python_code(state: EpisodeState) -> str | None:
    blocks = _PYTHON_BLOCK.findall(last_llm_reply(state))
    if blocks and blocks[-1].strip():
        return blocks[-1]
    expression = arithmetic_expression(state.task.prompt)
    return f"print({expression})" if expression else None


def sympy_expression(state: EpisodeState) -> str | None:
    return arithmetic_expression(last_llm_reply(state)) or arithmetic_expression(state.task.prompt)


# ---------------------------------------------------------------- the LLM request


def _one_line(text: str, limit: int = SUMMARY_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def summarise_turns(turns: list[TurnRecord], answer: str | None) -> str:
    """A few lines on what the previous turns returned, for the LLM's next attempt."""
    lines = [f"- {t.worker} ({t.primitive}): {_one_line(t.response) or '(no output)'}" for t in turns[-SUMMARY_TURNS:]]
    if answer is not None:
        lines.append(f"Current candidate answer: {answer}")
    return "Previous attempts:\n" + "\n".join(lines)


def answer_messages(state: EpisodeState) -> list[dict[str, str]]:
    content = state.task.prompt
    if state.turns:
        content += "\n\n" + summarise_turns(state.turns, state.answer) + "\n\nGive the final answer."
    return [{"role": "user", "content": content}]


# ---------------------------------------------------------------- scoring


@functools.lru_cache(maxsize=None)
def _rg_scorer(family: str):
    import reasoning_gym  # imported here: importing it loads every family's module (~1 s)

    return reasoning_gym.get_score_answer_fn(family)


def verifier_of(task) -> str:
    """The task's verifier: meta["verifier"], else inferred from the suite name."""
    if task.meta.get("verifier"):
        return task.meta["verifier"]
    if task.suite.startswith("rg/"):
        return RG_VERIFIER
    if task.suite.split("/")[0] in ("gsm8k", "math", "math500"):
        return MATH_VERIFIER
    return "exact"


def score_answer(task, answer: str | None) -> float:
    """Score of `answer` for `task` in [0, 1] (module docstring)."""
    if answer is None or not str(answer).strip():
        return 0.0
    verifier = verifier_of(task)
    if verifier == RG_VERIFIER:
        entry = task.meta.get("rg_entry") or {"question": task.prompt, "answer": task.answer, "metadata": {}}
        family = task.meta.get("rg_dataset") or task.suite.removeprefix("rg/")
        try:
            value = float(_rg_scorer(family)(answer, entry))
        except (ValueError, TypeError, ArithmeticError, AttributeError, IndexError, KeyError):
            value = 0.0  # a family's scorer choking on a malformed answer means the answer is wrong
        return min(max(value, 0.0), 1.0)
    if verifier == MATH_VERIFIER:
        return float(verify_math(task.answer, answer))
    return float(answer.strip() == task.answer.strip())


# ---------------------------------------------------------------- the environment


class QAEnvironment:
    """Single-question episodes over QA tasks (reasoning-gym suites, GSM8K, MATH).

    Stateless across episodes (the rollout engine shares one instance between concurrent episodes):
    everything it reads is in the EpisodeState. `request` has no side effects, since the engine
    calls it for every primitive to price the offered actions.
    """

    success_threshold = 1.0

    def __init__(self, name: str = "qa"):
        self.name = name

    def reset(self, state: EpisodeState) -> None:
        """Nothing to prepare: a QA episode is its task."""

    def request(self, state: EpisodeState, primitive: str) -> Payload:
        if primitive == "answer":
            return answer_messages(state)
        if primitive == "python":
            return python_code(state) or ""
        if primitive == "sympy":
            return sympy_expression(state) or ""
        return ""  # observe() records unknown_primitive; an empty payload costs a tool nothing to run

    def observe(self, state: EpisodeState, primitive: str, text: str) -> Observation:
        if primitive == "answer":
            answer = extract_answer(text)
            return Observation(answer=answer, errors=[] if answer is not None else [error("no_answer")])
        if primitive in ("python", "sympy"):
            return self._observe_tool(state, primitive, text)
        return Observation(errors=[error("unknown_primitive")])

    def _observe_tool(self, state: EpisodeState, primitive: str, text: str) -> Observation:
        had_input = python_code(state) if primitive == "python" else sympy_expression(state)
        if not had_input:
            return Observation(errors=[error("no_code" if primitive == "python" else "no_expression")])
        if any(line.startswith("Error:") for line in text.splitlines()):
            return Observation(errors=[error("tool_error")])
        value = tool_value(text)
        return Observation(answer=value, errors=[] if value is not None else [error("tool_no_value")])

    def score(self, state: EpisodeState) -> float:
        return score_answer(state.task, state.answer)

    def close(self, state: EpisodeState) -> None:
        """Nothing to release."""

