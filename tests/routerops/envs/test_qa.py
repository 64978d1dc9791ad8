"""QAEnvironment on handwritten replies (no LLM), and on the real python / sympy tool workers."""

from __future__ import annotations

import copy

import pytest

from routerops.envs.qa import (
    SEVERITY,
    QAEnvironment,
    arithmetic_expression,
    extract_answer,
    score_answer,
    tool_value,
)
from routerops.envs.suites import materialise_suites
from routerops.pricing import WorkerSpec
from routerops.types import EpisodeState, Task, TurnRecord
from routerops.workers.tools import PythonWorker, SympyWorker

GSM = Task(task_id="gsm8k/test/0", suite="gsm8k", split="test", answer="18", meta={"verifier": "math-verify"},
           prompt="Janet's ducks lay 16 eggs per day. She eats 3 and bakes with 4. She sells the rest at $2. "
                  "How much does she make?")
ARITH = Task(task_id="u/0", suite="unit", split="test", prompt="Calculate 12 * 7 - 5.", answer="79")
WORDS = Task(task_id="u/1", suite="unit", split="test", prompt="Find the GCD of 12, 18.", answer="6")


@pytest.fixture(scope="module")
def rg_tasks() -> dict[str, Task]:
    tasks = materialise_suites(["leg_counting", "basic_arithmetic", "gcd"], [], {"train": 0, "val": 0, "test": 1})
    return {t.meta["rg_dataset"]: t for t in tasks}


def turn(primitive: str, response: str, worker: str = "smol-cot") -> TurnRecord:
    return TurnRecord(turn_index=0, actor="p", worker=worker, primitive=primitive, message="", response=response,
                      prompt_tokens=0, completion_tokens=0, cached_tokens=0, latency_s=0.0, cost_usd=0.0,
                      errors=[], propensity=1.0)


def state_after(task: Task, *turns: TurnRecord, answer: str | None = None) -> EpisodeState:
    return EpisodeState(task=task, turns=list(turns), answer=answer)


ENV = QAEnvironment()


# ---------------------------------------------------------------- reading replies


@pytest.mark.parametrize(
    "reply, answer",
    [
        ("16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\nAnswer: 18", "18"),
        ("Answer: $18.", "18"),
        ("**Answer:** 292 legs.", "292"),
        ("so the result is \\boxed{\\frac{1}{2}} indeed", "\\frac{1}{2}"),
        ("9 * 2 = 18\n#### 1,018", "1018"),
        ("She makes 9 * 2 = 18 dollars", "18"),
        ("Final Answer: The final answer is $18$.", "18"),
        ("no digits here\nlast line", "last line"),
        ("Answer: 138/583", "138/583"),
    ],
)
def test_extract_answer(reply, answer):
    assert extract_answer(reply) == answer


def test_empty_reply_has_no_answer_and_records_no_answer():
    seen = ENV.observe(state_after(GSM), "answer", "   ")
    assert seen.answer is None and seen.errors == [{"rule": "no_answer", "severity": "medium"}]


def test_llm_reply_becomes_the_candidate_answer():
    seen = ENV.observe(state_after(GSM), "answer", "She sells 9 eggs.\nAnswer: 18")
    assert (seen.answer, seen.errors, seen.done) == ("18", [], False)


# ---------------------------------------------------------------- requests


def test_answer_request_is_the_prompt_then_a_summary_of_previous_turns():
    assert ENV.request(state_after(GSM), "answer") == [{"role": "user", "content": GSM.prompt}]
    later = state_after(GSM, turn("answer", "I think 20"), turn("sympy", "18", worker="sympy"), answer="18")
    [message] = ENV.request(later, "answer")
    assert message["role"] == "user" and message["content"].startswith(GSM.prompt)
    assert "smol-cot (answer): I think 20" in message["content"] and "sympy (sympy): 18" in message["content"]
    assert "Current candidate answer: 18" in message["content"] and "final answer" in message["content"]


def test_python_request_is_the_last_code_block_of_the_last_llm_reply():
    reply = "```python\nprint(1)\n```\nbetter:\n```python\nprint((16 - 3 - 4) * 2)\n```"
    state = state_after(GSM, turn("answer", reply), turn("sympy", "5", worker="sympy"))
    assert ENV.request(state, "python") == "print((16 - 3 - 4) * 2)\n"


def test_python_request_falls_back_to_the_prompt_arithmetic_else_nothing():
    assert ENV.request(state_after(ARITH), "python") == "print(12 * 7 - 5)"
    assert ENV.request(state_after(WORDS), "python") == ""
    seen = ENV.observe(state_after(WORDS), "python", "")
    assert seen.answer is None and seen.errors == [{"rule": "no_code", "severity": "medium"}]


def test_sympy_request_prefers_the_reply_then_the_prompt():
    state = state_after(ARITH, turn("answer", "First 12 * 7 = 84, then 84 - 5 = 79"))
    assert ENV.request(state, "sympy") == "84 - 5"
    assert ENV.request(state_after(ARITH), "sympy") == "12 * 7 - 5"
    assert ENV.request(state_after(WORDS), "sympy") == ""
    assert ENV.observe(state_after(WORDS), "sympy", "Error: empty expression").errors == [
        {"rule": "no_expression", "severity": "medium"}]


