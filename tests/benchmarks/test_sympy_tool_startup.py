"""benchmarks/sympy_tool_startup.py as documented (docs/pipeline/workers-and-sandbox.md), at 2 calls:
it writes its JSON with the three ways timed, and a cold start is the slow one. No other timing asserted."""

from __future__ import annotations

import json
import sys

import pytest


@pytest.mark.slow  # two cold tool processes (an interpreter and sympy each)
def test_the_benchmark_writes_cold_warm_and_thread_timings(bench, tmp_path, monkeypatch):
    out = tmp_path / "startup.json"
    monkeypatch.setattr(sys, "argv", ["sympy_tool_startup.py", "--calls", "2", "--out", str(out)])
    bench.main()
    result = json.loads(out.read_text())
    assert {result[k]["n"] for k in ("cold", "warm", "thread")} == {2}
    assert result["cold"]["p50_ms"] > result["warm"]["p50_ms"]  # the start-up the warm pool saves
