"""What a worker sends back, checked as strictly as what a client sends (issue 42, item 1 and 2).

A worker's answer bills the key: its `usage` token counts become a charge. Believed as sent, a worker
answering `prompt_tokens: -10000000` made a key's spend fall by $100 (its budget grew), `10**20` was a
charge of $2.5e14 whose settlement the database refused (the hold stayed reserved, no decision row),
and a string, NaN or `cached_tokens: "many"` was a 500. So every count is checked here:

- an integer (a JSON number with no fraction; not a boolean, not a string, not NaN or infinite),
- in 0 ≤ n ≤ MAX_REPORTED_TOKENS (no model serves a context longer than ~10M tokens: a count past it
  is no real call; it also keeps every charge far inside the database's 64-bit nano-USD),
- cached ≤ prompt (cached tokens are part of the prompt's).

An answer whose usage fails a check is a *worker error* (BadUsage): the gateway charges the worst
case it reserved for that worker (what the worker may have billed; never less than zero), records it
in the decision's explanation, and falls back to the next worker where the decision has one
(gateway/app.py). A missing usage block is not an error (llama.cpp's server sends none in streams):
the gateway bounds it instead.

Streams (item 2). A client that disconnects mid-stream leaves the gateway with no usage block: what
the worker generated up to then is charged from what was received. The gateway holds no tokenizer of
the workers (they are remote servers), so the completion is bounded from its bytes: a byte-level BPE
token (GPT-2, Llama 3, Qwen, SmolLM2 ...) decodes to at least one byte, so a text of B UTF-8 bytes
is at most B tokens — the argument gateway/routing.py's prompt bound rests on. Each content chunk
holds at least one token, so the count is never below the number of chunks either; and the worker
was sent `max_tokens`, so the count is capped there (the reservation's bound). Before this the
stream was charged one token per chunk: a worker packing 50 tokens in each chunk was charged a fiftieth.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
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


def read_answer(content: bytes) -> dict[str, Any]:
    """A worker's plain answer as a JSON object, or ValueError (not JSON, not an object, or a number JSON
    cannot carry: NaN, Infinity, 1e400 — the answer could not be passed on). A non-finite count in
    `usage` is BadUsage (charged: module docstring), anywhere else a bad answer (the next worker)."""
    odd: list[str] = []

    def constant(text: str) -> float:
        odd.append(text)
        return float("nan")

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            odd.append(text)
        return value

    try:
        answer = json.loads(content, parse_constant=constant, parse_float=number)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"no JSON: {str(exc)[:200]}") from None
    if not isinstance(answer, dict):
        raise ValueError(f"{type(answer).__name__}, not a JSON object")
    if odd:
        checked_usage(answer.get("usage"))  # BadUsage if the odd number is a token count
        raise ValueError(f"a number JSON cannot carry ({short(odd[0])})")
    return answer


def usage_in(answer: dict[str, Any]) -> dict[str, int] | None:
    """checked_usage() of a worker's plain JSON answer."""
    return checked_usage(answer.get("usage"))


def usage_of_chunk(chunk: Any) -> dict[str, int] | None:
    """checked_usage() of a streamed chunk (an openai SDK object: it does not validate what it was sent)."""
    usage = getattr(chunk, "usage", None)
    if usage is None:
        return None
    if hasattr(usage, "model_dump"):
        usage = {**usage.model_dump(warnings=False), **(getattr(usage, "model_extra", None) or {})}
    return checked_usage(usage)


@dataclass
class Delivered:
    """What a stream has brought from the worker so far: its text pieces, the chunks that held text,
    and the UTF-8 bytes of every generated string (content, refusals, reasoning, tool calls)."""

    pieces: list[str] = field(default_factory=list)
    chunks: int = 0
    bytes: int = 0

    def add(self, delta: Any) -> None:
        """Count one chunk's delta (an SDK object or a dict)."""
        if delta is None:
            return
        data = delta.model_dump(warnings=False) if hasattr(delta, "model_dump") else delta
        if hasattr(delta, "model_extra") and delta.model_extra:
            data = {**data, **delta.model_extra}
        generated = sum(len(s.encode("utf-8", "replace")) for k, v in data.items() if k != "role"
                        for s in strings(v))
        content = data.get("content")
        if isinstance(content, str) and content:
            self.pieces.append(content)
        if generated:
            self.chunks += 1
            self.bytes += generated

    def completion_bound(self, max_tokens: int) -> int:
        """The most completion tokens the worker can bill for what it sent (module docstring)."""
        return min(max(self.bytes, self.chunks), max_tokens)


def strings(value: Any) -> list[str]:
    """Every string in a JSON-like value, keys of objects aside."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []
