"""Off the table (issue 39 item 6): a registered router scored on another logged-outcome table with
responses, through replay endpoints made from it, with no retraining — does the router transfer?

For each query of the table the router estimates each of its workers' quality (as the gateway would
serve it, no budget); the chosen worker is the best of those the table logged (a router worker maps to
a table worker by name, through the pool's `model` of a replay worker, or by `--map`). Its answer is
fetched from the replay endpoint of the table over the chat API (the project's LLMWorker: the logged
response and token counts); its score is the table's logged score; its cost the price book's on the
tokens. How often the router's first choice was a worker the table does not hold is reported
(`first_choice_outside_table`): those queries were answered by its best worker that the table holds.
Beside it: each single table worker and the oracle (cheapest correct) on the same queries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from routerops.envs.replay import worker_order
from routerops.errors import InputError
from routerops.pricing import PriceBook, WorkerSpec, load_pool
from routerops.workers import run_closing
from routerops.workers.endpoints import is_replay
from routerops.workers.llm import LLMWorker

N_BOOT = 1000


def worker_map(router_workers: list[str], table_workers: list[str], pool_file: str | Path | None,
               explicit: Mapping[str, str]) -> dict[str, str]:
    """Router worker → table worker: `explicit` first, then the pool's replay workers' `model`, then
    the same name. Workers that map to nothing are left out (the router cannot be scored on them)."""
    via_pool: dict[str, str] = {}
    if pool_file and Path(pool_file).is_file():
        via_pool = {w.name: w.model for w in load_pool(pool_file).workers if is_replay(w.endpoint) and w.model}
    mapped = {}
    for worker in router_workers:
        target = explicit.get(worker) or (via_pool.get(worker) if via_pool.get(worker) in table_workers else None)
        target = target or (worker if worker in table_workers else None)
        if target:
            mapped[worker] = target
    bad = sorted(set(explicit.values()) - set(table_workers))
    if bad:
        raise InputError("command line", "--map", f"{bad[0]!r} is not a worker of the table ({', '.join(table_workers)})")
    if not mapped:
        raise InputError("command line", "--map", f"none of the router's workers ({', '.join(router_workers)}) is a "
                         f"worker of the table ({', '.join(table_workers)}): map them with --map ROUTER=TABLE")
    return mapped


def choices(quality: np.ndarray, router_workers: list[str], mapped: Mapping[str, str]) -> tuple[list[str], np.ndarray]:
    """Per query, the table worker of the best-estimated router worker the table holds; and whether
    the router's first choice was one it does not hold."""
    allowed = np.array([w in mapped for w in router_workers])
    best = np.where(allowed, quality, -np.inf).argmax(axis=1)
    outside = ~allowed[quality.argmax(axis=1)]
    return [mapped[router_workers[j]] for j in best], outside


def fetch_answers(base_url: str, asks: list[tuple[str, str]], system: str) -> list[Any]:
    """The replay endpoint's answer to each (table worker, query), through the project's LLMWorker
    (one client per table worker, closed on the loop that made it)."""
    workers = {name: LLMWorker(WorkerSpec(name=name, kind="llm", primitives=("answer",), endpoint=base_url, model=name,
                                          generation={"system": system} if system else {}, max_retries=1,
                                          concurrency=8), base_url)
               for name in sorted({w for w, _ in asks})}

    async def main():
        return await asyncio.gather(*(workers[w].call(q) for w, q in asks))

    return run_closing(main(), workers.values())


def bootstrap_interval(values: np.ndarray, seed: int = 0, n_boot: int = N_BOOT) -> tuple[float, float]:
    if not len(values):
        return (float("nan"), float("nan"))
    draws = np.random.default_rng(seed).integers(0, len(values), (n_boot, len(values)))
    means = values[draws].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def evaluate_transfer(router, table: pd.DataFrame, book: PriceBook, base_url: str,
                      mapped: Mapping[str, str]) -> dict[str, Any]:
    """The router's accuracy and USD per query on `table` (answers fetched from the replay endpoint at
    `base_url`), beside each single table worker and the oracle."""
    queries = table.drop_duplicates("query_id")[["query_id", "query"]].reset_index(drop=True)
    quality = router.quality(router.routing_data(list(queries["query"])))
    chosen, outside = choices(quality, list(router.workers), mapped)
    system = str(table.attrs.get("prompt_prefix", "")).rstrip("\n")

    results = fetch_answers(base_url, list(zip(chosen, queries["query"])), system)
    failed = [r.error for r in results if r.error]
    if failed:
        raise InputError(base_url, "replay", f"{len(failed)} calls failed, first: {failed[0]}")
    logged = table.set_index(["query_id", "worker"])
    scores = np.array([logged.at[(q, w), "score"] for q, w in zip(queries["query_id"], chosen)], dtype=float)
    costs = np.array([book.cost(w, r.prompt_tokens, r.completion_tokens) for w, r in zip(chosen, results)])
    return {"policy": f"router:{getattr(router, 'family', 'router')}", "test_queries": len(queries),
            "accuracy": float(scores.mean()), "accuracy_ci95": bootstrap_interval(scores),
            "usd_per_query": float(costs.mean()),
            "action_shares": {w: float(np.mean([c == w for c in chosen])) for w in worker_order(table)},
            "first_choice_outside_table": float(outside.mean()), "worker_map": dict(mapped),
            "baselines": baselines(table, book)}


def baselines(table: pd.DataFrame, book: PriceBook) -> list[dict[str, Any]]:
    """Each single worker and the oracle (the cheapest worker that is right; else the cheapest) on the
    table's logged outcomes, costs under `book`."""
    frame = table.assign(cost=[book.cost(w, p, c) for w, p, c in zip(table.worker, table.prompt_tokens,
                                                                       table.completion_tokens)])
    rows = [{"policy": f"single:{w}", "accuracy": float(g.score.mean()), "usd_per_query": float(g.cost.mean())}
            for w, g in frame.groupby("worker", sort=False)]
    best = frame.sort_values(["query_id", "score", "cost"], ascending=[True, False, True]).drop_duplicates("query_id")
    rows.append({"policy": "oracle", "accuracy": float(best.score.mean()), "usd_per_query": float(best.cost.mean())})
    return rows
