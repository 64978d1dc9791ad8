"""One routing decision: every worker's estimated quality (the champion's family reads the request:
gateway/families/__init__.py) and worst-case cost (the price book), the budget rule, and the order to fall back
in. One rule for every family that routes a call (single-turn routers and MTRouter).

Worst-case cost. The budget must hold before the call, when the answer's length is unknown, so a
worker's cost is bounded by its price for an upper bound of the prompt's tokens and the request's
`max_tokens` (always sent to the worker, so the bound holds). A byte-level BPE token covers at least
one byte, so the UTF-8 byte count of everything sent that a chat template renders as text, plus a few
template tokens per message, bounds the prompt's tokens: every string of every message (text parts,
names, tool call ids, refusals; tool calls as their JSON), and the request's tool definitions,
tool_choice and response_format as their JSON. Media parts (image_url, input_audio, file) and the
template's text around tool definitions are not bounded by bytes: a worker may be sent them only if
its pool entry `accepts` them, with the most tokens one may cost (routerops/pricing.py WorkerSpec);
for any other worker the bound is infinite, so it is never affordable (gateway/parsing.py checks the
shapes, the gateway refuses a request no worker accepts).

Rule (evaluation/serving/single_turn.py's budget rule, with an optional cost weight λ): among the workers whose
worst case fits in the budget (the key's remaining budget, or the request's `budget_usd` if lower),
the one with the highest q̂ − λ·cost (ties: the cheaper); with exploration ε > 0 a uniformly drawn
affordable worker with probability ε, so the logged propensities support off-policy evaluation.
The fallback order is the remaining affordable workers by the same utility.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from evaluation.servable import cap_text
from gateway.parsing import MEDIA_PARTS
from routerops.pricing import PriceBook


@dataclass(frozen=True)
class Estimate:
    """One router family's reading of a request (gateway/families/__init__.py makes them): each worker's
    quality, or why the router declines."""

    workers: list[str]
    quality: np.ndarray  # per worker, in `workers` order; NaN where the router gave no score
    query: str  # the text the decision's query id hashes
    stop: str = ""  # why the router itself stops (MTRouter's STOP), "" when it routes


TEMPLATE_TOKENS_PER_MESSAGE = 8  # role markers and separators of a chat template
TEMPLATE_TOKENS_FIXED = 16  # the generation prompt and BOS


def flatten_messages(messages: list[dict[str, Any]]) -> str:
    """What the router reads: the user turns' text, in order (a chat history flattened to one string)."""
    parts = [content_text(m.get("content")) for m in messages if m.get("role") == "user"]
    text = "\n".join(p for p in parts if p.strip())
    return text or "\n".join(content_text(m.get("content")) for m in messages)


def content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return ""


