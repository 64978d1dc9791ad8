"""Tool workers: the Python sandbox worker and the sympy worker, called through the Worker protocol."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from routerops.errors import RouteropsError
from routerops.pricing import WorkerSpec, load_pool
from routerops.workers import LLMWorker, PythonWorker, SympyWorker, build_workers
from routerops.workers.sandbox import SandboxLimits
from routerops.workers.tools import UnsafeExpression, evaluate_math, extract_code, parse_math

REPO = Path(__file__).resolve().parents[3]


def tool_spec(kind: str, concurrency: int = 2, timeout_s: float = 10.0) -> WorkerSpec:
    return WorkerSpec(name=kind, kind=kind, primitives=(kind,), concurrency=concurrency, timeout_s=timeout_s)


# ------------------------------------------------------------------------------------------ sympy

@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("2*(3+4)", "14"),
        ("1/3 + 1/6", "1/2"),
        ("2^10", "1024"),
        ("sqrt(2)", "1.41421356237310"),
        ("2x + 3x", "5*x"),
        ("solve(x**2 - 4, x)", "[-2, 2]"),
    ],
)
def test_sympy_evaluates_exactly_then_numerically(expression, expected):
    assert evaluate_math(expression) == expected


async def test_sympy_worker_answers_and_reports_garbage_as_error_text():
    worker = SympyWorker(tool_spec("sympy"))
    good = await worker.call("2*(3+4)")
    bad = await worker.call("garbage ((")
    assert (good.text, good.error, good.prompt_tokens) == ("14", "", 0)
    assert bad.text.startswith("Error:") and bad.error == ""


async def test_sympy_worker_reads_the_last_user_message_of_a_chat_payload():
    worker = SympyWorker(tool_spec("sympy"))
    result = await worker.call([{"role": "system", "content": "x"}, {"role": "user", "content": "6*7"}])
    assert result.text == "42"


@pytest.mark.parametrize(
    "attack",
    [
        "__import__('os').system('touch {marker}')",
        "N(\"__import__('os').system('touch {marker}')\")",
        "sympify(\"__import__('os').system('touch {marker}')\")",
        "().__class__.__bases__[0].__subclasses__()",
        "(lambda: __import__('os').system('touch {marker}'))()",
    ],
)
def test_parse_math_never_executes_code(attack, tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ValueError):  # UnsafeExpression is a ValueError
        parse_math(attack.format(marker=marker))
    assert not marker.exists()


def test_numbers_too_large_to_compute_are_refused_quickly():
    started = time.monotonic()
    for expression in ("9**9**9", "2**(10**400)", "factorial(10**7)", "integrate(9**9**9, x)"):
        with pytest.raises(ValueError, match="too large"):
            evaluate_math(expression)
    assert time.monotonic() - started < 5.0


def test_long_input_and_unknown_words_are_rejected():
    with pytest.raises(ValueError, match="longer than"):
        parse_math("1+" * 1500 + "1")
    with pytest.raises(ValueError, match="unknown name"):
        parse_math("three apples")
    with pytest.raises(UnsafeExpression):
        parse_math("x.__class__")


# ------------------------------------------------------------------------------------------ python

def test_extract_code_prefers_a_python_fence():
    text = "Here:\n```\nignored\n```\nand\n```python\nprint(1)\n```\n"
    assert extract_code(text) == "print(1)\n"
    assert extract_code("```\nprint(2)\n```") == "print(2)\n"
    assert extract_code("print(3)") == "print(3)"


async def test_python_worker_returns_stdout_of_the_fenced_code():
    worker = PythonWorker(tool_spec("python"))
    result = await worker.call("Let me compute.\n```python\nprint(sum(range(101)))\n```")
    assert result.text == "5050\n" and result.error == ""
    assert result.prompt_tokens == result.completion_tokens == 0 and result.latency_s > 0


async def test_python_worker_reports_exceptions_and_limits_in_the_text():
    worker = PythonWorker(tool_spec("python"), SandboxLimits(cpu_s=1, wall_s=5, memory_mb=256))
    crash = await worker.call("print('partial')\nraise ValueError('bad input')")
    blocked = await worker.call("print(open('/etc/passwd').read())")
    assert crash.text == "partial\nError: ValueError: bad input" and crash.error == ""
    assert "filesystem limit" in blocked.text and blocked.text.startswith("Error:") and blocked.error == ""


@pytest.mark.slow
async def test_python_worker_honours_its_concurrency():
    # Three programs that each sleep 0.4 s: one slot runs them one after another.
    program = "import time\ntime.sleep(0.4)\nprint('done')"
    worker = PythonWorker(tool_spec("python", concurrency=1))
    started = time.monotonic()
    results = await asyncio.gather(*(worker.call(program) for _ in range(3)))
    assert [r.text for r in results] == ["done\n"] * 3
    assert time.monotonic() - started >= 1.2


# ------------------------------------------------------------------------------------------ pool

def test_build_workers_from_the_embedded_pool():
    pool = load_pool(REPO / "configs" / "pools" / "embedded-smollm2.yaml")
    workers = build_workers(pool, "http://127.0.0.1:9/v1")
    assert set(workers) == set(pool.names)
    assert isinstance(workers["smol-direct"], LLMWorker) and workers["smol-direct"].base_url == "http://127.0.0.1:9/v1"
    assert isinstance(workers["python"], PythonWorker) and isinstance(workers["sympy"], SympyWorker)


def test_build_workers_needs_a_local_url_for_local_llm_workers():
    pool = load_pool(REPO / "configs" / "pools" / "embedded-smollm2.yaml")
    with pytest.raises(RouteropsError, match="local"):
        build_workers(pool, None)
