"""The orchestrator family's adapter (paper 004, `ServedOrchestrator`): one chat request is one
controller episode.

The chat becomes the task (`chat_task`); the executor (routerops/orchestra/executor.py) plays the
served controller's turns through the gateway's own workers: plans, routes, parallel blind subtask
calls, observations, until a <final_answer>, the turn limit T_max or the budget (004 §4, App. A.7).
The final answer is the assistant message; `usage` sums every call of the episode (the controller's
turns and the workers'), and the decision lists each call with its worker and cost.

Budget. An episode's cost is unknown until it ends, so its worst case is reserved: the controller's
per-episode budget B (what it was trained under: it is in its system prompt), capped by the key's
remaining budget and the request's `budget_usd`. The executor checks B before every controller turn
and worker call (dispatch.py), so the episode never spends more than was reserved; the reservation
is settled with the episode's real cost. A budget that cannot cover the controller's first turn is a
429, as a single-turn request that no worker fits.

Streaming returns the whole answer as one chunk once the episode has ended (the answer is only known
then), followed by the usual chunk with `usage` and `routerops`. `max_tokens` and the sampling fields
of the request are not passed on: each call of the episode uses the controller's and the workers' own
settings (the controller's T_max and budget bound the whole).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from evaluation.serving import ORCHESTRATOR, served_family
from gateway.errors import RequestError
from gateway.families.base import (GatewayFamily, GatewayServices, ServedChampion, chat_task, episode_row,
                                   failed_record, hold_episode_budget, one_chunk_stream)
from gateway.store import KeyInfo
from routerops import schema
from routerops.orchestra.executor import EpisodeResult, Executor, ExecutorConfig, opening, worker_labels
from routerops.pricing import Pool, PriceBook
from routerops.workers.sandbox import sandbox_problem
from routerops.rollout import prompt_token_bound
from routerops.types import Task

log = logging.getLogger(__name__)
SUITE, SPLIT = "gateway", "serve"  # the episode's task is a live request: no suite, no reference answer


def no_reference(task: Task, answer: str | None) -> float:
    """A live request has no reference answer to score: the episode's score is unknown (NaN)."""
    return math.nan


class OrchestraRunner:
    """Runs one served orchestrator's episodes over the gateway's pool, workers and price book."""

    def __init__(self, served, pool: Pool, book, workers: dict[str, Any]):
        routed = {w for w, _ in served.pool.admissible_pairs()}
        # The pool the controller sees: the gateway's endpoints, limited to the workers it was trained on.
        self.pool = dataclasses.replace(pool, workers=tuple(w for w in pool.workers if w.name in routed))
        self.served, self.book, self.workers = served, book, workers
        self.controller = served.controller

    def config(self, budget_usd: float) -> ExecutorConfig:
        limits = self.served.limits
        # The controller cannot write more than max_new_tokens: its turns' worst case assumes that.
        return ExecutorConfig(budget_usd=budget_usd, turn_limit=limits.turn_limit, prompt=limits.prompt,
                              controller_max_tokens=int(self.controller.settings.max_new_tokens))

    def first_turn_worst_usd(self, task: str, budget_usd: float) -> float:
        """The controller's first turn at its worst: what the executor reserves before calling it."""
        config = self.config(budget_usd)
        _, messages = opening(self.pool, self.book, config, task, worker_labels(self.pool, False, None))
        prompt = prompt_token_bound(messages)
        return max(self.book.cost(self.controller.name, prompt, config.controller_max_tokens, c) for c in (0, prompt))

    async def run(self, task: str, budget_usd: float, episode_key: str) -> EpisodeResult:
        executor = Executor(self.pool, self.workers, self.book, self.config(budget_usd), verifier=no_reference)
        item = Task(hashlib.sha256(task.encode()).hexdigest()[:16], SUITE, SPLIT, task, "")
        return await executor.run_episode(item, self.controller, run_id=episode_key, seed=0)


def orchestrator_problem(served, pool: Pool, book: PriceBook) -> str | None:
    """The executor runs the controller's routes through this pool: every (worker, primitive) pair the
    controller was trained to route (its system prompt lists them, 004 App. A.6) must be offered,
    by a worker of the same kind, priced; and its own turns must be priced (the budget counts them)."""
    offered = set(pool.admissible_pairs())
    for worker, primitive in served.pool.admissible_pairs():
        if (worker, primitive) not in offered:
            return (f"it routes ({worker!r}, {primitive!r}), which pool {pool.name!r} does not offer; it was "
                    f"trained on pool {served.pool.name!r}")
        if pool.worker(worker).kind != served.pool.worker(worker).kind:
            return f"its worker {worker!r} is a {served.pool.worker(worker).kind} worker, in pool {pool.name!r} a " \
                   f"{pool.worker(worker).kind} one"
        if worker not in book.prices:
            return f"it routes to worker {worker!r}, which price book {book.version} does not price"
    if served.controller.name not in book.prices:
        return f"price book {book.version} has no price for its controller {served.controller.name!r}"
    coders = sorted({w for w, _ in served.pool.admissible_pairs() if pool.worker(w).kind == "python"})
    problem = sandbox_problem() if coders else None
    if problem:
        return f"its worker(s) {coders} run model-written code, and the sandbox cannot start here: {problem}"
    return None


# ---------------------------------------------------------------- one request


