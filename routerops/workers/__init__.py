"""Workers: the priced things a router calls. LLM workers speak the OpenAI chat API (llama.cpp, vLLM,
API providers); tool workers run code in a sandbox or algebra in sympy."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

from routerops.errors import RouteropsError
from routerops.pricing import Pool
from routerops.types import Worker
from routerops.workers.endpoints import ServedEndpoints, pool_endpoints
from routerops.workers.llm import LLMWorker
from routerops.workers.sandbox import SandboxUnavailable, sandbox_problem
from routerops.workers.tools import PythonWorker, SympyWorker

__all__ = ["LLMWorker", "PythonWorker", "ServedEndpoints", "SympyWorker", "build_workers", "check_pool_runnable",
           "close_workers", "pool_endpoints", "run_closing"]

T = TypeVar("T")


def check_pool_runnable(pool: Pool) -> None:
    """Refuse a pool whose tools cannot run here, before any collection starts: a python worker runs
    model-written code, which it does only inside the OS sandbox (bubblewrap)."""
    coders = [w.name for w in pool.workers if w.kind == "python"]
    problem = sandbox_problem() if coders else None
    if problem:
        raise SandboxUnavailable(f"pool {pool.name!r}: worker(s) {coders} run model-written code, but the "
                                 f"sandbox cannot start on this machine: {problem}")


def build_workers(pool: Pool, endpoints: ServedEndpoints | str | None) -> dict[str, Worker]:
    """One worker per pool entry; each LLM worker talks to its endpoint's URL in `endpoints` (what
    `pool_endpoints` yields; a plain string is the local llama.cpp server's URL, and no replay server)."""
    check_pool_runnable(pool)
    if not isinstance(endpoints, ServedEndpoints):
        endpoints = ServedEndpoints(local=endpoints)
    workers: dict[str, Worker] = {}
    for spec in pool.workers:
        if spec.kind == "llm":
            workers[spec.name] = LLMWorker(spec, endpoints.url_for(spec))
        elif spec.kind == "python":
            workers[spec.name] = PythonWorker(spec)
        elif spec.kind == "sympy":
            workers[spec.name] = SympyWorker(spec)
        else:
            raise RouteropsError(f"worker {spec.name!r}: no implementation for kind {spec.kind!r}")
    return workers


async def close_workers(workers: Iterable[Worker]) -> None:
    """Close the HTTP clients the workers opened on the running loop, while it still runs. A client
    left open is closed later by the garbage collector on whichever loop runs then (the openai SDK
    schedules `aclose()` from `__del__`), and its connections, bound to the finished loop, fail there
    with "RuntimeError: Event loop is closed", which asyncio logs as an ERROR with a traceback."""
    for worker in workers:
        if hasattr(worker, "aclose"):
            await worker.aclose()


def run_closing(main: Coroutine[Any, Any, T], workers: Iterable[Worker]) -> T:
    """`asyncio.run(main)`, then the workers' clients closed on the same loop (see close_workers)."""
    workers = list(workers)

    async def body() -> T:
        try:
            return await main
        finally:
            await close_workers(workers)

    return asyncio.run(body())
