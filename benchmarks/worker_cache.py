"""What the deterministic-worker cache (routerops/workers/cache.py) saves on RL-shaped rollouts, with
the real executor, the embedded llama.cpp workers (temperature 0) and the tool workers.

RL's access pattern: every step rolls one task out G times, and the curriculum revisits its tasks on
later steps; a policy that has settled on a plan sends the same payloads each time. Here the search
teacher's candidate trajectories (routerops/orchestra/teacher.py: fixed plans per task, so every
rollout of a candidate sends the same payloads, as a settled policy would) are rolled out G times per
task and the whole set twice ("visit 1", "visit 2"), once with the cache off and once with it on (a
fresh file), after one unrecorded warm-up rollout of each candidate. Reported per (cache, visit): episodes, worker calls the episodes asked for, calls that
reached a worker, cache hits, wall seconds, and the episodes' scores (equal with and without the cache
if the workers are deterministic).

    python benchmarks/worker_cache.py [--families basic_arithmetic gcd] [--train 3] [--group-size 4]

Writes benchmarks/results/worker_cache.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["basic_arithmetic", "gcd"])
    parser.add_argument("--train", type=int, default=3, help="train tasks per family")
    parser.add_argument("--group-size", type=int, default=4, help="G rollouts of each candidate per visit")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp generation threads")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/worker_cache.json")
    args = parser.parse_args()

    from routerops.envs.suites import read_tasks
    from routerops.layout import Layout
    from routerops.orchestra.executor import Executor, ExecutorConfig
    from routerops.pricing import load_pool, load_price_book
    from routerops.workers.cache import WorkerCache
    from stages.orchestra import (OrchestraRun, OrchestraTasks, OrchestraTeacher, close_workers, workers_with_servers,
                                  tasks, teacher_batches)

    run = OrchestraRun(pool=str(REPO / "configs/pool.yaml"), price_book=str(REPO / "configs/prices/current.yaml"),
                       tasks=OrchestraTasks(families=list(args.families), train=args.train, val=1, test=1, ood=1),
                       budget_usd=0.01, turn_limit=8)
    pool, book = load_pool(run.pool), load_price_book(run.price_book)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        layout = Layout(Path(tmp))
        chosen = [t for t in read_tasks(tasks(run, layout)) if t.split == "train"]
        with workers_with_servers(pool, 2048, args.threads) as workers:
            async def measure():
                try:
                    batches = await teacher_batches(OrchestraTeacher(), pool, workers, chosen, "bench")
                    warm = Executor(pool, workers, book, ExecutorConfig(budget_usd=run.budget_usd, turn_limit=run.turn_limit))
                    for controller, batch, run_id in batches:  # warm-up, not recorded: the server's first calls are slow
                        await warm.run_batch([(task, 10_000) for task in batch], controller, f"{run_id}-warm")
                    for cached in (False, True):
                        cache = WorkerCache(layout.root / f"cache-{int(cached)}.sqlite") if cached else None
                        executor = Executor(pool, workers, book, ExecutorConfig(budget_usd=run.budget_usd,
                                                                                turn_limit=run.turn_limit), cache=cache)
                        for visit in (1, 2):
                            before = cache.stats.snapshot() if cache is not None else None
                            started = time.perf_counter()
                            scores, asked = [], 0
                            for controller, batch, run_id in batches:
                                items = [(task, seed) for task in batch for seed in range(args.group_size)]
                                for result in await executor.run_batch(items, controller, f"{run_id}-v{visit}"):
                                    scores.append(float(result.episode["score"]))
                                    asked += sum(row["actor"] == "worker" for row in result.turns)
                            seconds = time.perf_counter() - started
                            stats = ({k: v - before[k] for k, v in cache.stats.snapshot().items()}
                                     if cache is not None else {"hits": 0, "misses": asked, "uncacheable": 0, "stored": 0})
                            rows.append({"cache": cached, "visit": visit, "episodes": len(scores),
                                         "worker_calls_asked": asked,
                                         "worker_calls_made": stats["misses"] + stats["uncacheable"],
                                         "cache_hits": stats["hits"], "seconds": round(seconds, 2),
                                         "score_sum": sum(scores), "scores": scores})
                            print({k: v for k, v in rows[-1].items() if k != "scores"}, flush=True)
                finally:
                    await close_workers(workers)

            asyncio.run(measure())
    off = {r["visit"]: r for r in rows if not r["cache"]}
    on = {r["visit"]: r for r in rows if r["cache"]}
    result = {
        "benchmark": "worker_cache", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/worker_cache.py " + " ".join(
            [f"--families {' '.join(args.families)}", f"--train {args.train}", f"--group-size {args.group_size}",
             f"--threads {args.threads}"]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average_end": os.getloadavg()},
        "protocol": __doc__.split("\n\n")[1].replace("\n", " "),
        "tasks": len(chosen), "group_size": args.group_size, "rows": rows,
        "same_scores_with_and_without_cache": all(off[v]["scores"] == on[v]["scores"] for v in (1, 2)),
        "seconds_saved_share": round(1 - sum(r["seconds"] for r in on.values()) / sum(r["seconds"] for r in off.values()), 3),
        "calls_saved_share": round(1 - sum(r["worker_calls_made"] for r in on.values())
                                   / max(sum(r["worker_calls_made"] for r in off.values()), 1), 3),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp_out, args.out)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))


if __name__ == "__main__":
    main()
