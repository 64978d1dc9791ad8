"""Child side of routerops.workers.sandbox: run as a script inside bubblewrap,
`python -I -B /opt/routerops/child.py CONFIG_JSON`, in the sandbox's tmpfs where the program is main.py.
Never imported by the pipeline.

It is the sandbox's pid 1. It forks: the program runs in the child, under rlimits for CPU, memory,
file size, open files and processes, optionally behind a PEP 578 audit hook, as main.py in a fresh
`__main__` module; this process stays as its reaper and writes the program's exit status to the
status pipe (bwrap's exit status folds a signal N into 128 + N). The reaper makes itself non-dumpable
before the fork: the program runs as the same uid, and a dumpable pid 1 would let it open
/proc/1/mem (write the reaper's memory) and /proc/1/fd/* (write the status pipe). The program is
made dumpable again, as any process is. The wall is the operating system (namespaces, read-only
root, seccomp, an unprivileged uid): the hook is only a tripwire that ends a careless program with
the exit code of the limit it ran into (filesystem, network, processes) instead of letting it fail
obscurely. Nothing the program can write reaches the parent but its stdout and stderr: the parent
names limits from what it observes itself (sandbox.py).
Code in the sandbox can reach the hook (an audit hook lives in the interpreter it polices) and may
switch it off; nothing outside the sandbox depends on it. It still looks nothing up at call time (a
test checks its code has no LOAD_GLOBAL), so patching builtins does not silence it by accident.
"""

# The hook may not call builtins such as any() (see above), hence its plain loops and try/except.
# ruff: noqa: UP031, SIM105, SIM110
from __future__ import annotations

import json
import os
import posix
import resource
import signal
import sys
import types


def cap(kind: int, soft: int, hard: int | None = None) -> None:
    resource.setrlimit(kind, (soft, soft if hard is None else hard))


def set_process_limit(cfg: dict) -> None:
    """Before the fork: the tasks there are now (this reaper, pid 1), the program, and the
    processes or threads it may add. RLIMIT_NPROC counts the tasks of our uid in our user namespace,
    which holds only this sandbox."""
    cap(resource.RLIMIT_NPROC, count_tasks() + 1 + cfg["processes"])


def set_program_limits(cfg: dict) -> None:
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_CPU, cfg["cpu_s"], cfg["cpu_s"] + 1)  # SIGXCPU, then SIGKILL a second later
    cap(resource.RLIMIT_AS, cfg["memory_bytes"])
    cap(resource.RLIMIT_FSIZE, cfg["file_bytes"])
    cap(resource.RLIMIT_NOFILE, cfg["open_files"])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write then fails with EFBIG


def count_tasks() -> int:
    """Processes and threads that exist now: /proc shows only this sandbox's PID namespace."""
    total = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                total += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                continue
    return total


def resolve_early(path: str) -> str:
    return os.path.realpath(path)  # before the program runs, nothing has been patched yet


