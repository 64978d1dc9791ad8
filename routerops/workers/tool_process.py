"""Tool processes: a tool that computes on model-written input (sympy) runs in a separate process under
limits, killed on timeout, never in the pipeline's or the gateway's own process (issue 42 item 5).

A thread cannot be killed: `expand((x+y+z)**200)` in a worker thread answered "timed out after 3s"
and kept a core busy for 4 more seconds while the caller's memory grew by 46 MB. Here each call goes
to a child process, started with the same kinds of limits as the Python sandbox's program
(SandboxLimits): address space (RLIMIT_AS), CPU seconds per request (the child resets RLIMIT_CPU before
each one), no file writes (RLIMIT_FSIZE 0), few descriptors, no core dumps; a clean environment; its
own session; a parent-death signal, so it goes when the process that started it goes, even by SIGKILL.
At the wall-clock deadline the parent kills the child's whole process group and reaps it: nothing of a
timed-out call keeps running.

Start-up is an interpreter plus `import sympy` (hundreds of milliseconds, see
docs/pipeline/workers-and-sandbox.md), so children are kept warm: a pool of up to `size` idle
processes, each replaced after `max_calls` requests (sympy's caches grow) or whenever it was killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from routerops.workers.server import die_with

SYMPY_SCRIPT = Path(__file__).with_name("sympy_eval.py")
ANSWER_BYTES = 1_000_000  # a longer answer is refused as the output limit
STARTUP_S = 60.0  # an interpreter and `import sympy`: under a second, far more on a loaded machine
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool-spawner")


_POOLS: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child has the executor but not its thread, and the pools' idle processes are its
    parent's children: a spawner of its own, and pools that start their own processes."""
    global _SPAWNER
    _SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool-spawner")
    for pool in list(_POOLS):
        pool._idle.clear()  # in place: the pool's finalizer holds this list
        pool._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True)
class ToolLimits:
    """What one tool request may use (the Python sandbox's SandboxLimits, for a trusted evaluator)."""

    wall_s: float = 10.0  # wall-clock seconds per request, before the process is killed
    cpu_s: int = 5  # CPU seconds per request (RLIMIT_CPU, reset by the child before each request)
    memory_mb: int = 512  # address space of the process (RLIMIT_AS); python + sympy take ~150 MB
    open_files: int = 32  # RLIMIT_NOFILE
    max_calls: int = 200  # requests per process before it is replaced (sympy's caches grow)


class ToolStopped(Exception):
    """The request was stopped by a limit (`limit`: wall_time, cpu_time, memory, output, crashed)."""

    def __init__(self, limit: str, detail: str = ""):
        super().__init__(detail or limit)
        self.limit = limit


def _set_limits(limits: ToolLimits, parent_pid: int):
    """A preexec_fn: the parent-death signal (server.die_with), then the rlimits. The CPU limit is the
    child's own to set per request (a hard limit could not be raised again)."""
    die = die_with(parent_pid, signal.SIGKILL)

    def preexec() -> None:
        die()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        memory = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    return preexec


