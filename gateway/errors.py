"""The error the gateway answers a request with, in the OpenAI format, {"error": {"message", "type",
"param", "code"}}, as OpenAI's API shapes every error; and its two renderers, below every part that
answers one: `error_response` (the app, its middlewares) and `http_error` (the protocol's early door,
which writes whole HTTP/1.1 responses itself: gateway/serving.py, gateway/admission.py)."""

from __future__ import annotations

import json
import math

from starlette.responses import JSONResponse


class RequestError(Exception):
    """A request the gateway answers with an OpenAI-format error (status, message, type, param, code);
    `retry_after_s` becomes a Retry-After header (overload: gateway/admission.py)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def error_headers(exc: RequestError) -> dict[str, str]:
    """The headers of an error answer: Retry-After on overload (gateway/admission.py: the openai SDK waits
    that long, then retries); x-should-retry: false stops it from retrying a 401 or 429 that waiting
    will not cure (a key over its request rate, 429 with Retry-After, is worth retrying)."""
    headers = {"x-should-retry": "false"} if exc.status in (401, 429) and exc.retry_after_s is None else {}
    if exc.retry_after_s is not None:
        headers.update({"retry-after": str(max(1, math.ceil(exc.retry_after_s))),
                        "retry-after-ms": str(int(exc.retry_after_s * 1000))})
    return headers


def error_response(exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=error_headers(exc))


STATUS_TEXT = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


def http_error(exc: RequestError) -> bytes:
    """An OpenAI-format error as a whole HTTP/1.1 response (error_response's headers)."""
    body = json.dumps(exc.body()).encode()
    head = [b"HTTP/1.1 %d %s" % (exc.status, STATUS_TEXT.get(exc.status, b"Error")), b"content-type: application/json",
            b"content-length: %d" % len(body), *(f"{k}: {v}".encode() for k, v in error_headers(exc).items())]
    return b"\r\n".join(head) + b"\r\n\r\n" + body
