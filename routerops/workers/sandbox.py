"""Run untrusted Python (code an LLM wrote) in a child process with time, memory, output, process,
network and filesystem limits.

Layers, because no single one is enough when the pipeline runs as root:
- OS limits set in the child before any user code runs: RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_FSIZE,
  RLIMIT_NOFILE, RLIMIT_CORE=0 and RLIMIT_NPROC=0 (the kernel ignores NPROC for root, so it only helps
  when the pipeline runs unprivileged).
- A network namespace (`unshare -n`, or `unshare -rn` for unprivileged users) when the machine allows it:
  the child then has no interface but loopback-down, whatever the code does.
- The parent supervises: wall-clock deadline, output cap (reads the pipes itself and kills when the
  cap is passed), and a watchdog that kills the whole process group as soon as the child has a child.
- A PEP 578 audit hook installed by the child (_sandbox_child.py) before the program runs: it stops the
  program on process creation (os.fork, os.exec*, os.system, subprocess.Popen, posix_spawn...), on
  any socket use, and on file access outside the temp dir (reads are also allowed under the stdlib
  and site-packages, which imports need); it refuses ctypes foreign calls, cffi, gc introspection
  and settrace. A spawn that raises no audit event (_posixsubprocess.fork_exec) is caught by the
  watchdog. Audit hooks are a tripwire, not a wall (PEP 578 says so): as root, reads outside the temp
  dir are stopped by the hook alone, so treat the sandbox as protection against careless code rather
  than a boundary against a determined attacker.

The child runs `python -I -B` (isolated: no PYTHON* env, no user site, no script dir on sys.path;
no .pyc writes) in a fresh temp dir that is removed afterwards, in its own session/process group,
with a minimal environment.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LIMIT_NAMES = ("cpu_time", "wall_time", "memory", "output", "processes", "network", "filesystem")


@dataclass(frozen=True)
class SandboxLimits:
    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU soft limit; SIGKILL one second later)
    wall_s: float = 10.0  # wall-clock seconds before the parent kills the process group
    memory_mb: int = 512  # address-space limit (RLIMIT_AS); the interpreter itself needs ~30 MB
    output_bytes: int = 1_000_000  # stdout + stderr together; the program is killed past this
    file_bytes: int = 16_000_000  # largest file the program may write in its temp dir (RLIMIT_FSIZE)
    open_files: int = 64  # RLIMIT_NOFILE


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int  # negative: killed by that signal (subprocess convention)
    limit: str | None  # which limit stopped the program, one of LIMIT_NAMES, or None
    duration_s: float
    cpu_s: float = 0.0  # user + system CPU time of the child


# The child: sets the OS limits, installs the audit hook and runs main.py (see its docstring).
CHILD_SCRIPT = Path(__file__).with_name("_sandbox_child.py")


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` as a program in a fresh sandbox; blocking (call it through asyncio.to_thread)."""
    workdir = tempfile.mkdtemp(prefix="routerops-sandbox-")
    report_r = report_w = -1
    try:
        report_r, report_w = os.pipe()  # the child writes the name of the limit it hit here
        Path(workdir, "main.py").write_text(code, encoding="utf-8")
        config = {
            "cpu_s": int(limits.cpu_s),
            "memory_bytes": int(limits.memory_mb) * 1024 * 1024,
            "file_bytes": int(limits.file_bytes),
            "open_files": int(limits.open_files),
            "report_fd": report_w,
            "read_roots": _read_roots(),
            "child_script": str(CHILD_SCRIPT),
        }
        cmd = [*_network_isolation_prefix(), sys.executable, "-I", "-B", str(CHILD_SCRIPT), json.dumps(config)]
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=workdir, env=_minimal_env(workdir), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, pass_fds=(report_w,), start_new_session=True,
        )
        os.close(report_w)
        report_w = -1
        return _supervise(proc, report_r, limits, started)
    finally:
        for fd in (report_r, report_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)


def _read_roots() -> list[str]:
    """Directories the child may read: the stdlib (with lib-dynload) and site-packages, for imports."""
    paths = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return sorted(p for p in paths if p and os.path.isdir(p))


