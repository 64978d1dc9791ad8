"""The gateway's OpenAPI schema: what each route takes and answers, in OpenAI's shapes, so that a
client generator, the docs and a schema fuzzer (Schemathesis: tests/gateway/test_schema_fuzz.py,
tests/gateway/test_schema_fuzz.py) see the API the gateway serves. The routes read their bodies themselves
(gateway/parsing.py: one parser, one error format), so the request bodies are declared here."""

from __future__ import annotations

from typing import Any

from gateway.parsing import MEDIA_PARTS

NULLABLE_STRING = {"type": ["string", "null"]}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "param": NULLABLE_STRING,
                   "code": NULLABLE_STRING}}}}
TEXT_PART = {"type": "object", "required": ["type", "text"],
             "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
REFUSAL_PART = {"type": "object", "required": ["type", "refusal"],
                "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}}}
IMAGE_PART = {"type": "object", "required": ["type", "image_url"],
              "properties": {"type": {"const": "image_url"}, "image_url": {
                  "type": "object", "required": ["url"],
                  "properties": {"url": {"type": "string"}, "detail": {"enum": ["auto", "low", "high"]}}}}}
AUDIO_PART = {"type": "object", "required": ["type", "input_audio"],
              "properties": {"type": {"const": "input_audio"}, "input_audio": {"type": "object"}}}
FILE_PART = {"type": "object", "required": ["type", "file"],
             "properties": {"type": {"const": "file"}, "file": {"type": "object"}}}
TOOL_CALL = {"type": "object", "required": ["id", "type", "function"], "properties": {
    "id": {"type": "string"}, "type": {"const": "function"},
    "function": {"type": "object", "required": ["name", "arguments"],
                 "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}}


def text_or(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": list(parts)}}]}


# One schema per role (OpenAI's chat-completions message schemas; gateway/parsing.py checks the same)
MESSAGE = {"oneOf": [
    {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"enum": ["system", "developer"]}, "content": text_or(TEXT_PART), "name": {"type": "string"}}},
    {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"const": "user"}, "content": text_or(TEXT_PART, IMAGE_PART, AUDIO_PART, FILE_PART),
        "name": {"type": "string"}}},
    {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"const": "assistant"}, "content": text_or(TEXT_PART, REFUSAL_PART), "name": {"type": "string"},
        "refusal": {"type": ["string", "null"]}}},
    {"type": "object", "required": ["role", "content", "tool_calls"], "properties": {
        "role": {"const": "assistant"}, "content": {"type": "null"},
        "tool_calls": {"type": "array", "minItems": 1, "items": TOOL_CALL}}},
    {"type": "object", "required": ["role", "content", "tool_call_id"], "properties": {
        "role": {"const": "tool"}, "content": text_or(TEXT_PART), "tool_call_id": {"type": "string"}}},
]}
TOOL = {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"const": "function"}, "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "description": {"type": "string"}, "parameters": {"type": "object"}}}}}
NUMBER = {"type": ["number", "null"]}
CHAT_REQUEST = {"type": "object", "required": ["model", "messages"], "properties": {
    "model": {"type": "string", "minLength": 1, "description": "'auto' or 'router:<registered name>'"},
    "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
    "max_tokens": {"type": ["integer", "null"], "minimum": 1},
    "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
    "stream": {"type": ["boolean", "null"]}, "n": {"enum": [1, None]},
    "temperature": NUMBER, "top_p": NUMBER, "presence_penalty": NUMBER, "frequency_penalty": NUMBER,
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
    "seed": {"type": ["integer", "null"]},
    "tools": {"type": ["array", "null"], "items": TOOL},
    "tool_choice": {"anyOf": [{"type": "string"}, {"type": "object"}, {"type": "null"}]},
    "parallel_tool_calls": {"type": ["boolean", "null"]},
    "response_format": {"type": ["object", "null"]},
    "budget_usd": {"type": ["number", "null"], "minimum": 0, "description": "routerops: this request's USD cap"},
    "cost_weight": {"type": ["number", "null"], "minimum": 0, "description": "routerops: λ of q̂ − λ·cost"},
    "turns_left": {"type": ["number", "null"], "minimum": 0, "description": "routerops: MTRouter's T_max − t"},
    "explain": {"type": ["boolean", "null"], "description": "routerops: the decision's explanation in the answer"},
}, "description": f"media parts ({', '.join(MEDIA_PARTS)}) and tools only reach workers whose pool entry accepts "
                  f"them; a request no worker accepts is a 400"}
