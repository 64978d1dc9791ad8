"""No isolation backend, no code execution: where bubblewrap cannot start, the code primitive refuses
with what to install, and pool validation says so before a collection starts. These tests take the
backend away for real (PATH without bwrap; a user namespace that allows no nested ones)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from routerops.config import load_params
from routerops.layout import Layout
from routerops.pricing import Pool, WorkerSpec, load_pool
from routerops.workers import build_workers, check_pool_runnable
from routerops.workers.sandbox import SandboxUnavailable, run_python, sandbox_problem
from routerops.workers.tools import PythonWorker
from stages.pipeline import collect

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def no_bwrap(monkeypatch, tmp_path):
    """A PATH on which bwrap cannot be found (nothing else changes)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("bwrap") is None


def test_without_bubblewrap_running_code_is_refused_naming_what_to_install(no_bwrap):
    problem = sandbox_problem()
    assert "bubblewrap" in problem and "apt-get install -y bubblewrap" in problem
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        run_python("print('this must not run anywhere')")


def test_the_python_worker_answers_with_the_refusal_as_its_error(no_bwrap):
    worker = PythonWorker(WorkerSpec(name="python", kind="python", primitives=("python",), timeout_s=5))
    result = asyncio.run(worker.call("print(17 * 23)"))
    assert result.text == "" and result.error.startswith("sandbox unavailable:") and "bubblewrap" in result.error


def test_pool_validation_refuses_a_pool_with_a_python_worker(no_bwrap):
    pool = load_pool(REPO / "configs" / "pools" / "embedded-smollm2.yaml")
    with pytest.raises(SandboxUnavailable, match=r"worker\(s\) \['python'\] run model-written code.*bubblewrap"):
        check_pool_runnable(pool)
    with pytest.raises(SandboxUnavailable):
        build_workers(pool, "http://127.0.0.1:9/v1")
    no_code = Pool(name="llm-and-algebra", workers=tuple(w for w in pool.workers if w.kind != "python"))
    check_pool_runnable(no_code)  # nothing to sandbox: nothing to refuse
    assert set(build_workers(no_code, "http://127.0.0.1:9/v1")) == set(no_code.names)


def test_the_collect_stage_fails_before_starting_anything(no_bwrap, tmp_path):
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    params = load_params(REPO / "params.yaml")
    started = time.monotonic()
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        collect(params, Layout(tmp_path), tmp_path / "tasks.jsonl")
    assert time.monotonic() - started < 5  # no LLM server was started, no episode was played
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configs"]  # and nothing was written


NO_NESTED_USERNS = """
import sys
with open('/proc/sys/user/max_user_namespaces', 'w') as f:
    f.write('0')
from routerops.workers.sandbox import sandbox_problem
print(sandbox_problem())
"""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("bwrap") is None,
                    reason="needs root (to map uids into a fresh user namespace), unshare and bwrap")
def test_without_user_namespaces_the_refusal_says_how_to_allow_them():
    # A user namespace of our own (root and the sandbox uid mapped) that allows no nested ones.
    child = subprocess.Popen(["unshare", "--user", "--", "sh", "-c", f"read _ && exec {sys.executable} -c \"$0\"",
                              NO_NESTED_USERNS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    try:
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{child.pid}/ns/user") == os.readlink("/proc/self/ns/user"):
            assert time.monotonic() < deadline, "unshare did not create the user namespace"
            time.sleep(0.01)
        for kind in ("uid_map", "gid_map"):
            Path(f"/proc/{child.pid}/{kind}").write_text("0 0 1\n65534 65534 1\n")
        out, _ = child.communicate("go\n", timeout=120)
    finally:
        child.kill()
    assert "bubblewrap cannot create its namespaces here" in out
    assert "user.max_user_namespaces" in out and "unprivileged_userns_clone" in out