class ToolProcess:
    """One child serving requests one at a time over its stdin and stdout (JSON lines)."""

    def __init__(self, argv: list[str], limits: ToolLimits):
        self.limits = limits
        self.calls = 0
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_clean_env(),
            start_new_session=True, preexec_fn=_set_limits(limits, os.getpid()), close_fds=True)
        self._buffer = bytearray()
        self._ready = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, payload: dict, wall_s: float) -> dict:
        """Send one request and read its answer within `wall_s`; on any failure the process is
        killed (with its group) and ToolStopped says which limit stopped it."""
        self.calls += 1
        if not self._ready:  # the first request waits for start-up, outside its own time
            self._ready = bool(self._read_json(time.monotonic() + STARTUP_S, "startup").get("ready"))
        try:
            self.proc.stdin.write((json.dumps(payload) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:  # BrokenPipeError: it died since
            self.kill()
            raise ToolStopped(self._why_dead(), "the tool process ended before the request") from None
        return self._read_json(time.monotonic() + wall_s, "wall_time")

    def _read_json(self, deadline: float, limit: str) -> dict:
        line = self._read_line(deadline, limit)
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self.kill()
            raise ToolStopped("crashed", "the tool process answered garbage")
        return answer

    def _read_line(self, deadline: float, limit: str = "wall_time") -> bytes:
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise ToolStopped(limit)
                if selector.select(timeout=left):
                    chunk = os.read(fd, 65536)
                    if not chunk:  # the process died: a limit's signal, or a crash
                        self.kill()
                        raise ToolStopped(self._why_dead())
                    self._buffer += chunk
                    if len(self._buffer) > ANSWER_BYTES:
                        self.kill()
                        raise ToolStopped("output")
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        return line

    def _why_dead(self) -> str:
        """From the exit status: SIGXCPU is the kernel's CPU limit; the evaluator lets only a
        MemoryError end it with status 1 (every other exception is an answer)."""
        code = self.proc.wait()
        if code == -signal.SIGXCPU:
            return "cpu_time"
        return "memory" if code in (1, -signal.SIGSEGV, -signal.SIGABRT, -signal.SIGKILL) else "crashed"

    def kill(self) -> None:
        """SIGKILL the process group (the child and anything it started) and reap the child. Only
        while the child is unreaped: its pid, which names the group, cannot have been reused."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


def _clean_env() -> dict[str, str]:
    """Nothing of the pipeline's environment (API keys live there); one math thread."""
    return {"PATH": os.path.dirname(sys.executable), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1"}


class ToolPool:
    """Up to `size` warm tool processes; `call` takes an idle one (or starts one), sends the request,
    and puts it back unless it was killed or has served `max_calls` requests. Thread-safe: callers
    run `call` through asyncio.to_thread."""

    def __init__(self, argv: list[str], limits: ToolLimits, size: int = 1):
        self.argv, self.limits, self.size = argv, limits, max(1, size)
        self._idle: list[ToolProcess] = []
        self._lock = threading.Lock()
        self.started = 0  # processes started so far (tests and benchmarks read it)
        _POOLS.add(self)
        # A pool dropped without close() (a worker that goes out of scope) still kills its processes.
        weakref.finalize(self, _kill_all, self._idle)

    def call(self, payload: dict) -> dict:
        proc = self._take()
        try:
            answer = proc.request(payload, self.limits.wall_s)
        except BaseException:
            proc.kill()
            raise
        self._give_back(proc)
        return answer

    def _take(self) -> ToolProcess:
        with self._lock:
            while self._idle:
                proc = self._idle.pop()
                if proc.alive():
                    return proc
                proc.kill()  # died while idle (its starting thread ended: the parent-death signal)
            self.started += 1
        # Started from one long-lived thread: the parent-death signal fires when the thread that
        # forked ends, and asyncio.to_thread's threads end with their event loop.
        return _SPAWNER.submit(ToolProcess, self.argv, self.limits).result()

    def _give_back(self, proc: ToolProcess) -> None:
        with self._lock:
            if proc.calls < self.limits.max_calls and len(self._idle) < self.size and proc.alive():
                self._idle.append(proc)
                return
        proc.kill()

    def pids(self) -> list[int]:
        with self._lock:
            return [proc.pid for proc in self._idle]

    def close(self) -> None:
        with self._lock:
            idle = list(self._idle)
            self._idle.clear()
        for proc in idle:
            proc.kill()


def _kill_all(processes: list[ToolProcess]) -> None:
    while processes:
        processes.pop().kill()


def sympy_argv(limits: ToolLimits) -> list[str]:
    # -I: no PYTHONPATH, no user site, no current directory on the path; the script imports sympy only.
    return [sys.executable, "-I", "-B", str(SYMPY_SCRIPT), str(int(limits.cpu_s))]
