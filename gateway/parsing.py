"""The gateway's request parsers: raw bytes in, a checked request out, or a RequestError (400, in the
OpenAI error format) — never another exception, whatever the bytes (tests/gateway/test_parsing.py
runs Hypothesis over all three parsers).

`read_json_object` reads a body: UTF-8 (OpenAI's API and RFC 8259 require it), JSON, an object, at
most MAX_JSON_DEPTH levels deep (the C decoder recurses once per level: 100,000 levels of `[` were a
RecursionError, a 500).

`check_chat_request` checks a chat-completions body as OpenAI's API does: the types of the fields the
gateway reads, and each message's shape by role. A message's `content` is a string or a list of
content parts (`text`; on user messages also `image_url`, `input_audio`, `file`; on assistant
messages `refusal`); `content` given as an object, or a part of an unknown type, is refused, never
passed on unread. What the parser accepts is what the budget bound in gateway/routing.py
(`prompt_token_bound`) counts: every string of every message, the tool calls, and the tools and
response format sent with it. Media parts (MEDIA_PARTS) are not bounded by their bytes (a 20-byte
image URL can cost thousands of prompt tokens), so only a worker whose pool entry says it `accepts`
that part type, and how many tokens one part may cost, can be sent one (gateway/app.py).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from gateway.errors import RequestError

MAX_JSON_DEPTH = 64  # deeper than any chat request or tool schema needs; far below the decoder's recursion limit
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
MEDIA_PARTS = ("image_url", "input_audio", "file")
IMAGE_DETAILS = ("auto", "low", "high")  # OpenAI's `image_url.detail`, as gateway/openapi.py documents it
# Content part types each role may send (OpenAI's chat-completions message schemas).
PARTS_BY_ROLE = {"system": ("text",), "developer": ("text",), "user": ("text", *MEDIA_PARTS),
                 "assistant": ("text", "refusal"), "tool": ("text",), "function": ("text",)}
# Client fields passed on to the worker (they override the worker's own generation settings); `tools`,
# `tool_choice` and `parallel_tool_calls` only to a worker that accepts tools (pool entry `accepts`).
SAMPLING_FIELDS = ("temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "response_format")
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")


def read_json_object(raw: bytes, what: str = "the body") -> dict[str, Any]:
    """`raw` as a JSON object, or RequestError(400)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"{what} is not UTF-8 (byte {exc.start}): send JSON encoded as UTF-8",
                           code="invalid_encoding") from None
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise RequestError(400, f"{what} nests JSON deeper than {MAX_JSON_DEPTH} levels", code="invalid_json") from None
    except ValueError as exc:  # JSONDecodeError, and the decoder's own limits (e.g. huge integers)
        raise RequestError(400, f"{what} is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(value, dict):
        raise RequestError(400, f"{what} must be a JSON object, got {json_type(value)}", code="invalid_type")
    if json_depth(value) > MAX_JSON_DEPTH:
        raise RequestError(400, f"{what} nests JSON deeper than {MAX_JSON_DEPTH} levels", code="invalid_json")
    if LONE_SURROGATE.search(text) and not _encodable(value):
        # "\ud800" is valid JSON but no UTF-8 text: it could be neither counted nor sent to a worker
        raise RequestError(400, f"{what} holds an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)",
                           code="invalid_encoding")
    return value


LONE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # a surrogate escape: checked when one appears


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is out of a double's range")
    return value


def _encodable(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        try:
            if isinstance(item, str):
                item.encode("utf-8")
            elif isinstance(item, dict):
                for k, v in item.items():
                    k.encode("utf-8")
                    stack.append(v)
            elif isinstance(item, list):
                stack.extend(item)
        except UnicodeEncodeError:
            return False
    return True


def json_depth(value: Any) -> int:
    """The nesting depth of a decoded JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_JSON_DEPTH:  # deeper is refused anyway: stop walking
            stack.extend((child, depth + 1) for child in children)
    return deepest


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__)


def invalid(param: str, expected: str, value: Any) -> RequestError:
    """OpenAI's wording: "Invalid type for 'messages[0].content': expected ..., but got an object instead." """
    return RequestError(400, f"Invalid type for '{param}': expected {expected}, but got {json_type(value)} instead.",
                        code="invalid_type", param=param)


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat-completions body: what the gateway reads of it (the body itself is kept as sent)."""

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int | None  # None: the workers' own limit, or the gateway's default
    stream: bool
    explain: bool
    budget_usd: float  # inf when not given
    cost_weight: float | None  # None: the gateway's λ
    turns_left: float  # inf when not given
    media: dict[str, int]  # media parts by type (MEDIA_PARTS): only workers that accept them can answer
    tools: bool  # tool definitions are sent: only workers that accept tools can answer
    body: dict[str, Any]


def check_chat_request(body: dict[str, Any]) -> ChatRequest:
    """`body` (a decoded JSON object) as a ChatRequest, or RequestError(400)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "`model` must be 'auto' or 'router:<registered name>'", param="model")
    messages = check_messages(body.get("messages"))
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or n != 1):
        raise RequestError(400, "`n` must be 1: one routed answer per request", param="n")
    # Each limit given must be valid; max_completion_tokens (OpenAI's newer name) wins when both are
    limits = {}
    for name in ("max_tokens", "max_completion_tokens"):
        value = integer(body.get(name))
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise RequestError(400, f"`{name}` must be a positive integer, got {short(value)}", param=name)
        limits[name] = value
    max_tokens = limits["max_tokens"] if limits["max_completion_tokens"] is None else limits["max_completion_tokens"]
    for name in ("stream", "explain"):
        if body.get(name) is not None and not isinstance(body.get(name), bool):
            raise invalid(name, "a boolean", body.get(name))
    tools = body.get("tools")
    if tools is not None:
        check_tools(tools)
    if body.get("tool_choice") is not None and not isinstance(body["tool_choice"], (str, dict)):
        raise invalid("tool_choice", "a string or an object", body["tool_choice"])
    if body.get("response_format") is not None and not isinstance(body["response_format"], dict):
        raise invalid("response_format", "an object", body["response_format"])  # OpenAI's: {"type": ...}
    if body.get("parallel_tool_calls") is not None and not isinstance(body.get("parallel_tool_calls"), bool):
        raise invalid("parallel_tool_calls", "a boolean", body.get("parallel_tool_calls"))
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise invalid(name, "a number", value)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise invalid("stop", "a string or an array of strings", stop)
    seed = integer(body.get("seed"))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise invalid("seed", "an integer", seed)
    media = Counter(part["type"] for m in messages if isinstance(m.get("content"), list)
                    for part in m["content"] if part["type"] in MEDIA_PARTS)
    return ChatRequest(model, messages, max_tokens, bool(body.get("stream")), bool(body.get("explain")),
                       optional_number(body, "budget_usd", math.inf), optional_number(body, "cost_weight", None),
                       optional_number(body, "turns_left", math.inf), dict(media), bool(tools), body)


