"""An untrained LLM asked which worker should answer (MTRouter §4.1 'LLM Router': the routing prompt
of Router-R1, answered by an off-the-shelf model with no training).

Reached over any OpenAI-compatible endpoint (the embedded llama.cpp server, vLLM, a provider). Its
choice becomes a one-hot quality, so the shared cost-weight rule still applies: a large enough λ
overrides it in favour of cheaper workers. Unparseable replies fall back to the cheapest worker and
are counted in `parse_failures`.
"""

from __future__ import annotations

import re

import numpy as np

from models.base import Router, RoutingData
from models.baselines.features import worker_cost_order

SYSTEM_PROMPT = (
    "You are a router. Given a question and a list of candidate models with their prices, pick the "
    "single model that will answer the question correctly at the lowest cost. Reply with the model's "
    "number only, inside <select></select>, e.g. <select>1</select>."
)


def describe_workers(workers: list[str], mean_costs: np.ndarray, attributes: dict[str, dict[str, float]]) -> str:
    lines = []
    for i, (w, cost) in enumerate(zip(workers, mean_costs), start=1):
        attrs = ", ".join(f"{k}={v:g}" for k, v in sorted(attributes.get(w, {}).items()))
        lines.append(f"{i}. {w} (about ${cost * 1000:.4f} per 1000 questions{'; ' + attrs if attrs else ''})")
    return "\n".join(lines)


def parse_choice(reply: str, workers: list[str]) -> int | None:
    """Worker index named in `reply`, or None. Tries, in order: the <select> tag, a bare number in
    range, a worker name (longest names first so 'gpt-4-turbo' beats 'gpt-4')."""
    tagged = re.search(r"<select>\s*(.*?)\s*</select>", reply, flags=re.S | re.I)
    candidates = [tagged.group(1)] if tagged else []
    candidates.append(reply)
    for text in candidates:
        number = re.search(r"\b(\d+)\b", text)
        if number and 1 <= int(number.group(1)) <= len(workers):
            return int(number.group(1)) - 1
        lowered = text.lower()
        for name in sorted(workers, key=len, reverse=True):
            if name.lower() in lowered:
                return workers.index(name)
    return None


class PromptedLLMRouter(Router):
    """Ask an LLM for the worker's number; one-hot quality on its pick."""

    name = "prompted_llm"

    def __init__(self, base_url: str, model: str = "local", api_key: str = "none", max_tokens: int = 12,
                 timeout_s: float = 60.0, system_prompt: str = SYSTEM_PROMPT):
        self.base_url, self.model, self.api_key = base_url, model, api_key
        self.max_tokens, self.timeout_s, self.system_prompt = max_tokens, timeout_s, system_prompt
        self.parse_failures = 0
        self.calls = 0
        self._cache: dict[tuple[str, str], int | None] = {}
        self._client = None

    def fit(self, data: RoutingData) -> "PromptedLLMRouter":
        # Nothing is learned; the training table only tells the prompt what each worker costs.
        self.mean_costs_ = np.asarray(data.costs, dtype=float).mean(axis=0)
        self.workers_ = list(data.workers)
        self.menu_ = describe_workers(self.workers_, self.mean_costs_, data.worker_attributes)
        return self

    def _client_(self):
        if self._client is None:
            from openai import OpenAI

            self._client = OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=2)
        return self._client

    def ask(self, question: str) -> str:
        reply = self._client_().chat.completions.create(
            model=self.model,
            temperature=0.0,
            max_tokens=self.max_tokens,
            messages=[
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"Models:\n{self.menu_}\n\nQuestion:\n{question}\n\nWhich model?"},
            ],
        )
        self.calls += 1
        return reply.choices[0].message.content or ""

    def choose(self, question: str) -> int:
        key = (self.menu_, question)
        if key not in self._cache:
            self._cache[key] = parse_choice(self.ask(question), self.workers_)
            if self._cache[key] is None:
                self.parse_failures += 1
        pick = self._cache[key]
        return int(worker_cost_order(self.mean_costs_[None, :])[0]) if pick is None else pick

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if not hasattr(self, "menu_"):
            raise RuntimeError("PromptedLLMRouter.predict_quality before fit")
        if list(data.workers) != self.workers_:
            raise ValueError(f"routed table's workers {data.workers} differ from the fitted {self.workers_}")
        quality = np.zeros((len(data), len(data.workers)))
        for i, question in enumerate(data.queries):
            quality[i, self.choose(question)] = 1.0
        return quality
