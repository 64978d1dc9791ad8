"""Property tests (Hypothesis) of the gateway's request parsers (gateway/parsing.py): whatever the
bytes, a parsed request or our 400 in the OpenAI format, never another exception; and whatever a
parsed request holds, the budget bound (gateway/routing.py) covers every byte a worker can be billed for."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import RequestError
from gateway.parsing import MAX_JSON_DEPTH, MEDIA_PARTS, ROLES, check_chat_request, read_feedback, read_json_object
from gateway.routing import prompt_token_bound

EXAMPLES = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3)  # json.dumps escapes them
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30) | surrogates
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=25)
part_types = st.sampled_from(["text", "refusal", *MEDIA_PARTS, "audio", ""]) | st.text(max_size=6)
parts = st.fixed_dictionaries({"type": part_types}, optional={
    "text": st.text(max_size=40) | json_values, "refusal": st.text(max_size=10) | json_values,
    "image_url": st.fixed_dictionaries({"url": st.text(max_size=30)}) | json_values,
    "input_audio": st.dictionaries(st.text(max_size=5), st.text(max_size=10), max_size=2) | json_values,
    "file": st.dictionaries(st.text(max_size=5), st.text(max_size=10), max_size=2) | json_values})
tool_calls = st.lists(st.fixed_dictionaries({"id": st.text(max_size=5) | json_values, "type": st.just("function"),
                                             "function": st.fixed_dictionaries({
                                                 "name": st.text(max_size=8) | json_values,
                                                 "arguments": st.text(max_size=40) | json_values})}), max_size=2)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(ROLES) | st.text(max_size=6) | json_values},
    optional={"content": st.text(max_size=60) | st.lists(parts, max_size=3) | json_values,
              "name": st.text(max_size=20) | json_values, "tool_call_id": st.text(max_size=8) | json_values,
              "tool_calls": tool_calls | json_values, "extra": json_values})
tools = st.lists(st.fixed_dictionaries({"type": st.just("function") | st.text(max_size=4), "function": st.fixed_dictionaries(
    {"name": st.text(max_size=8) | json_values}, optional={"parameters": json_values})}), max_size=2)
chat_bodies = st.fixed_dictionaries(
    {"model": st.just("auto") | json_values, "messages": st.lists(messages, max_size=4) | json_values},
    optional={name: json_values | st.integers(min_value=-2, max_value=5000) | st.floats(allow_nan=True)
              for name in ("max_tokens", "n", "budget_usd", "cost_weight", "turns_left", "temperature", "seed",
                           "stream", "explain", "stop", "tool_choice", "response_format", "parallel_tool_calls")}
    | {"tools": tools | json_values})

# Well-formed requests (OpenAI's message shapes), so that the bound's property is tested on many
# accepted requests, not only on the refused ones the free-form strategy mostly draws.
words = st.text(max_size=40)
text_part = st.fixed_dictionaries({"type": st.just("text"), "text": words})
media_part = st.sampled_from(MEDIA_PARTS).flatmap(lambda kind: st.fixed_dictionaries(
    {"type": st.just(kind), kind: st.fixed_dictionaries({"url": words} if kind == "image_url" else {"data": words})}))
valid_call = st.fixed_dictionaries({"id": words, "type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": words, "arguments": json_values.map(json.dumps)})})
valid_messages = st.one_of(
    st.fixed_dictionaries({"role": st.just("user"), "content": words | st.lists(text_part | media_part, max_size=3)},
                          optional={"name": words}),
    st.fixed_dictionaries({"role": st.sampled_from(["system", "developer"]),
                           "content": words | st.lists(text_part, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none(),
                           "tool_calls": st.lists(valid_call, min_size=1, max_size=2)}, optional={"refusal": words}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": words}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": words, "content": words}))
valid_tools = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": words}, optional={"description": words, "parameters": json_values})}), min_size=1, max_size=2)
valid_bodies = st.fixed_dictionaries(
    {"model": st.just("auto"), "messages": st.lists(valid_messages, min_size=1, max_size=4)},
    optional={"max_tokens": st.integers(1, 64), "tools": valid_tools, "response_format": st.just({"type": "json_object"}),
              "tool_choice": st.just("auto"), "stop": st.lists(words, max_size=2), "budget_usd": st.floats(0, 1),
              "stream": st.booleans(), "name_of_an_unknown_field": json_values})


def assert_ours(exc: RequestError) -> None:
    body = exc.body()["error"]
    assert exc.status == 400 and body["type"] == "invalid_request_error" and body["message"]
    json.dumps(exc.body())  # renderable


@EXAMPLES
@given(st.binary(max_size=200))
def test_any_bytes_are_a_json_object_or_our_400(raw):
    try:
        assert isinstance(read_json_object(raw), dict)
    except RequestError as exc:
        assert_ours(exc)


@pytest.mark.slow
@EXAMPLES
@given(json_values, st.integers(min_value=0, max_value=3 * MAX_JSON_DEPTH))
def test_any_json_nested_to_any_depth_is_an_object_or_our_400(value, depth):
    raw = ("[" * depth + json.dumps(value) + "]" * depth).encode()
    try:
        parsed = read_json_object(raw)
        assert isinstance(parsed, dict) and depth == 0
    except RequestError as exc:
        assert_ours(exc)


@pytest.mark.slow
@EXAMPLES
@given(valid_bodies | chat_bodies)
def test_any_chat_body_is_a_checked_request_or_our_400(body):
    raw = json.dumps(body).encode()
    try:
        req = check_chat_request(read_json_object(raw))
    except RequestError as exc:
        assert_ours(exc)
        return
    assert req.messages and all(m["role"] in ROLES for m in req.messages)
    assert req.max_tokens is None or req.max_tokens >= 1
    # The bound covers what a worker that accepts everything bills: a token per byte of every string
    # sent, and at most its declared tokens per media part.
    accepts = {kind: 100 for kind in MEDIA_PARTS} | {"tools": 0}
    bound = prompt_token_bound(req.messages, "", accepts, req.body)
    assert math.isfinite(bound) and bound >= billed_bytes(req.messages, req.body, accepts)
    if req.media or req.tools:  # a text-only worker is never sent them
        assert prompt_token_bound(req.messages, "", {}, req.body) == math.inf


def billed_bytes(messages, body, accepts) -> int:
    def strings(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)

    total = 0
    for m in messages:
        content = m.get("content")
        for part in content if isinstance(content, list) else []:
            if part["type"] in MEDIA_PARTS:
                total += accepts[part["type"]]
            else:
                total += len(part[part["type"]].encode())
        rest = [v for k, v in m.items() if k not in ("role", "content")] + ([content] if isinstance(content, str) else [])
        total += sum(len(s.encode()) for s in strings(rest))
    if body.get("tools"):
        total += sum(len(s.encode()) for s in strings(body["tools"]))
    return total


@EXAMPLES
@given(st.binary(max_size=60) | json_values.map(lambda v: json.dumps(v).encode())
       | st.floats(allow_nan=True).map(lambda x: json.dumps({"score": x}).encode()))
def test_any_feedback_body_is_a_score_or_our_400(raw):
    try:
        score = read_feedback(raw)
        assert 0.0 <= score <= 1.0
    except RequestError as exc:
        assert_ours(exc)


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b"{" * 100_000, b"\xff\xfe", b"{", b"[1]",
                                 b'{"a": "\\ud800"}', b'{"a": NaN}', b'{"a": -Infinity}', b'{"a": 1e999}'])
def test_the_reported_bodies_are_our_400(raw):
    with pytest.raises(RequestError) as info:
        read_json_object(raw)
    assert_ours(info.value)


def test_a_null_max_completion_tokens_does_not_hide_max_tokens():
    # found by Schemathesis (tests/gateway/test_schema_fuzz.py's longer run): {"max_completion_tokens": null, "max_tokens": 0} was a 200
    body = {"model": "auto", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": None,
            "max_tokens": 0}
    with pytest.raises(RequestError):
        check_chat_request(body)
    assert check_chat_request({**body, "max_tokens": 7}).max_tokens == 7
    assert check_chat_request({**body, "max_tokens": 7, "max_completion_tokens": 5.0}).max_tokens == 5
    # found by the longer run: a valid max_completion_tokens beside max_tokens 0 was a 200
    with pytest.raises(RequestError):
        check_chat_request({**body, "max_tokens": 0, "max_completion_tokens": 5})


def test_an_image_detail_outside_openais_values_is_our_400():
    # found by Schemathesis (tests/gateway/test_schema_fuzz.py): {"detail": "0"} was a 200
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA==", "detail": "0"}}
    body = {"model": "auto", "messages": [{"role": "user", "content": [part]}]}
    with pytest.raises(RequestError) as info:
        check_chat_request(body)
    assert_ours(info.value)
    assert info.value.body()["error"]["param"] == "messages[0].content[0].image_url.detail"
    for detail in ("auto", "low", "high"):
        part["image_url"]["detail"] = detail
        check_chat_request(body)