async def answer_orchestrated(gw: GatewayServices, key: KeyInfo, body: dict[str, Any], champion: ServedChampion,
                              messages: list[dict[str, Any]], request_budget: float):
    """Reserve the episode's worst case, run it, settle the real cost, log it, answer (module docstring)."""
    task = chat_task(messages)
    runner = gw.orchestra_runner(champion)
    remaining = await gw.store.aremaining_usd(key)
    budget = min(runner.served.limits.budget_usd, remaining, request_budget)
    first = runner.first_turn_worst_usd(task, budget)
    if first > budget:
        raise RequestError(429, f"over budget: the orchestrator's episode budget here is ${budget:.6g} (its own "
                                f"${runner.served.limits.budget_usd:.6g}, key {key.key_id} has ${remaining:.6g} "
                                f"left of ${key.budget_usd:.6g} per {key.period}), and its first turn may cost up "
                                f"to ${first:.6g}", "insufficient_quota", "budget_exceeded")
    held = await hold_episode_budget(gw, key, budget)
    started = time.monotonic()
    base = {**episode_row(gw, key, champion, task), "chosen": runner.controller.name}
    decision_id = base["decision_id"]
    try:
        result = await runner.run(task, budget, decision_id)
    except BaseException as exc:  # cancelled or failed mid-episode: calls were made, their costs unknown
        gw.store.settle_later(held, budget, {**base, **failed_record(exc, budget, remaining, started)})
        raise
    episode = result.episode
    cost = min(max(float(episode["cost_usd"]), 0.0), budget)  # never below zero (gateway/upstream.py)
    explanation = episode_explanation(champion, result, budget, remaining, cost)
    gw.store.settle_later(held, cost, {
        **base, "created_at": _utc_now(), "worker": runner.controller.name, "explanation": explanation,
        "status": "ok" if episode["ended_by"] == schema.END_DONE else str(episode["ended_by"]),
        "prompt_tokens": int(episode["prompt_tokens"]), "completion_tokens": int(episode["completion_tokens"]),
        "cost_usd": cost, "usage_source": "worker",
        "response": episode["final_answer"] if gw.cfg.log_texts else "", "latency_s": time.monotonic() - started})
    extra = {"decision_id": decision_id, "router": champion.name, "router_version": champion.version,
             "family": champion.family, "chosen": runner.controller.name, "worker": runner.controller.name,
             "cost_usd": cost, "reserved_usd": budget, "ended_by": episode["ended_by"], "calls": explanation["calls"],
             "propensity": 1.0, "scores": {}, "price_book_version": gw.book.version}
    if body.get("explain"):
        extra["explanation"] = explanation
    headers = {"x-routerops-decision-id": decision_id, "x-routerops-worker": runner.controller.name,
               "x-routerops-router": f"{champion.name}@{champion.version}", "x-routerops-cost-usd": f"{cost:.9f}",
               "x-routerops-reserved-usd": f"{budget:.9f}", "x-routerops-fallbacks": "0",
               "x-routerops-calls": ",".join(c["worker"] for c in explanation["calls"]),
               "x-routerops-ended-by": str(episode["ended_by"])}
    completion = completion_body(body, decision_id, episode, extra)
    if body.get("stream"):
        return StreamingResponse(one_chunk_stream(completion), media_type="text/event-stream", headers=headers)
    return JSONResponse(completion, headers=headers)


def episode_explanation(champion: ServedChampion, result: EpisodeResult, budget: float, remaining: float,
                        cost: float) -> dict[str, Any]:
    """Each call of the episode (controller turns and worker calls) with its worker, tokens and cost,
    and every worker's share of the cost."""
    calls = [{"actor": t["actor"], "worker": t["worker"], "primitive": t["primitive"], "subtask_id": t["subtask_id"],
              "prompt_tokens": int(t["prompt_tokens"]), "completion_tokens": int(t["completion_tokens"]),
              "cost_usd": float(t["cost_usd"]), "errors": json.loads(t["errors"])} for t in result.turns]
    share: dict[str, float] = {}
    for call in calls:
        share[call["worker"]] = share.get(call["worker"], 0.0) + call["cost_usd"]
    episode = result.episode
    return {"router": champion.name, "router_version": champion.version, "family": champion.family,
            "budget_usd": budget, "key_remaining_usd": remaining,
            "controller_budget_usd": champion.router.limits.budget_usd, "turn_limit": episode["turn_limit"],
            "ended_by": episode["ended_by"], "error": episode["error"], "mode": episode["mode"],
            "malformed_turns": result.malformed_turns, "calls": calls, "cost_usd": cost,
            "cost_share": {w: c / cost for w, c in share.items() if cost > 0 and c > 0}}


def completion_body(body: dict[str, Any], decision_id: str, episode: dict[str, Any],
                    extra: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI chat.completion: the final answer; `length` when T_max or the budget ended it first."""
    finish = "stop" if episode["ended_by"] == schema.END_DONE else "length"
    prompt, completion = int(episode["prompt_tokens"]), int(episode["completion_tokens"])
    return {"id": f"chatcmpl-{decision_id}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": episode["final_answer"]},
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
            "routerops": extra}


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


FAMILY = GatewayFamily(served_family(ORCHESTRATOR), problem=orchestrator_problem, answer=answer_orchestrated)
