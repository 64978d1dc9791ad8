"""The critique family's adapter (paper 002, `ServedCritique`): one chat request, a short episode.

The weakest agent answers the chat first (Template II needs a draft; a served controller starts at
the cheapest agent rather than Template I's route, so the strongest agent is only ever reached by a
False verdict). The controller then checks the draft (Template II, greedy) and, while it says False,
the draft goes to the stronger agent it names; a True verdict, a malformed turn (the draft stands) or
the strongest agent's draft ends it. A controller registered with a fitted verdict threshold τ says
False iff p(False) > τ (evaluation/serving/critique.py). The answer is the last draft; `usage` sums
the agents' calls (the controller runs in the gateway's process and bills nothing), and the
explanation lists each verdict (with its p(False) and τ when thresholded) and each call with its
worker, tokens and cost.

Budget: every call's worst case (its max_tokens at the worker's price) is reserved for all agents the
episode might call, capped by the key's remaining budget and the request's `budget_usd`; the
reservation is settled with the real cost.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from evaluation.serving import CRITIQUE, served_family
from gateway.errors import RequestError
from gateway.families.base import (GatewayFamily, GatewayServices, ServedChampion, chat_task, episode_row,
                                   failed_record, hold_episode_budget, one_chunk_stream)
from gateway.store import KeyInfo
from gateway.upstream import usage_in
from routerops.rollout import prompt_token_bound
from routerops.workers.llm import chat_request

DEFAULT_MAX_TOKENS = 512


def worst_case_usd(gw: GatewayServices, workers: list[str], messages: list[dict[str, Any]], max_tokens: int) -> float:
    prompt = prompt_token_bound(messages)
    return sum(max(gw.book.cost(w, prompt, max_tokens, c) for c in (0, prompt)) for w in workers)


async def answer_critiqued(gw: GatewayServices, key: KeyInfo, body: dict[str, Any], champion: ServedChampion,
                           messages: list[dict[str, Any]], request_budget: float):
    served = champion.router
    task = chat_task(messages)
    max_tokens = int(body.get("max_tokens") or DEFAULT_MAX_TOKENS)
    remaining = await gw.store.aremaining_usd(key)
    worst = worst_case_usd(gw, served.workers, messages, max_tokens)
    budget = min(worst, remaining, request_budget)
    if budget < worst:
        raise RequestError(429, f"over budget: the critique episode may cost up to ${worst:.6g} (every agent "
                                f"answering {max_tokens} tokens), key {key.key_id} has ${remaining:.6g} left and the "
                                f"request allows ${request_budget:.6g}", "insufficient_quota", "budget_exceeded")
    held = await hold_episode_budget(gw, key, budget)
    started = time.monotonic()
    base = episode_row(gw, key, champion, task)
    decision_id = base["decision_id"]
    calls, verdicts = [], []
    try:
        author = 0
        while True:
            worker = served.workers[author]
            request = chat_request(gw.pool.worker(worker), messages, max_tokens)
            answer = await gw.post_chat(worker, request)
            # checked (gateway/upstream.py): an impossible usage fails the episode, charged its worst case below
            usage = usage_in(answer) or {}
            prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
            text = answer["choices"][0]["message"].get("content") or ""
            calls.append({"worker": worker, "prompt_tokens": prompt, "completion_tokens": completion,
                          "cost_usd": gw.book.cost(worker, prompt, completion)})
            if author == len(served.workers) - 1:  # the strongest agent's draft ends the episode
                break
            check = (await asyncio.to_thread(served.verify, [task], [text], [author]))[0]
            verdicts.append({"author": worker, "verdict": check["verdict"], "action": check["action"],
                             "escalate_to": "" if check["escalate"] is None else served.workers[check["escalate"]],
                             "error": check["error"], "turn": check["turn"], "p_false": check["p_false"],
                             "threshold": served.verdict_threshold})
            if check["escalate"] is None:
                break
            author = check["escalate"]
    except BaseException as exc:
        gw.store.settle_later(held, budget, {**base, "chosen": served.workers[0],
                                             **failed_record(exc, budget, remaining, started)})
        raise
    cost = min(max(sum(c["cost_usd"] for c in calls), 0.0), budget)
    final = calls[-1]["worker"]
    explanation = {"router": champion.name, "router_version": champion.version, "family": champion.family,
                   "budget_usd": budget, "key_remaining_usd": remaining, "verdicts": verdicts, "calls": calls,
                   "cost_usd": cost, "final_worker": final}
    prompt_tokens = sum(c["prompt_tokens"] for c in calls)
    completion_tokens = sum(c["completion_tokens"] for c in calls)
    gw.store.settle_later(held, cost, {
        **base, "chosen": final, "worker": final, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "explanation": explanation, "status": "ok", "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens, "cost_usd": cost, "usage_source": "worker",
        "response": text if gw.cfg.log_texts else "", "latency_s": time.monotonic() - started})
    extra = {"decision_id": decision_id, "router": champion.name, "router_version": champion.version,
             "family": champion.family, "chosen": final, "worker": final, "cost_usd": cost, "reserved_usd": budget,
             "calls": calls, "verdicts": [v["verdict"] for v in verdicts], "propensity": 1.0, "scores": {},
             "price_book_version": gw.book.version}
    if body.get("explain"):
        extra["explanation"] = explanation
    headers = {"x-routerops-decision-id": decision_id, "x-routerops-worker": final,
               "x-routerops-router": f"{champion.name}@{champion.version}", "x-routerops-cost-usd": f"{cost:.9f}",
               "x-routerops-reserved-usd": f"{budget:.9f}", "x-routerops-calls": ",".join(c["worker"] for c in calls),
               "x-routerops-verdicts": ",".join(v["verdict"] or "malformed" for v in verdicts)}
    completion_body = {"id": f"chatcmpl-{decision_id}", "object": "chat.completion", "created": int(time.time()),
                       "model": body["model"],
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                 "total_tokens": prompt_tokens + completion_tokens},
                       "routerops": extra}
    if body.get("stream"):
        return StreamingResponse(one_chunk_stream(completion_body), media_type="text/event-stream", headers=headers)
    return JSONResponse(completion_body, headers=headers)


FAMILY = GatewayFamily(served_family(CRITIQUE), answer=answer_critiqued)
