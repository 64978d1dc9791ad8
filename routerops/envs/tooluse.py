"""Tool-use question answering as a multi-turn environment (MTRouter §4.1 HLE setting, Appendix B).

The agent model answers a question by calling tools, one call per turn, in the paper's format:

    <tool_call>{"name": "python", "arguments": {"code": "print(17 * 23)"}}</tool_call>
    <tool_call>{"name": "answer", "arguments": {"answer": "391"}}</tool_call>

Only `python` (run in routerops.workers.sandbox) and `answer` (submit, ends the episode) exist here:
the paper's `search` and `browse` need the web. Errors are detected by the Table 7 rules with their
severities — format, parse, unknown-tool and argument errors from the reply, Python errors from the
sandbox's stderr (a specific exception rule replaces the generic traceback rule, so one exception is
not counted twice) — plus one rule Table 7 lacks because the paper's sandbox had no such limits:
`python_sandbox_limit` (memory, output, process, network or file limit hit).

Score: 1.0 when math-verify finds the submitted answer equal to the task's reference, else 0.0
(`success_threshold` = 1.0). Tasks are any QA Tasks (GSM8K-format, reasoning-gym, MATH ...).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from routerops.envs.jsonl_qa import verify_math
from routerops.envs.scienceworld_env import recent_pairs  # history truncation shared by both environments
from routerops.errors import RouteropsError
from routerops.types import EpisodeState, Observation
from routerops.workers.sandbox import SandboxLimits, SandboxResult, run_python

SUITE = "tooluse"
TOOLS: dict[str, dict[str, Any]] = {  # Appendix E.3-style schemas, injected into the system prompt
    "python": {
        "description": "Run a Python 3 program and return what it prints (stdout and stderr). No network, "
                       "no files outside a scratch directory; print the values you need.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
    "answer": {
        "description": "Submit the final answer (a number or short expression); this ends the episode.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}
# Table 7, HLE rows we can trigger without the web, with the paper's severities.
SEVERITY = {
    "format_error": "medium", "tool_invalid_args": "medium", "tool_parse_error": "medium", "tool_unknown": "high",
    "python_traceback": "high", "python_name_error": "high", "python_syntax_error": "high",
    "python_indentation_error": "high", "python_type_error": "high", "python_value_error": "medium",
    "python_index_error": "medium", "python_key_error": "medium", "python_attribute_error": "medium",
    "python_import_error": "medium", "python_zero_division": "medium", "python_timeout": "high",
    "python_sandbox_limit": "high",  # not in Table 7: our sandbox's other limits (see module doc)
}
# Exception class in a traceback's last line → Table 7 rule.
EXCEPTION_RULES = {
    "NameError": "python_name_error", "UnboundLocalError": "python_name_error",
    "SyntaxError": "python_syntax_error", "IndentationError": "python_indentation_error",
    "TabError": "python_indentation_error", "TypeError": "python_type_error",
    "ValueError": "python_value_error", "IndexError": "python_index_error", "KeyError": "python_key_error",
    "AttributeError": "python_attribute_error", "ImportError": "python_import_error",
    "ModuleNotFoundError": "python_import_error", "ZeroDivisionError": "python_zero_division",
}
TIME_LIMITS = ("cpu_time", "wall_time")
POOL_TOOL_PRIMITIVES = ("python", "sympy")  # tool workers of the pool: the agent's tools are run here instead
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
FORMAT_HINT = 'Please use the correct format: <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'
SYSTEM_PROMPT = (
    "Solve the user's question. Each turn, call exactly one tool by writing\n"
    '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>\n'
    "Tools (JSON schemas):\n" + json.dumps(TOOLS, indent=1) + "\n"
    "Use python to compute, then submit with the answer tool, e.g.\n"
    '<tool_call>{"name": "answer", "arguments": {"answer": "42"}}</tool_call>'
)


def error(rule: str) -> dict[str, str]:
    return {"rule": rule, "severity": SEVERITY[rule]}


# ---------------------------------------------------------------- parsing a reply


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParseFailure:
    rule: str  # a SEVERITY key
    message: str  # what the agent is told


def parse_tool_call(text: str) -> ToolCall | ParseFailure:
    """The first tool call in a reply, validated against TOOLS, or why it is not one."""
    block = TOOL_CALL.search(text)
    if block is None:
        return ParseFailure("format_error", f"No tool call found. {FORMAT_HINT}")
    try:
        data = json.loads(block.group(1))
    except json.JSONDecodeError as exc:
        return ParseFailure("tool_parse_error", f"Failed to parse tool call JSON ({exc}). {FORMAT_HINT}")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ParseFailure("tool_parse_error", f"Failed to parse tool call: need an object with a name. {FORMAT_HINT}")
    name = data["name"]
    if name not in TOOLS:
        return ParseFailure("tool_unknown", f"Unknown tool '{name}'. Available tools: {', '.join(TOOLS)}.")
    arguments = data.get("arguments", {})
    problem = argument_problem(name, arguments)
    if problem:
        return ParseFailure("tool_invalid_args", f"Invalid arguments for {name}: {problem}")
    return ToolCall(name, dict(arguments))


def argument_problem(name: str, arguments: Any) -> str:
    """Why `arguments` do not fit the tool's schema ("" when they do). `answer` also takes a number."""
    if not isinstance(arguments, dict):
        return "arguments must be a JSON object"
    schema = TOOLS[name]["parameters"]
    missing = [p for p in schema["required"] if p not in arguments]
    if missing:
        return f"Missing required parameter '{missing[0]}'"
    unexpected = sorted(set(arguments) - set(schema["properties"]))
    if unexpected:
        return f"unexpected parameter '{unexpected[0]}'"
    for param, value in arguments.items():
        allowed = (str, int, float) if name == "answer" else (str,)
        if not isinstance(value, allowed) or isinstance(value, bool):
            return f"parameter '{param}' must be a string"
    return ""