COMPLETION = {"type": "object", "required": ["choices"], "properties": {
    "id": {"type": "string"}, "object": {"type": "string"}, "model": {"type": "string"},
    "choices": {"type": "array"}, "usage": {"type": ["object", "null"]}, "routerops": {"type": "object"}}}


def chat_request_schema(max_tokens_cap: int | None, models: list[str] | None, accepted: set[str] | None) -> dict:
    props = dict(CHAT_REQUEST["properties"])
    if max_tokens_cap is not None:
        props.update({k: {**props[k], "maximum": max_tokens_cap} for k in ("max_tokens", "max_completion_tokens")})
    if models:
        props["model"] = {**props["model"], "enum": list(models)}
    if accepted is not None:
        media = [p for p, kind in ((IMAGE_PART, "image_url"), (AUDIO_PART, "input_audio"), (FILE_PART, "file"))
                 if kind in accepted]
        user = {"type": "object", "required": ["role", "content"], "properties": {
            "role": {"const": "user"}, "content": text_or(TEXT_PART, *media), "name": {"type": "string"}}}
        props["messages"] = {**props["messages"], "items": {"oneOf": [user if m["properties"]["role"] == {"const": "user"}
                                                                      else m for m in MESSAGE["oneOf"]]}}
        if "tools" not in accepted:
            props.pop("tools")
            props.pop("tool_choice")
            props.pop("parallel_tool_calls")
    return {**CHAT_REQUEST, "properties": props}


def json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def errors(*statuses: int) -> dict[int, dict[str, Any]]:
    why = {400: "invalid request", 401: "missing or invalid API key", 404: "unknown model or decision",
           413: "body too large", 429: "over budget", 502: "every affordable worker failed",
           503: "overloaded (Retry-After) or no champion loaded"}
    return {s: json_body(ERROR, why[s]) for s in statuses}


CHAT = {"responses": {200: {"description": "the worker's completion, or server-sent events when stream is true",
                            "content": {"application/json": {"schema": COMPLETION},
                                        # each server-sent event: its data is a chunk's JSON, or [DONE]
                                        "text/event-stream": {"schema": {"type": "object", "required": ["data"],
                                                                         "properties": {"data": {"type": "string"}}}}}},
                      **errors(400, 401, 404, 413, 429, 502, 503)},
        "openapi_extra": {"requestBody": {"required": True, "content": {"application/json": {"schema": CHAT_REQUEST}}}}}
MODELS = {"responses": {200: json_body({"type": "object", "required": ["object", "data"], "properties": {
    "object": {"const": "list"}, "data": {"type": "array", "items": {"type": "object", "required": ["id"]}}}},
    "the routed models"), **errors(401)}}
DECISION = {"responses": {200: json_body({"type": "object", "required": ["decision_id", "explanation"]},
                                         "a decision and its explanation"), **errors(400, 401, 404)}}
FEEDBACK = {"responses": {200: json_body({"type": "object", "required": ["decision_id", "score"], "properties": {
    "decision_id": {"type": "string"}, "score": {"type": "number", "minimum": 0, "maximum": 1}}}, "recorded"),
    **errors(400, 401, 404, 413)},
    "openapi_extra": {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["score"],
        "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}}}}}}}}


def install(app, max_tokens_cap: int | None = None, models: list[str] | None = None,
            accepted: set[str] | None = None) -> None:
    """The schema with the bearer key every route requires, and this gateway's own terms: its
    max_tokens cap, the models it routes, and the media parts and tools its pool accepts (`accepted`,
    the union of the workers' `accepts`; None: all of them)."""
    from fastapi.openapi.utils import get_openapi

    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            body = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
            body["schema"] = chat_request_schema(max_tokens_cap, models, accepted)
            spec.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            spec["security"] = [{"bearer": []}]
            for path in spec.get("paths", {}).values():  # the framework's 422: answered as 400 (gateway/app.py)
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            spec.get("components", {}).get("schemas", {}).pop("HTTPValidationError", None)
            spec.get("components", {}).get("schemas", {}).pop("ValidationError", None)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = schema
