"""Crash safety: a collection SIGKILLed mid-run resumes to exactly the planned episodes, redoing only
the episodes its journal lacked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from routerops import schema
from routerops.rollout import JOURNAL_NAME, read_journal
from routerops.workers.chaos import DelayedEndpoint

REPO = Path(__file__).resolve().parents[2]
TASKS, POLICIES = 20, 2  # every episode of this plan makes exactly one call
PLANNED = TASKS * POLICIES

# The collection the child process runs: one LLM worker behind the endpoint, two single-call policies.
CHILD = """
import datetime as dt, sys
from routerops.envs.qa import QAEnvironment
from routerops.policies import SinglePolicy, UniformRandomRouter
from routerops.pricing import Price, PriceBook, WorkerSpec
from routerops.rollout import collect_sync
from routerops.types import Task
from routerops.workers import LLMWorker

url, out_dir, n_tasks = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec = WorkerSpec(name="llm", kind="llm", primitives=("answer",), generation={"max_tokens": 8}, concurrency=2)
book = PriceBook("crash", dt.date(2026, 11, 1), {"llm": Price(0.1, 0.4)})
tasks = [Task(f"t{i}", "crash/add", "train", f"What is {i} + 1?", str(i + 1)) for i in range(n_tasks)]
episodes, _ = collect_sync(tasks, [SinglePolicy("llm"), UniformRandomRouter(seed=5)], QAEnvironment(),
                           {"llm": LLMWorker(spec, url)}, book, 1.0, 2, out_dir, "crash-run", 0, 2, progress=False)
print("episodes", len(episodes))
"""


def child_env() -> dict[str, str]:
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def complete_lines(journal: Path) -> int:
    return journal.read_bytes().count(b"\n") if journal.exists() else 0


def kill_after_journaled(proc: subprocess.Popen, journal: Path, at_least: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while complete_lines(journal) < at_least:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"child ended or stalled before journaling {at_least} episodes: {proc.returncode}")
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.mark.slow
def test_sigkilled_collection_resumes_to_exactly_the_planned_set(tmp_path):
    endpoint = DelayedEndpoint(delay_s=0.2)
    with endpoint as url:
        command = [sys.executable, "-c", CHILD, url, str(tmp_path), str(TASKS)]
        proc = subprocess.Popen(command, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        kill_after_journaled(proc, tmp_path / JOURNAL_NAME, at_least=6)
        assert proc.returncode == -signal.SIGKILL
        time.sleep(0.5)  # let the server finish counting requests the killed child had sent
        journaled = len(read_journal(tmp_path / JOURNAL_NAME))
        assert 6 <= journaled < PLANNED and not (tmp_path / "episodes.parquet").exists()
        calls_before = endpoint.requests

        rerun = subprocess.run(command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        rerun_calls = endpoint.requests - calls_before

    assert rerun_calls == PLANNED - journaled  # the finished episodes were skipped, the rest made once
    episodes = schema.read_table(tmp_path / "episodes.parquet", "episodes")
    planned = {schema.episode_id("crash-run", f"t{i}", policy, 0)
               for i in range(TASKS) for policy in ("single/llm/answer", "uniform_random")}
    assert set(episodes["episode_id"]) == planned and episodes["episode_id"].is_unique
    assert complete_lines(tmp_path / JOURNAL_NAME) == PLANNED  # no episode journaled twice
    assert (episodes["ended_by"] == "done").all() and (episodes["turns"] == 1).all()
