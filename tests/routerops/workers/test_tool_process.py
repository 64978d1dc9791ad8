"""Issue 42 item 5: the sympy tool runs in a separate, limited process that is killed on timeout.

On main the expression ran in a worker thread of the caller: "timed out" was answered while the
thread kept computing (a core busy for 4 more seconds, the caller's memory growing by 46 MB)."""

from __future__ import annotations

import time

import psutil
import pytest

from routerops.pricing import WorkerSpec
from routerops.workers.tools import SympyWorker
from routerops.workers.tool_process import SYMPY_SCRIPT

pytestmark = pytest.mark.slow  # each test starts tool processes (an interpreter and sympy: ~0.5-1 s)


def sympy_worker(timeout_s: float = 2.0) -> SympyWorker:
    return SympyWorker(WorkerSpec(name="sympy", kind="sympy", primitives=("sympy",), concurrency=1,
                                  timeout_s=timeout_s))


def tool_children() -> list[psutil.Process]:
    """The sympy tool processes this test process started and that still exist."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if str(SYMPY_SCRIPT) in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.parametrize("expression", ["expand((x+y+z)**200)", "summation(1/k**2, (k, 1, 10**9))"])
async def test_a_runaway_expression_times_out_and_nothing_of_it_keeps_running(expression):
    worker = sympy_worker(timeout_s=1.5)
    assert (await worker.call("6*7")).text == "42"  # warm: the start-up is not what times out
    me = psutil.Process()
    rss_before = me.memory_info().rss
    started = time.monotonic()
    result = await worker.call(expression)
    assert "timed out" in result.text and time.monotonic() - started < 1.5 + 1.0, result.text
    assert tool_children() == []  # the process that computed is gone, at once
    cpu_before = sum(me.cpu_times()[:2])
    time.sleep(1.0)
    # main's thread went on computing: 0.39 s of CPU in the next second, on a loaded 2-core machine
    assert sum(me.cpu_times()[:2]) - cpu_before < 0.1  # nothing computes on in the caller either
    assert me.memory_info().rss - rss_before < 20 * 2**20  # and the caller's memory did not grow
    assert (await worker.call("2^10")).text == "1024"  # a fresh process serves the next request
    worker.close()
    assert tool_children() == []


async def test_costly_requests_are_refused_before_evaluation_and_the_process_is_kept():
    worker = sympy_worker(timeout_s=5.0)
    await worker.call("1+1")
    for expression, said in (("N(pi, 10**7)", "precision too large"), ("N(pi, n=10**7)", "precision too large"),
                             ("totient(2**1001 + 1)", "argument too large"),
                             ("sin(" * 60 + "x" + ")" * 60, "nested deeper")):
        started = time.monotonic()
        result = await worker.call(expression)
        assert said in result.text and result.error == "", result.text
        assert time.monotonic() - started < 1.5
    assert worker.pool.started == 1  # refusals cost no process: the warm one served them all
    worker.close()


async def test_warm_processes_serve_many_requests_and_the_pool_closes_them():
    worker = sympy_worker()
    answers = [(await worker.call(f"{i}*{i}")).text for i in range(1, 6)]
    assert answers == ["1", "4", "9", "16", "25"]
    assert worker.pool.started == 1 and len(tool_children()) == 1
    worker.close()
    assert tool_children() == []
