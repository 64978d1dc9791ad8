"""Tool workers: a Python sandbox and a computer-algebra backend (sympy), priced per call.

Both return the tool's answer as text. A program that fails, or an expression that does not parse, is
an *answer* ("Error: ..." in the text, WorkerResult.error empty) that the router learns from; only a
tool that could not run at all (the sandbox failed to start, or cannot exist on this machine) sets
WorkerResult.error.
"""

from __future__ import annotations

import asyncio
import re
import time

from routerops.pricing import WorkerSpec
from routerops.types import Payload, WorkerResult
from routerops.workers.concurrency import ConcurrencyLimit
from routerops.workers.sandbox import SandboxLimits, SandboxResult, SandboxUnavailable, run_python
# The evaluator runs in tool processes; its parser is importable here for checks and tests.
from routerops.workers.sympy_eval import UnsafeExpression, evaluate_math, parse_math  # noqa: F401
from routerops.workers.tool_process import ToolLimits, ToolPool, ToolStopped, sympy_argv

_FENCE = re.compile(r"```[ \t]*(python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_STDERR_TAIL_CHARS = 2000


def payload_text(payload: Payload) -> str:
    """The text a tool works on: the payload itself, or the last user message of a chat payload."""
    if isinstance(payload, str):
        return payload
    for message in reversed(payload):
        if message.get("role") == "user":
            return message.get("content") or ""
    return payload[-1].get("content", "") if payload else ""


def extract_code(text: str) -> str:
    """The first ```python fenced block, else the first bare fenced block, else the whole text."""
    blocks = _FENCE.findall(text)
    tagged = [code for lang, code in blocks if lang]
    if tagged or blocks:
        return (tagged or [code for _, code in blocks])[0]
    return text


class PythonWorker:
    """Runs the code in the payload in the sandbox; its stdout is the answer."""

    def __init__(self, spec: WorkerSpec, limits: SandboxLimits | None = None):
        self.name = spec.name
        self.spec = spec
        # Half the call timeout as CPU: a CPU-bound program then reports cpu_time, a sleeping one wall_time.
        self.limits = limits or SandboxLimits(cpu_s=max(1, int(spec.timeout_s / 2)), wall_s=float(spec.timeout_s))
        self._slots = ConcurrencyLimit(spec.concurrency)

    async def call(self, payload: Payload, max_tokens: int | None = None) -> WorkerResult:
        code = extract_code(payload_text(payload))
        started = time.monotonic()
        async with self._slots:
            try:
                result = await asyncio.to_thread(run_python, code, self.limits)
            except SandboxUnavailable as exc:  # no isolation backend here: refuse, never run unsandboxed
                return WorkerResult(text="", latency_s=time.monotonic() - started, error=f"sandbox unavailable: {exc}")
            except OSError as exc:  # the sandbox itself could not start
                return WorkerResult(text="", latency_s=time.monotonic() - started, error=f"sandbox failed: {exc}")
        return WorkerResult(text=describe_run(result), latency_s=time.monotonic() - started)


def describe_run(result: SandboxResult) -> str:
    """stdout, followed by an 'Error: ...' line naming the limit or the exception when the run failed."""
    if result.limit:
        detail = f"the program was stopped by the sandbox {result.limit} limit"
    elif result.exit_code != 0:
        tail = result.stderr.strip()[-_STDERR_TAIL_CHARS:]
        detail = tail.splitlines()[-1] if tail else f"exit code {result.exit_code}"
    else:
        return result.stdout
    sep = "" if not result.stdout or result.stdout.endswith("\n") else "\n"
    return f"{result.stdout}{sep}Error: {detail}"


# ---------------------------------------------------------------------------------------------- sympy


class SympyWorker:
    """Evaluates the payload as a math expression with sympy, in a separate process under limits
    (tool_process.py): a request past its time is killed with its process, not left running."""

    def __init__(self, spec: WorkerSpec, limits: ToolLimits | None = None):
        self.name = spec.name
        self.spec = spec
        # Like PythonWorker: half the call timeout as CPU, the whole of it as wall time.
        self.limits = limits or ToolLimits(cpu_s=max(1, int(spec.timeout_s / 2)), wall_s=float(spec.timeout_s))
        self._slots = ConcurrencyLimit(spec.concurrency)
        self.pool = ToolPool(sympy_argv(self.limits), self.limits, size=spec.concurrency)

    async def call(self, payload: Payload, max_tokens: int | None = None) -> WorkerResult:
        text = payload_text(payload)
        started = time.monotonic()
        async with self._slots:
            try:
                answer = (await asyncio.to_thread(self.pool.call, {"text": text}))["answer"]
            except ToolStopped as stopped:
                answer = describe_stop(stopped, self.limits)
            except OSError as exc:  # the tool process could not start
                return WorkerResult(text="", latency_s=time.monotonic() - started, error=f"sympy failed: {exc}")
        return WorkerResult(text=str(answer), latency_s=time.monotonic() - started)

    def close(self) -> None:
        """Kill the idle tool processes (a later call starts a fresh one)."""
        self.pool.close()

    async def aclose(self) -> None:  # routerops.workers.close_workers calls it at the end of a run
        self.close()


def describe_stop(stopped: ToolStopped, limits: ToolLimits) -> str:
    """The answer text for a request a limit stopped (the worker cache keeps timeouts out)."""
    if stopped.limit in ("wall_time", "cpu_time"):
        spent = limits.wall_s if stopped.limit == "wall_time" else limits.cpu_s
        return f"Error: sympy timed out after {spent:g}s ({stopped.limit} limit; the computation was killed)"
    return f"Error: sympy was stopped by its {stopped.limit} limit"