def integer(value: Any) -> Any:
    """An integral float as an int (JSON Schema's integer: 387.0 is one); anything else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def optional_number(body: dict[str, Any], name: str, default: float | None) -> float | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise RequestError(400, f"`{name}` must be a number ≥ 0, got {short(value)}", param=name)
    return float(value)


def short(value: Any) -> str:
    """A value for an error message: its repr, cut (a client's 10 MB string is not echoed back)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "`messages` must be a non-empty list of {role, content} objects", param="messages")
    for i, message in enumerate(messages):
        check_message(message, f"messages[{i}]")
    return messages


def check_message(m: Any, where: str) -> None:
    if not isinstance(m, dict):
        raise invalid(where, "an object", m)
    role = m.get("role")
    if role not in ROLES:
        raise RequestError(400, f"`{where}.role` must be one of {', '.join(ROLES)}, got {short(role)}",
                           param=f"{where}.role")
    content = m.get("content")
    if content is None:
        if role != "assistant" or not (m.get("tool_calls") or m.get("function_call")):
            raise RequestError(400, f"`{where}.content` is required (null only on an assistant message with "
                                    f"tool_calls)", param=f"{where}.content")
    elif isinstance(content, list):
        for j, part in enumerate(content):
            check_part(part, role, f"{where}.content[{j}]")
    elif not isinstance(content, str):
        raise invalid(f"{where}.content", "one of a string or array of objects", content)
    for name in ("name", "tool_call_id", "refusal"):
        if m.get(name) is not None and not isinstance(m[name], str):
            raise invalid(f"{where}.{name}", "a string", m[name])
    if role == "tool" and not isinstance(m.get("tool_call_id"), str):
        raise RequestError(400, f"`{where}.tool_call_id` is required on a tool message", param=f"{where}.tool_call_id")
    calls = m.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise invalid(f"{where}.tool_calls", "an array on an assistant message", calls)
        for j, call in enumerate(calls):
            check_function(call.get("function") if isinstance(call, dict) else None, f"{where}.tool_calls[{j}].function",
                           arguments=True)
            if not isinstance(call.get("id"), str):
                raise invalid(f"{where}.tool_calls[{j}].id", "a string", call.get("id"))
            if call.get("type") != "function":  # OpenAI's only tool call type (gateway/openapi.py: const)
                raise RequestError(400, f"`{where}.tool_calls[{j}].type` must be 'function', got "
                                        f"{short(call.get('type'))}", param=f"{where}.tool_calls[{j}].type")
    if m.get("function_call") is not None:
        check_function(m["function_call"], f"{where}.function_call", arguments=True)


def check_part(part: Any, role: str, where: str) -> None:
    if not isinstance(part, dict):
        raise invalid(where, "an object", part)
    kind = part.get("type")
    if kind not in PARTS_BY_ROLE[role]:
        raise RequestError(400, f"`{where}.type` {short(kind)} is not a content part a {role} message may send "
                                f"(one of: {', '.join(PARTS_BY_ROLE[role])})", param=f"{where}.type")
    if kind in ("text", "refusal"):
        if not isinstance(part.get(kind), str):
            raise invalid(f"{where}.{kind}", "a string", part.get(kind))
    elif not isinstance(part.get(kind), dict):
        raise invalid(f"{where}.{kind}", "an object", part.get(kind))
    elif kind == "image_url":
        if not isinstance(part[kind].get("url"), str):
            raise invalid(f"{where}.image_url.url", "a string", part[kind].get("url"))
        if "detail" in part[kind] and part[kind]["detail"] not in IMAGE_DETAILS:
            raise RequestError(400, f"`{where}.image_url.detail` {short(part[kind]['detail'])} is not one of: "
                                    f"{', '.join(IMAGE_DETAILS)}", code="invalid_value", param=f"{where}.image_url.detail")


def check_function(fn: Any, where: str, arguments: bool = False) -> None:
    if not isinstance(fn, dict):
        raise invalid(where, "an object", fn)
    if not isinstance(fn.get("name"), str):
        raise invalid(f"{where}.name", "a string", fn.get("name"))
    if arguments and not isinstance(fn.get("arguments"), str):
        raise invalid(f"{where}.arguments", "a string", fn.get("arguments"))


def check_tools(tools: Any) -> None:
    if not isinstance(tools, list):
        raise invalid("tools", "an array", tools)
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise RequestError(400, f"`tools[{i}]` must be {{\"type\": \"function\", \"function\": {{...}}}}",
                               param=f"tools[{i}]")
        check_function(tool.get("function"), f"tools[{i}].function")


def read_feedback(raw: bytes) -> float:
    """POST /v1/decisions/{id}/feedback's body, {"score": 0..1}: the score, or RequestError(400)."""
    body = read_json_object(raw)
    score = body.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 1:
        raise RequestError(400, f"`score` must be a number in [0, 1], got {short(score)}", param="score")
    return float(score)
