"""The error the gateway answers a request with, in the OpenAI format (gateway/app.py renders it)."""

from __future__ import annotations


class RequestError(Exception):
    """A request the gateway answers with an OpenAI-format error (status, message, type)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code