def make_guard(cfg: dict):
    """The audit hook, with everything it needs bound in this scope."""
    _lstat, _readlink, _getcwd, _write, _exit = posix.lstat, posix.readlink, posix.getcwd, posix.write, os._exit
    _flush_stdout = sys.stdout.flush
    _isinstance, _str, _bytes, _int, _len = isinstance, str, bytes, int, len
    _OSError, _PermissionError, _ImportError, _BaseException = OSError, PermissionError, ImportError, BaseException
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    s_ifmt, s_iflnk = 0o170000, 0o120000
    exit_codes = cfg["limit_exit_codes"]
    # devices, and this script (tracebacks through the hook show its source lines)
    readable_files = frozenset(["/dev/null", "/dev/urandom", "/dev/random"] + [resolve_early(cfg["child_script"])])
    # event -> (indices of path arguments, index of the dir_fd argument or -1)
    write_events = {
        "os.mkdir": ((0,), 2), "os.rmdir": ((0,), 1), "os.remove": ((0,), 1), "os.rename": ((0, 1), 2),
        "os.chmod": ((0,), 2), "os.chown": ((0,), 3), "os.utime": ((0,), 3), "os.truncate": ((0,), -1),
        "os.chdir": ((0,), -1), "os.setxattr": ((0,), -1), "os.removexattr": ((0,), -1),
    }
    read_events = {"os.listdir": ((0,), -1), "os.scandir": ((0,), -1), "os.getxattr": ((0,), -1),
                   "os.listxattr": ((0,), -1), "glob.glob": ((0,), -1), "glob.glob/2": ((0, 2), 3)}
    process_events = frozenset((
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
        "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "os.setsid", "os.setpgid"))
    refused_events = frozenset(("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace",
                                "sys.setprofile"))
    refused_modules = frozenset(("cffi", "_cffi_backend"))

    def stop(limit: str, what: str) -> None:
        # os._exit cannot be caught: say why on stderr, then end with the limit's exit code.
        try:
            _flush_stdout()
        except _BaseException:  # noqa: BLE001 - a broken stdout must not keep the program alive
            pass
        _write(2, ("\nsandbox: %s blocked (%s limit)\n" % (what, limit)).encode("utf-8", "replace"))
        _exit(exit_codes[limit])

    def resolve(path: str, base: str) -> str:
        """Absolute path with '.', '..' and symlinks resolved, like os.path.realpath."""
        if not path.startswith("/"):
            path = base + "/" + path
        pending = [p for p in path.split("/") if p and p != "."][::-1]
        done: list = []
        hops = 0
        while pending:
            part = pending.pop()
            if part == "..":
                if done:
                    done.pop()
                continue
            candidate = "/" + "/".join(done + [part])
            try:
                mode = _lstat(candidate).st_mode
            except _OSError:
                done.append(part)  # does not exist (yet): the rest is taken literally
                continue
            if mode & s_ifmt == s_iflnk and hops < 40:
                hops += 1
                target = _readlink(candidate)
                if target.startswith("/"):
                    done = []
                pending.extend([p for p in target.split("/") if p and p != "."][::-1])
            else:
                done.append(part)
        return "/" + "/".join(done)

    workdir = resolve(_getcwd(), "/")
    read_roots = tuple([resolve(p, "/") for p in cfg["read_roots"]] + [workdir])

    def inside(real: str, roots: tuple) -> bool:
        for root in roots:
            if real == root or real.startswith(root + "/"):
                return True
        return False

    def check_path(event: str, path, write: bool, dir_fd) -> None:
        if _isinstance(path, _int) or path is None:
            return  # an open descriptor: opening it was checked
        if _isinstance(path, _bytes):
            path = path.decode("utf-8", "surrogateescape")
        if not _isinstance(path, _str):
            stop("filesystem", "%s with a path of an unexpected type" % event)
        if event.startswith("glob."):
            path = path.rpartition("/")[0] or "."
        base = _getcwd()
        if _isinstance(dir_fd, _int) and dir_fd >= 0:
            base = _readlink("/proc/self/fd/%d" % dir_fd)
        real = resolve(path, base)
        if real in readable_files:
            return
        if not inside(real, (workdir,) if write else read_roots):
            stop("filesystem", "%s(%r)" % (event, path))

    def check_args(event: str, args: tuple, spec: tuple, write: bool) -> None:
        positions, dir_fd_at = spec
        dir_fd = args[dir_fd_at] if 0 <= dir_fd_at < _len(args) else None
        for i in positions:
            if i < _len(args):
                check_path(event, args[i], write, dir_fd)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            mode, flags = args[1], args[2]
            write = (_isinstance(mode, _str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
                _isinstance(flags, _int) and flags & write_flags != 0)
            check_path(event, args[0], write, None)
        elif event in write_events:
            check_args(event, args, write_events[event], True)
        elif event in read_events:
            check_args(event, args, read_events[event], False)
        elif event in ("os.link", "os.symlink"):
            stop("filesystem", event)
        elif event in process_events:
            stop("processes", event)
        elif event.startswith("socket."):
            stop("network", event)
        elif event in refused_events:
            raise _PermissionError("%s is not available in the sandbox" % event)
        elif event == "import" and args[0].partition(".")[0] in refused_modules:
            raise _ImportError("module %r is not available in the sandbox" % args[0])
        elif event.startswith("ctypes.") and not (event == "ctypes.dlopen" and args[0] is None):
            # `import ctypes` (sympy needs its types) only opens the running program itself;
            # loading a library, looking up a symbol or calling a foreign function is refused.
            raise _PermissionError("%s is not available in the sandbox" % event)

    return hook


PR_SET_DUMPABLE = 4  # <linux/prctl.h>


def set_dumpable(on: bool) -> None:
    """prctl(PR_SET_DUMPABLE): a non-dumpable process's /proc/PID/mem, fd/ and environ are closed to
    processes of its uid that lack CAP_SYS_PTRACE (every process of the sandbox lacks it)."""
    import ctypes  # only here: the program never sees this module's names

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def stop_for(cfg: dict, limit: str, message: str) -> None:
    sys.stderr.write(f"\nsandbox: {message} ({limit} limit)\n")
    sys.stderr.flush()
    os._exit(cfg["limit_exit_codes"][limit])


def run_program(cfg: dict) -> None:
    """In the forked child: limits, hook, then main.py; ends the process like Python would."""
    os.close(cfg["status_fd"])  # only the reaper reports the exit status
    set_dumpable(True)  # its own /proc entries as usual; the reaper stays non-dumpable
    set_program_limits(cfg)
    user_main = types.ModuleType("__main__")
    sys.modules["__main__"] = user_main  # the program never sees this module's globals by name
    if cfg["audit_hook"]:
        sys.addaudithook(make_guard(cfg))
    try:
        with open("main.py", encoding="utf-8", errors="replace") as f:
            code = compile(f.read(), "main.py", "exec")
        exec(code, user_main.__dict__)
    except MemoryError:
        stop_for(cfg, "memory", "allocation failed (MemoryError)")
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the program's own failure: print it like Python would
        import traceback  # only on failure: one import less on every call's start-up

        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        sys.exit(1)
    sys.exit(0)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    set_dumpable(False)  # before the fork: the program never sees a dumpable reaper
    set_process_limit(cfg)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        run_program(cfg)  # never returns: SystemExit ends the child
    _, status, _ = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os.write(cfg["status_fd"], json.dumps({"exit_code": code}).encode())
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