def tool_name(text: str) -> str:
    """The tool a reply calls, or the rule it breaks; the action type for §4.3 lift analyses."""
    call = parse_tool_call(text)
    return call.name if isinstance(call, ToolCall) else call.rule


# ---------------------------------------------------------------- Python errors


def python_errors(result: SandboxResult) -> list[dict[str, str]]:
    """Table 7 Python rules for one sandbox run; the generic traceback rule only when no specific
    exception rule matched."""
    if result.limit in TIME_LIMITS:
        return [error("python_timeout")]
    if result.limit is not None:
        return [error("python_sandbox_limit")]
    names = re.findall(r"^(?:[\w.]+\.)?(\w+):", result.stderr, re.M)  # "json.decoder.X:" → "X"
    rules = sorted({EXCEPTION_RULES[n] for n in names if n in EXCEPTION_RULES})
    if not rules and "Traceback (most recent call last)" in result.stderr:
        rules = ["python_traceback"]
    return [error(r) for r in rules]


def tool_output(result: SandboxResult, max_chars: int) -> str:
    parts = [result.stdout.rstrip()] if result.stdout.strip() else []
    if result.stderr.strip():
        parts.append("stderr:\n" + result.stderr.rstrip())
    if result.limit in TIME_LIMITS:
        parts.append("Execution timed out.")
    text = "\n".join(parts) or "(no output; print the values you need)"
    return text if len(text) <= max_chars else text[:max_chars] + f"\n... ({len(text) - max_chars} more characters)"


# ---------------------------------------------------------------- scoring


def verify_answer(reference: str, answer: str | None) -> float:
    """1.0 when math-verify judges `answer` equal to `reference`, else 0.0."""
    return 1.0 if answer is not None and verify_math(reference, str(answer)) else 0.0


# ---------------------------------------------------------------- the environment


class ToolUseEnvironment:
    """Environment protocol (routerops.types): QA with `python` and `answer` tools."""

    name = SUITE
    success_threshold = 1.0

    def __init__(self, history_chars: int = 3000, max_output_chars: int = 1000,
                 limits: SandboxLimits = SandboxLimits(cpu_s=5, wall_s=10.0),
                 runner: Callable[[str, SandboxLimits], SandboxResult] = run_python):
        self.history_chars = history_chars  # most recent (reply, tool result) pairs within this many characters
        self.max_output_chars = max_output_chars  # tool output shown to the agent is cut here
        self.limits = limits  # sandbox limits for each python call
        self.runner = runner  # the sandbox; another isolation backend can be passed in

    def reset(self, state: EpisodeState) -> None:
        state.env_state.update(history=[])
        state.observation = ""

    def request(self, state: EpisodeState, primitive: str) -> list[dict[str, str]]:
        if primitive in POOL_TOOL_PRIMITIVES:
            raise RouteropsError(f"tool-use QA serves LLM workers only; primitive {primitive!r} is a tool here")
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": state.task.prompt}]
        history = recent_pairs(state.env_state["history"], self.history_chars)
        for reply, result in history:
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"Tool result:\n{result}"}]
        return messages

    def observe(self, state: EpisodeState, primitive: str, text: str) -> Observation:
        call = parse_tool_call(text)
        answer, done, errors = None, False, []
        if isinstance(call, ParseFailure):
            observation, errors = call.message, [error(call.rule)]
        elif call.name == "answer":
            answer, done = str(call.arguments["answer"]).strip(), True
            observation = "Answer submitted."
        else:
            result = self.runner(call.arguments["code"], self.limits)
            observation, errors = tool_output(result, self.max_output_chars), python_errors(result)
        state.env_state["history"].append((text, observation))
        state.observation = observation
        return Observation(answer=answer, errors=errors, observation=observation, done=done)

    def score(self, state: EpisodeState) -> float:
        return verify_answer(state.task.answer, state.answer)

    def close(self, state: EpisodeState) -> None:
        state.env_state.pop("history", None)
