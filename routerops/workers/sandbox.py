"""Run untrusted Python (code an LLM wrote) walled off by the operating system.

Each program runs in a fresh bubblewrap sandbox (sandbox_backend.py): an unprivileged uid in its own
user, mount, PID, IPC, UTS and network namespaces, a read-only root holding only the interpreter and
the allowed packages (sandbox_image.py), a private tmpfs as its working directory and a /dev/shm,
sized (together disk_bytes) and holding at most `files` inodes each, a clean environment, no
capabilities, no new privileges and a seccomp filter. Inside, before the program runs,
_sandbox_child.py sets rlimits for CPU, memory, file size, open files and processes, and installs an
audit hook that stops a careless program at a limit (a tripwire, never the wall).

Which limit stopped a program is the parent's own observation, never something the program can write:
its own timers and counters (wall time, output), the exit status and the resource usage it collects
with wait4 (CPU time), and the tripwire's exit codes (LIMIT_EXIT_CODES). No channel is open from the
program to the parent besides stdout and stderr, and the reaper that reports the exit status is
non-dumpable, so the program can neither open its descriptors nor write its memory (/proc/1/*).

The parent supervises: it reads stdout and stderr itself within the output cap, and at the wall-clock
deadline kills the sandbox's PID-namespace init, which takes every process of the namespace with it,
whatever they do with their stdout (setsid, double fork, holding the pipe open). Reading stops a short
grace after that, so run_python never overruns wall_s by more than GRACE_S.

No backend, no code execution: where bubblewrap cannot start, run_python raises SandboxUnavailable
with what to install, and `sandbox_problem()` lets pool validation say so before a collection starts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from routerops.workers.sandbox_backend import (
    INSTALL_HINT,
    PAGE_BYTES,
    Backend,
    SandboxUnavailable,
    build_backend,
    bwrap_command,
    find_bwrap,
    memfd_with,
)
from routerops.workers.sandbox_image import CHILD_PATH

__all__ = ["LIMIT_NAMES", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "require_sandbox", "run_python",
           "sandbox_problem"]

LIMIT_NAMES = ("cpu_time", "wall_time", "memory", "output", "processes", "network", "filesystem")
GRACE_S = 0.5  # after a kill or the end of the sandbox, how long leftover output is still read
# How the tripwire (_sandbox_child.py) ends a program it stopped: an exit status the parent observes,
# like timeout(1)'s 124. A program may exit with one of them itself; it then only misreports its own
# failure (an exit status of 0 is never reported as a limit).
LIMIT_EXIT_CODES = {"memory": 111, "filesystem": 112, "network": 113, "processes": 114}


@dataclass(frozen=True)
class SandboxLimits:
    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU soft limit; SIGKILL one second later)
    wall_s: float = 10.0  # wall-clock seconds, start-up included, before the whole sandbox is killed
    memory_mb: int = 512  # address-space limit per process (RLIMIT_AS); the interpreter needs ~30 MB
    output_bytes: int = 1_000_000  # stdout + stderr together; the program is killed past this
    file_bytes: int = 16_000_000  # largest file the program may write (RLIMIT_FSIZE)
    disk_bytes: int = 64_000_000  # every writable mount together: its private tmpfs and /dev/shm
    shm_bytes: int = 4_000_000  # the /dev/shm tmpfs, taken out of disk_bytes (at most half of it)
    open_files: int = 64  # RLIMIT_NOFILE
    processes: int = 0  # processes or threads beyond the program itself (RLIMIT_NPROC)
    files: int = 4096  # inodes each writable tmpfs holds (files, directories, links; ~1 KB of kernel memory each)


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int  # negative: killed by that signal (subprocess convention)
    limit: str | None  # which limit stopped the program, one of LIMIT_NAMES, or None
    duration_s: float
    cpu_s: float = 0.0  # user + system CPU time of the sandbox


# The child: sets the rlimits, installs the audit hook and runs main.py (see its docstring).
CHILD_SCRIPT = Path(__file__).with_name("_sandbox_child.py")
PROBE_CODE, PROBE_OUTPUT = "print('sandbox ok')", "sandbox ok\n"
PROBE_LIMITS = SandboxLimits(cpu_s=5, wall_s=30.0)  # the first probe may wait for the image build


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), *, audit_hook: bool = True) -> SandboxResult:
    """Run `code` as a program in a fresh sandbox; blocking (call it through asyncio.to_thread).

    audit_hook=False leaves out the tripwire, to show what the operating system stops by itself.
    Raises SandboxUnavailable when the isolation backend cannot run here."""
    return execute(code, limits, require_sandbox(), audit_hook)


def sandbox_problem() -> str | None:
    """Why the code primitive cannot run here (naming what to install), or None when it can."""
    checked = checked_backend(find_bwrap())
    return checked if isinstance(checked, str) else None


def require_sandbox() -> Backend:
    checked = checked_backend(find_bwrap())
    if isinstance(checked, str):
        raise SandboxUnavailable(checked)
    return checked


@functools.cache
def checked_backend(bwrap: str | None) -> Backend | str:
    """The backend once a probe program ran in it, else the problem (cached per bwrap path)."""
    if bwrap is None:
        return f"bubblewrap (bwrap) is not on PATH, and the python tool runs code only inside it: {INSTALL_HINT}"
    try:
        backend = build_backend(bwrap)
    except SandboxUnavailable as exc:
        return str(exc)
    try:
        probe = execute(PROBE_CODE, PROBE_LIMITS, backend, audit_hook=True)
    except OSError as exc:  # bwrap could not even be started (e.g. switching to SANDBOX_UID failed)
        return f"cannot start bubblewrap ({bwrap}): {exc}"
    if probe.exit_code == 0 and probe.stdout == PROBE_OUTPUT:
        return backend
    return _explain_failed_probe(probe)


def _explain_failed_probe(probe: SandboxResult) -> str:
    said = probe.stderr.strip()[-500:] or f"exit code {probe.exit_code}, no message"
    # util-linux unshare (which mounts the sized tmpfs) meets a missing user namespace first: ENOSPC
    # when user.max_user_namespaces is 0, EPERM where they are forbidden.
    if "namespace" in said or "uid map" in said or "Operation not permitted" in said or "unshare failed" in said:
        return (f"bubblewrap cannot create its namespaces here ({said}). Unprivileged user namespaces must be "
                "allowed: `sysctl -w kernel.unprivileged_userns_clone=1` and `sysctl -w user.max_user_namespaces="
                "10000` (Ubuntu 24.04: also `kernel.apparmor_restrict_unprivileged_userns=0`); in Docker, run "
                "with `--security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt "
                "systempaths=unconfined` (bwrap mounts a /proc of its own)")
    return f"the sandbox's probe program failed ({said})"


def execute(code: str, limits: SandboxLimits, backend: Backend, audit_hook: bool = True) -> SandboxResult:
    """Run `code` in `backend` (run_python, once the backend has passed its probe)."""
    parent_ends, child_ends = [], []
    try:
        status_r, status_w = os.pipe()  # the reaper writes the exit status here (the program cannot)
        info_r, info_w = os.pipe()  # bwrap writes {"child-pid": ...} here once the sandbox exists
        parent_ends += [status_r, info_r]
        fds = {"info": info_w, "seccomp": memfd_with(backend.seccomp, "seccomp"),
               "child": memfd_with(_child_script(), "child"),
               "program": memfd_with(code.encode("utf-8", "replace"), "program")}
        child_ends += [status_w, *fds.values()]
        config = {"cpu_s": int(limits.cpu_s), "memory_bytes": int(limits.memory_mb) * 1024 * 1024,
                  "file_bytes": int(limits.file_bytes), "open_files": int(limits.open_files),
                  "processes": int(limits.processes), "status_fd": status_w, "limit_exit_codes": LIMIT_EXIT_CODES,
                  "audit_hook": audit_hook,
                  "read_roots": list(backend.image.read_roots), "child_script": CHILD_PATH}
        argv = [backend.image.python, "-I", "-B", CHILD_PATH, json.dumps(config)]
        started = time.monotonic()
        workdir_bytes, shm_bytes = disk_split(limits)
        proc = subprocess.Popen(
            bwrap_command(backend, fds, workdir_bytes, argv, shm_bytes=shm_bytes,
                          files=int(limits.files)), env={}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=child_ends, start_new_session=True,
            **_run_as(backend))
        _close(child_ends)  # only the sandbox holds them now: EOF on status/info means it is gone
        return _supervise(proc, {"status": status_r, "info": info_r}, limits, started)
    finally:
        _close(parent_ends + child_ends)


def disk_split(limits: SandboxLimits) -> tuple[int, int]:
    """(working directory, /dev/shm) tmpfs sizes in whole pages, together at most disk_bytes: tmpfs
    rounds a size up to whole pages, so both are rounded down here; /dev/shm gets at most half."""
    page = PAGE_BYTES
    disk = max(int(limits.disk_bytes), 2 * page)
    shm = min(max(int(limits.shm_bytes), page), disk // 2) // page * page
    return (disk - shm) // page * page, shm


@functools.lru_cache(maxsize=1)
def _child_script() -> bytes:
    return CHILD_SCRIPT.read_bytes()


def _run_as(backend: Backend) -> dict:
    if backend.run_as is None:
        return {}
    uid, gid = backend.run_as
    return {"user": uid, "group": gid, "extra_groups": []}


def _close(fds: list[int]) -> None:
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())


class _Supervisor:
    """Reads the sandbox's pipes within the output cap and the deadline; kills the whole sandbox.

    side: the small pipes besides stdout and stderr: "status" (the reaper's exit status: it tells a
    signal N from an exit code of 128 + N, which bwrap's own status folds together) and "info"
    (bwrap's JSON with the namespace init's pid)."""

    POLL_S = 0.02
    SIDE_BYTES = 4096  # the side pipes carry a few bytes; never buffer more

    def __init__(self, proc: subprocess.Popen, side: dict[str, int], limits: SandboxLimits, started: float):
        self.proc, self.limits = proc, limits
        self.deadline = started + limits.wall_s
        self.out_fd, self.err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        self.buffers = {self.out_fd: bytearray(), self.err_fd: bytearray()}
        self.side_of = {fd: name for name, fd in side.items()}
        self.side = {name: bytearray() for name in side}
        self.total = 0
        self.killed_for: str | None = None
        self.stop_at: float | None = None  # end of the grace period after a kill or bwrap's exit
        self.init_pidfd = -1  # the sandbox's PID-namespace init: killing it empties the namespace
        self.selector = selectors.DefaultSelector()
        for fd in (*self.buffers, *self.side_of):
            self.selector.register(fd, selectors.EVENT_READ)

    def kill(self, reason: str) -> None:
        if self.killed_for is None:
            self.killed_for = reason
            self.stop_at = time.monotonic() + GRACE_S
        self.kill_sandbox()

    def kill_sandbox(self) -> None:
        if self.init_pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.proc.pid, signal.SIGKILL)  # bwrap; --die-with-parent takes the namespace too

    def pump(self) -> None:
        """Read until the sandbox is gone and its pipes are closed, or the grace after a kill ends."""
        exited = False
        while True:
            now = time.monotonic()
            if not exited and _has_exited(self.proc.pid):
                exited = True
                self.stop_at = min(self.stop_at or now + GRACE_S, now + GRACE_S)
            if not exited and now > self.deadline:
                self.kill("wall_time")
            if (exited and not self.selector.get_map()) or (self.stop_at and now > self.stop_at):
                break
            if not self.selector.get_map():
                time.sleep(self.POLL_S / 4)
                continue
            for key, _ in self.selector.select(timeout=self.POLL_S):
                if not self._read(key.fd):
                    self.selector.unregister(key.fd)
        self.selector.close()

    def _read(self, fd: int) -> bool:
        chunk = os.read(fd, 65536)
        if not chunk:
            return False
        if fd in self.side_of:
            name = self.side_of[fd]
            self.side[name].extend(chunk[: self.SIDE_BYTES - len(self.side[name])])
            if name == "info":
                self._watch_init()
            return True
        room = max(self.limits.output_bytes - self.total, 0)
        self.buffers[fd] += chunk[:room]
        self.total += len(chunk)
        if self.total > self.limits.output_bytes:
            self.kill("output")
        return True

    def _watch_init(self) -> None:
        """A pidfd on the namespace's init, once bwrap has reported it; checked to be bwrap's child,
        so that a recycled pid can never make us signal an unrelated process."""
        if self.init_pidfd >= 0:
            return
        with contextlib.suppress(ValueError, KeyError, TypeError, OSError):  # not all of the JSON yet
            pid = int(json.loads(self.side["info"].decode())["child-pid"])
            pidfd = os.pidfd_open(pid)
            if _parent_of(pid) == self.proc.pid:
                self.init_pidfd = pidfd
            else:
                os.close(pidfd)

    def reaper_exit_code(self) -> int | None:
        """The program's exit code as the reaper reported it; None when it did not."""
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(self.side["status"].decode())["exit_code"])
        return None

    def close(self) -> None:
        if self.init_pidfd >= 0:
            os.close(self.init_pidfd)


