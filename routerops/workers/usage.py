"""A worker's `usage` block checked before it becomes a charge (issue 42, items 1 and 3).

Every caller of a worker believes its token counts only after this check: the gateway (which bills a
key from them, gateway/upstream.py) and the worker client of every stage and orchestrator episode
(routerops/workers/llm.py, whose counts price a trajectory). A count is

- an integer (a JSON number with no fraction; not a boolean, not a string, not NaN or infinite),
- in 0 ≤ n ≤ MAX_REPORTED_TOKENS (no model serves a context longer than ~10M tokens: a count past it
  is no real call; it also keeps every charge far inside the database's 64-bit nano-USD),
- cached ≤ prompt (cached tokens are part of the prompt's).
"""

from __future__ import annotations

import math
from typing import Any

MAX_REPORTED_TOKENS = 10_000_000  # the most tokens one count of a real answer can hold (module docstring)
COUNTS = ("prompt_tokens", "completion_tokens", "cached_tokens")


class BadUsage(ValueError):
    """A worker reported token counts no real call has (negative, not an integer, absurd)."""


def token_count(value: Any, name: str) -> int:
    """`value` as a token count in [0, MAX_REPORTED_TOKENS], or BadUsage."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadUsage(f"{name} is {type(value).__name__} {short(value)}, not an integer")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise BadUsage(f"{name} is {short(value)}, not an integer")
    count = int(value)
    if not 0 <= count <= MAX_REPORTED_TOKENS:
        raise BadUsage(f"{name} is {short(count)}, outside 0..{MAX_REPORTED_TOKENS}")
    return count


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def checked_usage(usage: Any) -> dict[str, int] | None:
    """A worker's `usage` block (a decoded JSON value) as token counts, None when it sent none, or
    BadUsage when what it sent is not a usage a real call has."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise BadUsage(f"usage is {type(usage).__name__}, not an object")
    if usage.get("prompt_tokens") is None and usage.get("completion_tokens") is None:
        return None  # an empty block ({} or nulls): the same as none
    prompt = token_count(usage.get("prompt_tokens"), "prompt_tokens")
    completion = token_count(usage.get("completion_tokens") or 0, "completion_tokens")
    details = usage.get("prompt_tokens_details")
    if details is not None and not isinstance(details, dict):
        raise BadUsage(f"prompt_tokens_details is {type(details).__name__}, not an object")
    cached = token_count((details or {}).get("cached_tokens") or 0, "cached_tokens")
    if cached > prompt:
        raise BadUsage(f"cached_tokens {cached} is more than prompt_tokens {prompt}")
    return {"prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": cached}


def checked_sdk_usage(usage: Any) -> dict[str, int] | None:
    """checked_usage() of the openai SDK's usage object, which holds what the server sent unvalidated."""
    if hasattr(usage, "model_dump"):
        usage = {**usage.model_dump(warnings=False), **(getattr(usage, "model_extra", None) or {})}
    return checked_usage(usage)
