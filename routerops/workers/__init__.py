"""Workers: the priced things a router calls. LLM workers speak the OpenAI chat API (llama.cpp, vLLM,
API providers); tool workers run code in a sandbox or algebra in sympy."""

from __future__ import annotations

from routerops.errors import RouteropsError
from routerops.pricing import Pool
from routerops.types import Worker
from routerops.workers.llm import LLMWorker
from routerops.workers.sandbox import SandboxUnavailable, sandbox_problem
from routerops.workers.tools import PythonWorker, SympyWorker

__all__ = ["LLMWorker", "PythonWorker", "SympyWorker", "build_workers", "check_pool_runnable"]


def check_pool_runnable(pool: Pool) -> None:
    """Refuse a pool whose tools cannot run here, before any collection starts: a python worker runs
    model-written code, which it does only inside the OS sandbox (bubblewrap)."""
    coders = [w.name for w in pool.workers if w.kind == "python"]
    problem = sandbox_problem() if coders else None
    if problem:
        raise SandboxUnavailable(f"pool {pool.name!r}: worker(s) {coders} run model-written code, but the "
                                 f"sandbox cannot start on this machine: {problem}")


def build_workers(pool: Pool, local_base_url: str | None) -> dict[str, Worker]:
    """One worker per pool entry; LLM workers with endpoint "local" talk to `local_base_url`."""
    check_pool_runnable(pool)
    workers: dict[str, Worker] = {}
    for spec in pool.workers:
        if spec.kind == "llm":
            base_url = local_base_url if spec.endpoint == "local" else spec.endpoint
            if not base_url:
                raise RouteropsError(
                    f"worker {spec.name!r} uses the local LLM server, but no local server URL was given"
                )
            workers[spec.name] = LLMWorker(spec, base_url)
        elif spec.kind == "python":
            workers[spec.name] = PythonWorker(spec)
        elif spec.kind == "sympy":
            workers[spec.name] = SympyWorker(spec)
        else:
            raise RouteropsError(f"worker {spec.name!r}: no implementation for kind {spec.kind!r}")
    return workers