def _supervise(proc: subprocess.Popen, side: dict[str, int], limits: SandboxLimits, started: float) -> SandboxResult:
    sup = _Supervisor(proc, side, limits, started)
    try:
        sup.pump()
    finally:
        sup.kill_sandbox()  # nothing of it outlives the call, whatever ended the pump
        # bwrap's resource usage includes every process of the sandbox it and the reaper waited for.
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # tell Popen the child is reaped
        proc.stdout.close()
        proc.stderr.close()
        sup.close()
    cpu = usage.ru_utime + usage.ru_stime
    exit_code = _program_exit_code(proc.returncode)
    said = sup.reaper_exit_code()
    if said is not None and not sup.killed_for and _folded(said) == proc.returncode:
        exit_code = said  # the reaper tells a signal N from an exit code of 128 + N; bwrap cannot
    return SandboxResult(
        stdout=sup.buffers[sup.out_fd].decode("utf-8", "replace"),
        stderr=sup.buffers[sup.err_fd].decode("utf-8", "replace"),
        exit_code=exit_code,
        limit=_which_limit(sup.killed_for, exit_code, cpu, limits),
        duration_s=time.monotonic() - started,
        cpu_s=cpu,
    )


def _program_exit_code(bwrap_code: int) -> int:
    """bwrap exits with 128 + N when the program died of signal N: report that as -N, like subprocess."""
    if 128 < bwrap_code < 128 + signal.NSIG:
        return -(bwrap_code - 128)
    return bwrap_code


def _folded(exit_code: int) -> int:
    """The reaper's own exit status for a program exit code (how bwrap passes it on)."""
    return exit_code if exit_code >= 0 else 128 - exit_code


def _which_limit(killed_for: str | None, exit_code: int, cpu: float, limits: SandboxLimits) -> str | None:
    """From what the parent saw itself: its own kill, the exit status, the CPU time wait4 counted."""
    if killed_for:
        return killed_for
    for limit, code in LIMIT_EXIT_CODES.items():
        if exit_code == code:
            return limit
    # The kernel enforces RLIMIT_CPU with SIGXCPU, then SIGKILL at the hard limit one second later
    # (a program that handles SIGXCPU). SIGXCPU is the kernel's own word; a SIGKILL only counts with
    # the CPU time wait4 measured (which, under load, can read 10-30 % below the kernel's limit check).
    if exit_code == -signal.SIGXCPU or (exit_code == -signal.SIGKILL and cpu >= 0.9 * limits.cpu_s):
        return "cpu_time"
    return None


def _has_exited(pid: int) -> bool:
    # WNOWAIT: leave bwrap a zombie, so its pid cannot be reused before we kill and reap it.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])  # the field after the state, past the command name
