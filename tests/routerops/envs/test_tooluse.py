"""Tool-use QA environment: every Table 7 rule we can trigger, detected with the paper's severity,
through the real sandbox; scoring through math-verify."""

from __future__ import annotations

import json

import pytest

from routerops.envs import tooluse
from routerops.errors import RouteropsError
from routerops.types import EpisodeState, Task
from routerops.workers.sandbox import SandboxLimits

pytest.importorskip("math_verify")

TASK = Task(task_id="q1", suite="gsm8k", split="test", prompt="What is 17 * 23?", answer="391")


def call(name: str, **arguments) -> str:
    return "I will use a tool.\n<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture
def env() -> tooluse.ToolUseEnvironment:
    return tooluse.ToolUseEnvironment(limits=SandboxLimits(cpu_s=1, wall_s=3.0))


@pytest.fixture
def state(env) -> EpisodeState:
    state = EpisodeState(task=TASK, turn_limit=5)
    env.reset(state)
    return state


# ---------------------------------------------------------------- reply rules


@pytest.mark.parametrize("reply, rule, severity", [
    ("The answer is 391.", "format_error", "medium"),
    ('<tool_call>{"name": "python", "arguments": {"code": </tool_call>', "tool_parse_error", "medium"),
    ('<tool_call>["python"]</tool_call>', "tool_parse_error", "medium"),
    (call("search", query="17*23"), "tool_unknown", "high"),
    (call("python"), "tool_invalid_args", "medium"),
    (call("python", code=17), "tool_invalid_args", "medium"),
    (call("python", code="print(1)", timeout=3), "tool_invalid_args", "medium"),
    ('<tool_call>{"name": "answer", "arguments": "391"}</tool_call>', "tool_invalid_args", "medium"),
])
def test_reply_rules(env, state, reply, rule, severity):
    seen = env.observe(state, "answer", reply)
    assert seen.errors == [{"rule": rule, "severity": severity}]
    assert not seen.done and seen.answer is None
    assert seen.observation  # the agent is told what went wrong


def test_severities_follow_table_7():
    high = {r for r, s in tooluse.SEVERITY.items() if s == "high"}
    assert high == {"tool_unknown", "python_traceback", "python_name_error", "python_syntax_error",
                    "python_indentation_error", "python_type_error", "python_timeout", "python_sandbox_limit"}
    assert set(tooluse.SEVERITY.values()) == {"high", "medium"}  # the low rules are the web tools'


# ---------------------------------------------------------------- Python rules, through the real sandbox


@pytest.mark.parametrize("code, rule, severity", [
    ("print(undefined_name)", "python_name_error", "high"),
    ("print(1 +", "python_syntax_error", "high"),
    ("if True:\nprint(1)", "python_indentation_error", "high"),
    ("print(1 + 'a')", "python_type_error", "high"),
    ("int('x')", "python_value_error", "medium"),
    ("[1][3]", "python_index_error", "medium"),
    ("{}['k']", "python_key_error", "medium"),
    ("(1).nope", "python_attribute_error", "medium"),
    ("import no_such_module_here", "python_import_error", "medium"),
    ("1 / 0", "python_zero_division", "medium"),
    ("raise RuntimeError('boom')", "python_traceback", "high"),
    ("while True:\n    pass", "python_timeout", "high"),
    ("import socket\nsocket.socket()", "python_sandbox_limit", "high"),
])
def test_python_rules(env, state, code, rule, severity):
    seen = env.observe(state, "answer", call("python", code=code))
    assert seen.errors == [{"rule": rule, "severity": severity}]
    assert not seen.done


def test_python_success_shows_output_without_errors(env, state):
    seen = env.observe(state, "answer", call("python", code="print(17 * 23)"))
    assert seen.errors == [] and seen.observation == "391"


def test_long_output_is_cut(state):
    env = tooluse.ToolUseEnvironment(max_output_chars=50)
    seen = env.observe(state, "answer", call("python", code="print('x' * 500)"))
    assert seen.observation.startswith("x" * 50) and "450 more characters" in seen.observation


# ---------------------------------------------------------------- an episode


def test_episode_python_then_answer_scores_with_math_verify(env, state):
    first = env.request(state, "answer")
    assert [m["role"] for m in first] == ["system", "user"] and first[1]["content"] == TASK.prompt
    assert '"python"' in first[0]["content"] and '"answer"' in first[0]["content"]

    env.observe(state, "answer", call("python", code="print(17 * 23)"))
    second = env.request(state, "answer")
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[-1]["content"] == "Tool result:\n391"

    seen = env.observe(state, "answer", call("answer", answer="391.0"))
    assert seen.done and seen.answer == "391" + ".0" and seen.errors == []
    state.answer = seen.answer  # what the rollout engine does with Observation.answer
    assert env.score(state) == 1.0 == env.success_threshold
    env.close(state)


@pytest.mark.parametrize("reference, answer, score", [
    ("391", "391", 1.0), ("391", 391, 1.0), ("0.75", "\\frac{3}{4}", 1.0), ("3/4", "0.75", 1.0),
    ("391", "392", 0.0), ("391", None, 0.0), ("391", "  ", 0.0),
])
def test_verify_answer(reference, answer, score):
    assert tooluse.verify_answer(reference, None if answer is None else str(answer)) == score


def test_reasoning_gym_task_round_trip(env):
    reasoning_gym = pytest.importorskip("reasoning_gym")
    item = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=3)[0]
    task = Task(task_id="rg-0", suite="rg/basic_arithmetic", split="test", prompt=item["question"],
                answer=str(item["answer"]))
    state = EpisodeState(task=task)
    env.reset(state)
    seen = env.observe(state, "answer", call("answer", answer=str(item["answer"])))
    state.answer = seen.answer
    assert env.score(state) == 1.0


def test_tool_name_for_lift_analyses():
    assert tooluse.tool_name(call("python", code="1")) == "python"
    assert tooluse.tool_name(call("answer", answer="1")) == "answer"
    assert tooluse.tool_name("no call") == "format_error"


def test_tool_primitives_are_refused(env, state):
    with pytest.raises(RouteropsError, match="python"):
        env.request(state, "python")