def test_request_has_no_side_effects():
    state = state_after(GSM, turn("answer", "```python\nprint(18)\n```"), answer="18")
    before = copy.deepcopy(state)
    for primitive in ("answer", "python", "sympy", "answer"):
        ENV.request(state, primitive)
    assert state == before


def test_arithmetic_expression_only_takes_pure_arithmetic():
    assert arithmetic_expression("State the answer: 4 - 1 - 7 =") == "4 - 1 - 7"
    assert arithmetic_expression("Compute 2^10.") == "2**10"
    assert arithmetic_expression("one-third of 36 pens") is None
    assert arithmetic_expression("__import__('os')") is None
    assert arithmetic_expression("x = (3 + 4) * 2, then") == "(3 + 4) * 2"
    assert arithmetic_expression("g(x) + 3 and 7 + 1)") == "7 + 1"  # stray parentheses trimmed
    assert arithmetic_expression("just 42") is None


# ---------------------------------------------------------------- tool results


def test_tool_output_that_looks_like_a_value_becomes_the_answer():
    assert ENV.observe(state_after(ARITH), "python", "79\n").answer == "79"
    assert ENV.observe(state_after(ARITH), "sympy", "79.0000000000000").answer == "79"
    assert tool_value("0.30000000000000004") == "0.3" and tool_value("7/3") == "7/3"


def test_tool_errors_and_valueless_output_are_recorded():
    failed = ENV.observe(state_after(ARITH), "python", "Traceback...\nError: NameError: name 'x' is not defined")
    assert failed.answer is None and failed.errors == [{"rule": "tool_error", "severity": "high"}]
    wordy = ENV.observe(state_after(ARITH), "python", "the result is big")
    assert wordy.answer is None and wordy.errors == [{"rule": "tool_no_value", "severity": "low"}]
    assert ENV.observe(state_after(ARITH), "search", "x").errors == [{"rule": "unknown_primitive", "severity": "high"}]
    assert set(SEVERITY.values()) <= {"high", "medium", "low"}


async def test_requests_run_on_the_real_tool_workers():
    python = PythonWorker(WorkerSpec(name="python", kind="python", primitives=("python",), timeout_s=10))
    sympy = SympyWorker(WorkerSpec(name="sympy", kind="sympy", primitives=("sympy",), timeout_s=10))
    for worker, primitive, state in [
        (python, "python", state_after(ARITH)),
        (python, "python", state_after(GSM, turn("answer", "```python\nprint((16 - 3 - 4) * 2)\n```"))),
        (sympy, "sympy", state_after(ARITH)),
        (sympy, "sympy", state_after(GSM, turn("answer", "so (16 - 3 - 4) * 2"))),
    ]:
        result = await worker.call(ENV.request(state, primitive))
        seen = ENV.observe(state, primitive, result.text)
        assert seen.errors == [], result.text
        assert ENV.score(state_after(state.task, answer=seen.answer)) == 1.0, (primitive, result.text)
    broken = state_after(GSM, turn("answer", "```python\nprint(eggs * 2)\n```"))
    result = await python.call(ENV.request(broken, "python"))
    assert ENV.observe(broken, "python", result.text).errors == [{"rule": "tool_error", "severity": "high"}]


# ---------------------------------------------------------------- scoring


def test_math_verify_scores_gsm8k_answers():
    assert ENV.score(state_after(GSM, answer="18")) == 1.0
    assert ENV.score(state_after(GSM, answer="18.00")) == 1.0
    assert ENV.score(state_after(GSM, answer="17")) == 0.0
    assert ENV.score(state_after(GSM)) == 0.0  # no answer at all


def test_reasoning_gym_tasks_use_the_family_scorer(rg_tasks):
    for task in rg_tasks.values():
        assert ENV.score(state_after(task, answer=task.answer)) == 1.0
        assert ENV.score(state_after(task, answer="-123456789")) < 1.0
        assert ENV.score(state_after(task, answer="")) == 0.0
    legs = rg_tasks["leg_counting"]
    partial = score_answer(legs, f"{legs.answer} legs in total")  # reasoning-gym gives partial credit
    assert 0.0 < partial < 1.0


def test_other_suites_score_by_exact_match():
    assert ENV.score(state_after(WORDS, answer=" 6 ")) == 1.0
    assert ENV.score(state_after(WORDS, answer="6.0")) == 0.0


def test_full_episode_of_handwritten_turns_scores_the_final_answer(rg_tasks):
    task = rg_tasks["basic_arithmetic"]
    state = state_after(task)
    wrong = ENV.observe(state, "answer", "Answer: 99999")
    state.answer = wrong.answer
    state.turns.append(turn("answer", "Answer: 99999"))
    assert ENV.score(state) == 0.0
    right = ENV.observe(state, "answer", f"Let me recompute. Answer: {task.answer}")
    state.answer = right.answer
    assert ENV.score(state) == 1.0