def _minimal_env(workdir: str) -> dict[str, str]:
    # One BLAS/OpenMP thread: threads count against the process limit and would share the CPU limit.
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    env.update({k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    return env


@functools.lru_cache(maxsize=1)
def _network_isolation_prefix() -> tuple[str, ...]:
    """`unshare -n` (root) or `unshare -rn` (user namespaces) if this machine permits it, else nothing."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    prefix = (unshare, "-n") if os.geteuid() == 0 else (unshare, "-r", "-n")
    try:
        probe = subprocess.run([*prefix, "--", "true"], capture_output=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ()
    return (*prefix, "--") if probe.returncode == 0 else ()


class _Supervisor:
    """Reads the child's pipes within the output cap and the deadline; kills its group when needed."""

    POLL_S = 0.02

    def __init__(self, proc: subprocess.Popen, report_fd: int, limits: SandboxLimits, started: float):
        self.proc, self.limits, self.started = proc, limits, started
        self.deadline = started + limits.wall_s
        self.out_fd, self.err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        self.buffers = {self.out_fd: bytearray(), self.err_fd: bytearray()}
        self.report = bytearray()
        self.report_fd = report_fd
        self.total = 0
        self.killed_for: str | None = None
        self.selector = selectors.DefaultSelector()
        for fd in (*self.buffers, report_fd):
            self.selector.register(fd, selectors.EVENT_READ)

    def kill(self, reason: str) -> None:
        if self.killed_for is None:
            self.killed_for = reason
        _kill_group(self.proc.pid)

    def pump(self) -> None:
        """Read until every pipe is closed and the child has exited, or a limit kills it."""
        open_fds = len(self.buffers) + 1
        while True:
            exited = _has_exited(self.proc.pid)
            if exited:
                _kill_group(self.proc.pid)  # a straggler holding our pipes open dies with the group
                if not open_fds:
                    break
            elif time.monotonic() > self.deadline and self.killed_for is None:
                self.kill("wall_time")
            elif self.killed_for is None and _has_children(self.proc.pid):
                self.kill("processes")
            if not open_fds:
                time.sleep(self.POLL_S / 4)
                continue
            for key, _ in self.selector.select(timeout=self.POLL_S):
                if not self._read(key.fd):
                    self.selector.unregister(key.fd)
                    open_fds -= 1
        self.selector.close()

    def _read(self, fd: int) -> bool:
        chunk = os.read(fd, 65536)
        if not chunk:
            return False
        if fd == self.report_fd:
            self.report += chunk[:64]
            return True
        room = max(self.limits.output_bytes - self.total, 0)
        self.buffers[fd] += chunk[:room]
        self.total += len(chunk)
        if self.total > self.limits.output_bytes:
            self.kill("output")
        return True


def _supervise(proc: subprocess.Popen, report_fd: int, limits: SandboxLimits, started: float) -> SandboxResult:
    sup = _Supervisor(proc, report_fd, limits, started)
    try:
        sup.pump()
    finally:
        _kill_group(proc.pid)  # sweep anything left in the group before the leader is reaped
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # tell Popen the child is reaped
        proc.stdout.close()
        proc.stderr.close()
    cpu = usage.ru_utime + usage.ru_stime
    return SandboxResult(
        stdout=sup.buffers[sup.out_fd].decode("utf-8", "replace"),
        stderr=sup.buffers[sup.err_fd].decode("utf-8", "replace"),
        exit_code=proc.returncode,
        limit=_which_limit(sup.killed_for, bytes(sup.report), proc.returncode, cpu, limits),
        duration_s=time.monotonic() - started,
        cpu_s=cpu,
    )


def _which_limit(killed_for: str | None, report: bytes, exit_code: int, cpu: float, limits: SandboxLimits):
    if killed_for:
        return killed_for
    reported = report.decode("ascii", "replace").strip()
    if reported in LIMIT_NAMES:
        return reported
    # The kernel enforces RLIMIT_CPU with SIGXCPU, then SIGKILL at the hard limit one second later.
    if exit_code in (-signal.SIGXCPU, -signal.SIGKILL) and cpu >= 0.9 * limits.cpu_s:
        return "cpu_time"
    return None


def _has_exited(pid: int) -> bool:
    # WNOWAIT: leave the child a zombie so its process-group id stays valid for the final sweep.
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None


def _has_children(pid: int) -> bool:
    """True when any thread of `pid` has a child process (Linux /proc; False where unavailable)."""
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            if Path(path).read_text().strip():
                return True
        except OSError:
            continue
    return False


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
