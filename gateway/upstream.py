"""What a worker sends back, checked as strictly as what a client sends (issue 42, item 1 and 2).

A worker's answer bills the key: its `usage` token counts become a charge. Believed as sent, a worker
answering `prompt_tokens: -10000000` made a key's spend fall by $100 (its budget grew), `10**20` was a
charge of $2.5e14 whose settlement the database refused (the hold stayed reserved, no decision row),
and a string, NaN or `cached_tokens: "many"` was a 500. So every count is checked (routerops/workers/usage.py, shared with the worker client of the stages):
an integer in 0..MAX_REPORTED_TOKENS, cached ≤ prompt.

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

from routerops.workers.usage import MAX_REPORTED_TOKENS, BadUsage, checked_sdk_usage, checked_usage, short

__all__ = ["MAX_REPORTED_TOKENS", "BadUsage", "Delivered", "checked_usage", "read_answer", "usage_in",
           "usage_of_chunk"]


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
    return checked_sdk_usage(getattr(chunk, "usage", None))


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
