"""Collection throughput: worker calls per second with 1 vs 16 episodes in flight (target: 12x).

The endpoint is routerops.workers.chaos.DelayedEndpoint, an OpenAI-compatible server answering every
request after a fixed 200 ms, so the speed-up measures how well the rollout engine overlaps calls
(the engine's own costs included: budget checks, the QA environment, the fsynced journal, the final
Parquet tables). The server runs in its own process, as a model server would, so its request
handling does not compete with the collector for the interpreter lock.

Each level runs `--repeats` times and the median calls/s is reported (the machine is shared; one
run can be slowed by other work), with every repeat kept in the JSON.

    python benchmarks/collect_throughput.py [--tasks 192] [--sequential-tasks 48] [--repeats 3] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from routerops.envs.qa import QAEnvironment
from routerops.policies import SinglePolicy
from routerops.pricing import Price, PriceBook, WorkerSpec
from routerops.rollout import collect
from routerops.types import Task
from routerops.workers import LLMWorker
from routerops.workers.chaos import DelayedEndpoint

TARGET_SPEEDUP = 12.0
SEQUENTIAL, CONCURRENT = 1, 16
DEFAULT_OUT = Path(__file__).parent / "results" / "collect_throughput.json"
SPEC = WorkerSpec(name="delayed-llm", kind="llm", primitives=("answer",), model="delayed-echo",
                  generation={"max_tokens": 16}, concurrency=CONCURRENT, timeout_s=30)
BOOK = PriceBook(version="bench", effective_date=dt.date(2026, 11, 1),
                 prices={SPEC.name: Price(input_per_1m=0.1, output_per_1m=0.4)})


def serve_endpoint(delay_s: float, conn) -> None:
    """Child process: run the endpoint until told to stop; answer "stats" with its counters."""
    endpoint = DelayedEndpoint(delay_s=delay_s)
    with endpoint as url:
        conn.send(url)
        while (message := conn.recv()) != "stop":
            if message == "stats":
                conn.send({"requests": endpoint.requests, "max_in_flight": endpoint.max_in_flight})


@contextlib.contextmanager
def endpoint_process(delay_s: float) -> Iterator[tuple[str, object]]:
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=serve_endpoint, args=(delay_s, theirs), daemon=True)
    process.start()
    try:
        yield ours.recv(), ours
    finally:
        ours.send("stop")
        process.join(timeout=10)
        if process.is_alive():
            process.kill()


def bench_tasks(n: int) -> list[Task]:
    return [Task(task_id=f"bench/{i}", suite="bench/add", split="train", prompt=f"What is {i} + {i}?",
                 answer=str(2 * i)) for i in range(n)]


async def measure(url: str, tasks: list[Task], concurrency: int, repeat: int = 0) -> dict:
    """Collect one single-call episode per task with `concurrency` in flight; calls/s of the run."""
    worker = LLMWorker(SPEC, url)
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            started = time.perf_counter()
            _, turns = await collect(
                tasks, [SinglePolicy(SPEC.name)], QAEnvironment(), {SPEC.name: worker}, BOOK, budget_usd=1.0,
                turn_limit=1, out_dir=out_dir, run_id=f"bench-c{concurrency}-r{repeat}", seed=0,
                concurrency=concurrency, progress=False)
            seconds = time.perf_counter() - started
    finally:
        await worker.aclose()
    failed = worker.stats.failures
    if failed:
        raise RuntimeError(f"{failed} calls failed at concurrency {concurrency}; the measurement is void")
    return {"concurrency": concurrency, "calls": len(turns), "seconds": round(seconds, 3),
            "calls_per_s": round(len(turns) / seconds, 2), "client_max_in_flight": worker.stats.max_in_flight}


def run_level(url: str, control, tasks: list[Task], concurrency: int, repeats: int) -> dict:
    """`repeats` runs at one concurrency (fresh run ids, so nothing resumes); the median is the figure."""
    runs = []
    for repeat in range(repeats):
        runs.append(asyncio.run(measure(url, tasks, concurrency, repeat)))
    control.send("stats")
    rates = [r["calls_per_s"] for r in runs]
    return {"concurrency": concurrency, "tasks": len(tasks), "calls_per_s": statistics.median(rates),
            "calls": runs[0]["calls"], "seconds": statistics.median(r["seconds"] for r in runs),
            "server_max_in_flight": control.recv()["max_in_flight"], "repeats": runs}


def run_benchmark(n_tasks: int, n_sequential: int, repeats: int, delay_s: float) -> dict:
    with endpoint_process(delay_s) as (url, control):
        sequential = run_level(url, control, bench_tasks(n_sequential), SEQUENTIAL, repeats)
        concurrent = run_level(url, control, bench_tasks(n_tasks), CONCURRENT, repeats)
    speedup = concurrent["calls_per_s"] / sequential["calls_per_s"]
    return {
        "benchmark": "collect_throughput",
        "endpoint": f"DelayedEndpoint, fixed {delay_s * 1000:.0f} ms per call, separate process",
        "delay_s": delay_s, "levels": [sequential, concurrent],
        "calls": concurrent["calls"], "seconds": concurrent["seconds"], "calls_per_s": concurrent["calls_per_s"],
        "sequential_calls_per_s": sequential["calls_per_s"],
        "speedup": round(speedup, 2), "ideal_speedup": CONCURRENT / SEQUENTIAL, "target": TARGET_SPEEDUP,
        "passed": speedup >= TARGET_SPEEDUP,
        "machine": {"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
                    "python": platform.python_version(), "platform": platform.platform()},
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=192, help="episodes per concurrent run (one call each)")
    parser.add_argument("--sequential-tasks", type=int, default=48, help="episodes per sequential run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per concurrency level (median reported)")
    parser.add_argument("--delay", type=float, default=0.2, help="endpoint delay per call, seconds")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON result")
    args = parser.parse_args(argv)
    result = run_benchmark(args.tasks, args.sequential_tasks, args.repeats, args.delay)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("calls", "calls_per_s", "speedup", "target", "passed")}))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