def value_bytes(value: Any) -> int:
    """UTF-8 bytes a template can render of one field: a string as it is, anything else as its JSON."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8"))


def message_bytes(message: dict[str, Any]) -> int:
    """The UTF-8 bytes of every field of `message` but its role (a template marker, counted in
    TEMPLATE_TOKENS_PER_MESSAGE) and its media parts (bounded per part: media_tokens)."""
    total = 0
    for name, value in message.items():
        if name == "role":
            continue
        if name == "content" and isinstance(value, list):
            for part in value:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in MEDIA_PARTS:
                    continue
                total += value_bytes(part.get(kind)) if kind in ("text", "refusal") else value_bytes(part)
        else:
            total += value_bytes(value)
    return total


def media_tokens(messages: list[dict[str, Any]], accepts: dict[str, int]) -> float:
    """The most tokens the media parts of `messages` may cost a worker that accepts `accepts`; inf
    when it does not accept one of them."""
    total = 0.0
    for message in messages:
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in MEDIA_PARTS:
                total += accepts.get(kind, math.inf)
    return total


def request_bytes(body: dict[str, Any], accepts: dict[str, int]) -> float:
    """What a request sends beside its messages, bounded: tool definitions (their JSON plus the
    template's text around them, inf for a worker that does not accept tools), tool_choice and
    response_format as their JSON."""
    total = float(value_bytes(body.get("response_format")))
    if body.get("tools"):
        total += value_bytes(body["tools"]) + value_bytes(body.get("tool_choice")) + accepts.get("tools", math.inf)
    return total


def prompt_token_bound(messages: list[dict[str, Any]], system: str = "", accepts: dict[str, int] | None = None,
                       body: dict[str, Any] | None = None) -> float:
    """An upper bound of the prompt tokens a worker can bill for `messages` (and the rest of `body`)
    under its system prompt `system`; inf if they hold content the worker does not accept."""
    accepts = accepts or {}
    text_bytes = sum(message_bytes(m) for m in messages)
    bound = (text_bytes + len(system.encode("utf-8")) + TEMPLATE_TOKENS_PER_MESSAGE * (len(messages) + 1)
             + TEMPLATE_TOKENS_FIXED)
    extra = media_tokens(messages, accepts) + (request_bytes(body, accepts) if body is not None else 0.0)
    return bound + extra if extra else bound


class EmbeddingCache:
    """An in-memory LRU of query embeddings in front of a router's sentence encoder: applications
    resend the same prompts (retries, templates, the same question from many users), and the encoder
    dominates a decision's time (measured in benchmarks/gateway_overhead.py)."""

    def __init__(self, encoder, size: int = 10_000):
        self.encoder, self.size = encoder, size
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # decisions run in worker threads
        self.hits = self.misses = 0

    def has(self, text: str) -> bool:
        with self._lock:
            return text in self._vectors

    def __call__(self, text: str) -> np.ndarray:
        with self._lock:
            vector = self._vectors.get(text)
            if vector is not None:
                self._vectors.move_to_end(text)
                self.hits += 1
                return vector
        vector = np.asarray(self.encoder.encode([cap_text(text)]))[0]  # what routing_data would embed
        with self._lock:
            self.misses += 1
            self._vectors[text] = vector
            if len(self._vectors) > self.size:
                self._vectors.popitem(last=False)
        return vector


@dataclass(frozen=True)
class Candidate:
    worker: str
    quality: float  # the router's estimate: q̂(query, worker), or MTRouter's ŝ(h_t, worker); NaN: not scored
    worst_cost_usd: float  # price book × (prompt bound, max_tokens)
    affordable: bool
    utility: float  # quality − λ·cost for affordable workers, −inf otherwise


@dataclass
class Decision:
    decision_id: str
    router: str
    router_version: str
    query_id: str
    candidates: list[Candidate]
    budget_usd: float  # what decided: min(key's remaining budget, request budget)
    key_remaining_usd: float
    cost_weight: float  # λ
    epsilon: float
    chosen: str
    propensity: float
    order: list[str]  # chosen first, then the fallbacks
    max_tokens: int
    attempts: list[dict[str, Any]] = field(default_factory=list)  # one per worker tried
    family: str = ""  # the champion's family (gateway/families/__init__.py): whose quality estimate this is
    query_text: str = ""  # what the router read: the flattened user turns, or MTRouter's h_t (logged as `query`)

    def candidate(self, worker: str) -> Candidate:
        return next(c for c in self.candidates if c.worker == worker)

    def explanation(self) -> dict[str, Any]:
        return {"router": self.router, "router_version": self.router_version, "family": self.family,
                "budget_usd": self.budget_usd,
                "key_remaining_usd": self.key_remaining_usd, "cost_weight": self.cost_weight,
                "epsilon": self.epsilon, "chosen": self.chosen, "propensity": self.propensity,
                "fallback_order": self.order[1:], "max_tokens": self.max_tokens,
                "candidates": [_finite(asdict(c)) for c in self.candidates], "attempts": self.attempts}


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """JSON has no infinity: an unaffordable worker's utility reads null."""
    return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in record.items()}


def decide(estimate: Estimate, name: str, version: str, book: PriceBook, prompt_bounds: dict[str, float],
           max_tokens: int, budget_usd: float, key_remaining_usd: float,
           cost_weight: float = 0.0, epsilon: float = 0.0, rng: random.Random | None = None,
           decision_id: str = "", family: str = "") -> Decision | None:
    """The decision for one request from a family's quality estimate (gateway/families/__init__.py), or None
    when the router stops or no worker's worst case fits in the budget. A worker the router gave no
    score (NaN) is never chosen; `prompt_bounds` is each worker's prompt_token_bound for the request
    (inf: it cannot be sent this request)."""
    if estimate.stop:
        return None
    workers, quality = list(estimate.workers), np.asarray(estimate.quality, dtype=float)
    # inf, not the price times inf: a free input price would make it NaN
    worst = np.array([book.cost(w, prompt_bounds[w], max_tokens) if math.isfinite(prompt_bounds[w]) else math.inf
                      for w in workers])
    affordable = (worst <= budget_usd) & np.isfinite(quality)
    if not affordable.any():
        return None
    rank = np.argsort(np.argsort(worst, kind="stable"), kind="stable")  # exact ties go to the cheaper
    utility = np.where(affordable, quality - cost_weight * np.where(affordable, worst, 0.0) - 1e-9 * rank, -np.inf)
    order = [workers[j] for j in np.argsort(-utility, kind="stable") if affordable[j]]
    chosen, propensity = _explore(order, epsilon, rng or random.Random())
    order = [chosen] + [w for w in order if w != chosen]
    candidates = [Candidate(w, float(quality[j]), float(worst[j]), bool(affordable[j]), float(utility[j]))
                  for j, w in enumerate(workers)]
    return Decision(decision_id, name, version, hashlib.sha256(estimate.query.encode()).hexdigest()[:16],
                    candidates, float(budget_usd), float(key_remaining_usd), float(cost_weight), float(epsilon),
                    chosen, propensity, order, int(max_tokens), family=family, query_text=estimate.query)


def _explore(order: list[str], epsilon: float, rng: random.Random) -> tuple[str, float]:
    """ε-greedy over the affordable workers (best first): the choice and its probability."""
    k = len(order)
    if epsilon > 0 and rng.random() < epsilon:
        pick = rng.choice(order)
    else:
        pick = order[0]
    return pick, (1 - epsilon) * (pick == order[0]) + epsilon / k
