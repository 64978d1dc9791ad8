"""The gateway's OpenAPI schema: what each route takes and answers, in OpenAI's shapes, so that a
client generator, the docs and a schema fuzzer (Schemathesis: tests/gateway/test_schema_fuzz.py,
benchmarks/gateway_fuzz.py) see the API the gateway serves. The routes read their bodies themselves
(gateway/parsing.py: one parser, one error format), so the request bodies are declared here."""

from __future__ import annotations

from typing import Any

from gateway.parsing import MEDIA_PARTS, ROLES

NULLABLE_STRING = {"type": ["string", "null"]}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "param": NULLABLE_STRING,
                   "code": NULLABLE_STRING}}}}
TEXT_PART = {"type": "object", "required": ["type", "text"],
             "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
IMAGE_PART = {"type": "object", "required": ["type", "image_url"],
              "properties": {"type": {"const": "image_url"}, "image_url": {
                  "type": "object", "required": ["url"],
                  "properties": {"url": {"type": "string"}, "detail": {"enum": ["auto", "low", "high"]}}}}}
MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"enum": list(ROLES)},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": [TEXT_PART, IMAGE_PART]}},
                          {"type": "null"}]},
    "name": {"type": "string"}, "tool_call_id": {"type": "string"}}}
CHAT_REQUEST = {"type": "object", "required": ["model", "messages"], "properties": {
    "model": {"type": "string", "description": "'auto' or 'router:<registered name>'"},
    "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
    "max_tokens": {"type": ["integer", "null"], "minimum": 1},
    "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
    "stream": {"type": ["boolean", "null"]}, "n": {"type": ["integer", "null"]},
    "temperature": {"type": ["number", "null"]}, "top_p": {"type": ["number", "null"]},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
    "seed": {"type": ["integer", "null"]},
    "tools": {"type": ["array", "null"], "items": {"type": "object"}},
    "budget_usd": {"type": ["number", "null"], "minimum": 0, "description": "routerops: this request's USD cap"},
    "cost_weight": {"type": ["number", "null"], "minimum": 0, "description": "routerops: λ of q̂ − λ·cost"},
    "turns_left": {"type": ["number", "null"], "minimum": 0, "description": "routerops: MTRouter's T_max − t"},
    "explain": {"type": ["boolean", "null"], "description": "routerops: the decision's explanation in the answer"},
}, "description": f"media parts ({', '.join(MEDIA_PARTS)}) only reach workers whose pool entry accepts them"}
COMPLETION = {"type": "object", "required": ["choices"], "properties": {
    "id": {"type": "string"}, "object": {"type": "string"}, "model": {"type": "string"},
    "choices": {"type": "array"}, "usage": {"type": ["object", "null"]}, "routerops": {"type": "object"}}}


def json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def errors(*statuses: int) -> dict[int, dict[str, Any]]:
    why = {400: "invalid request", 401: "missing or invalid API key", 404: "unknown model or decision",
           413: "body too large", 429: "over budget", 502: "every affordable worker failed",
           503: "overloaded (Retry-After) or no champion loaded"}
    return {s: json_body(ERROR, why[s]) for s in statuses}


CHAT = {"responses": {200: {"description": "the worker's completion, or server-sent events when stream is true",
                            "content": {"application/json": {"schema": COMPLETION},
                                        "text/event-stream": {"schema": {"type": "string"}}}},
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


def install(app) -> None:
    """The schema with the bearer key every route requires."""
    from fastapi.openapi.utils import get_openapi

    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
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
