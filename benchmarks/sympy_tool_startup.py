"""What running the sympy tool in a separate process costs (issue 42 item 5), and what a warm pool saves.

Per request, wall time of SympyWorker-style calls on "6*7", three ways interleaved so that all see the
same machine load: `cold` (a fresh tool process per request: interpreter + `import sympy` + the
request, then killed), `warm` (the request on a process kept from the previous one, as ToolPool does)
and `thread` (the old way: evaluate_math in a thread of the caller, no wall at all). p50 / p99 / mean.

    python benchmarks/sympy_tool_startup.py [--calls 20] [--out benchmarks/results/sympy_tool_startup.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from routerops.workers.sympy_eval import evaluate_math  # noqa: E402
from routerops.workers.tool_process import ToolLimits, ToolPool, sympy_argv  # noqa: E402

EXPRESSION = "6*7"


def timed(run) -> float:
    start = time.perf_counter()
    answer = run()
    assert answer == "42", answer
    return time.perf_counter() - start


def summary(seconds: list[float]) -> dict[str, float]:
    ms = np.array(seconds) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 1), "p99_ms": round(float(np.percentile(ms, 99)), 1),
            "mean_ms": round(float(ms.mean()), 1), "n": len(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/sympy_tool_startup.json"))
    args = parser.parse_args()
    limits = ToolLimits()
    cold = ToolPool(sympy_argv(limits), ToolLimits(max_calls=1))  # every process serves one request
    warm = ToolPool(sympy_argv(limits), limits)
    warm.call({"text": "1"})  # started once, before timing
    evaluate_math("1")  # the thread's sympy imported and warm too
    times: dict[str, list[float]] = {"cold": [], "warm": [], "thread": []}
    for _ in range(args.calls):
        times["cold"].append(timed(lambda: cold.call({"text": EXPRESSION})["answer"]))
        times["warm"].append(timed(lambda: warm.call({"text": EXPRESSION})["answer"]))
        times["thread"].append(timed(lambda: evaluate_math(EXPRESSION)))
    cold.close()
    warm.close()
    result = {"benchmark": "sympy_tool_startup", "expression": EXPRESSION, "calls": args.calls,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_1min": round(os.getloadavg()[0], 2)},
              **{name: summary(values) for name, values in times.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
