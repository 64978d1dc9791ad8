"""What the OS sandbox (bubblewrap + seccomp) costs against the audit-hook sandbox it replaced.

Per call: wall time of run_python("print(1)"), calls of the two sandboxes interleaved so that both
see the same machine load; p50 / p99 / mean. Start-up: building the runtime image into an empty cache
(once per interpreter and package versions, then shared by every process) and a process's first
backend check (the probe program). The old sandbox is read from git at OLD_SANDBOX_COMMIT, the last
commit that had it, and imported from a temp dir; it is never used by the pipeline.

    python benchmarks/sandbox_overhead.py [--calls 50] [--out benchmarks/results/sandbox_overhead.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from routerops.workers import sandbox, sandbox_image  # noqa: E402

OLD_SANDBOX_COMMIT = "fb2706fec984c590ae35e4dcc65df5a91156c36d"  # audit-hook sandbox, before issue 9
PROGRAM = "print(1)"


def load_old_sandbox(workdir: Path):
    """The audit-hook sandbox module as it was at OLD_SANDBOX_COMMIT."""
    for name in ("sandbox.py", "_sandbox_child.py"):
        source = subprocess.run(["git", "show", f"{OLD_SANDBOX_COMMIT}:routerops/workers/{name}"], cwd=REPO,
                                check=True, capture_output=True, text=True).stdout
        (workdir / name).write_text(source)
    spec = importlib.util.spec_from_file_location("old_audit_hook_sandbox", workdir / "sandbox.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def time_call(run) -> float:
    start = time.perf_counter()
    result = run()
    elapsed = (time.perf_counter() - start) * 1000
    if result.stdout != "1\n":
        raise RuntimeError(f"the sandbox did not run the program: {result}")
    return elapsed


def summarise(ms: list[float]) -> dict:
    a = np.array(ms)
    return {"p50_ms": round(float(np.percentile(a, 50)), 1), "p99_ms": round(float(np.percentile(a, 99)), 1),
            "mean_ms": round(float(a.mean()), 1), "min_ms": round(float(a.min()), 1), "calls": len(a)}


def measure_startup() -> dict:
    """Image build into an empty cache, then a fresh process's first backend check (probe)."""
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        image = sandbox_image.runtime_image(Path(cache))
        build_s = time.perf_counter() - start
        files = sum(1 for p in image.root.rglob("*") if p.is_file())
    sandbox.checked_backend.cache_clear()
    start = time.perf_counter()
    problem = sandbox.sandbox_problem()  # the default cache's image exists: this is the probe's cost
    check_s = time.perf_counter() - start
    if problem:
        raise RuntimeError(problem)
    return {"image_build_s": round(build_s, 2), "image_files": files, "first_backend_check_s": round(check_s, 3)}


def measure_calls(calls: int, old) -> dict:
    limits_new, limits_old = sandbox.SandboxLimits(), old.SandboxLimits()
    runs = {"old_audit_hook": lambda: old.run_python(PROGRAM, limits_old),
            "new_bwrap_seccomp": lambda: sandbox.run_python(PROGRAM, limits_new)}
    for run in runs.values():  # warm-up: page cache, the probe
        for _ in range(3):
            time_call(run)
    ms: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(calls):
        for name, run in runs.items():
            ms[name].append(time_call(run))
    return {name: summarise(values) for name, values in ms.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sandbox_overhead.json")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    startup = measure_startup()
    with tempfile.TemporaryDirectory() as old_dir:
        per_call = measure_calls(args.calls, load_old_sandbox(Path(old_dir)))
    old, new = per_call["old_audit_hook"], per_call["new_bwrap_seccomp"]
    backend = sandbox.require_sandbox()
    version = subprocess.run([backend.bwrap, "--version"], capture_output=True, text=True).stdout.strip()
    report = {
        "benchmark": "sandbox_overhead",
        "program": PROGRAM,
        "note": "wall time of one run_python call, old and new interleaved; default SandboxLimits",
        "old_sandbox_commit": OLD_SANDBOX_COMMIT,
        "per_call": per_call,
        "overhead_ms": {"p50": round(new["p50_ms"] - old["p50_ms"], 1), "p99": round(new["p99_ms"] - old["p99_ms"], 1)},
        "startup": startup,
        "backend": {"bwrap": version, "runs_as_uid": backend.run_as[0] if backend.run_as else os.getuid()},
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
                    # p99 on a shared machine is mostly other processes' preemption: record how busy it was
                    "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)]},
        "command": f"python benchmarks/sandbox_overhead.py --calls {args.calls}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for name, r in per_call.items():
        print(f"{name:18s} p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms  mean {r['mean_ms']:.1f} ms")
    print(f"start-up: image build {startup['image_build_s']} s (once per machine), "
          f"first backend check {startup['first_backend_check_s']} s (once per process)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
