"""The sandbox against one attack each: every test names the limit that must stop the program, which
also says it was stopped there and then, not by the wall-clock limit (no bound in seconds: the suite
passes on a busy machine). The labelled limits come from the audit hook (the tripwire);
test_sandbox_escapes.py shows the operating system holds with the hook switched off."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from routerops.workers.sandbox import SandboxLimits, run_python, sandbox_problem

pytestmark = pytest.mark.skipif(sandbox_problem() is not None, reason=f"no OS sandbox here: {sandbox_problem()}")
FAST = SandboxLimits(cpu_s=1, wall_s=5.0, memory_mb=256, output_bytes=100_000)


def test_benign_program_runs_and_its_temp_dir_is_removed(tmp_path):
    code = (
        "import json, math, os\n"
        "open('note.txt', 'w').write('kept in the sandbox')\n"
        "print(json.dumps({'sum': sum(range(10)), 'fact': math.factorial(5), 'note': open('note.txt').read()}))\n"
        "print(os.getcwd())\n"
    )
    result = run_python(code, FAST)
    assert result.limit is None and result.exit_code == 0, result.stderr
    first, cwd = result.stdout.splitlines()
    assert first == '{"sum": 45, "fact": 120, "note": "kept in the sandbox"}'
    assert cwd.startswith("/") and not __import__("os").path.exists(cwd)  # removed afterwards


def test_python_exception_is_an_ordinary_failure():
    result = run_python("print('before')\n1/0\n", FAST)
    assert result.limit is None and result.exit_code == 1
    assert result.stdout == "before\n" and "ZeroDivisionError" in result.stderr


def test_reading_etc_passwd_is_stopped_by_the_filesystem_limit():
    result = run_python("print(open('/etc/passwd').read())", FAST)
    assert result.limit == "filesystem" and "root:" not in result.stdout


def test_relative_path_escape_is_stopped_by_the_filesystem_limit():
    result = run_python("print(open('../../../../etc/hostname').read())", FAST)
    assert result.limit == "filesystem" and result.stdout == ""


def test_writing_outside_the_temp_dir_is_stopped(tmp_path):
    target = tmp_path / "escaped.txt"
    result = run_python(f"open({str(target)!r}, 'w').write('x')", FAST)
    # /tmp inside the sandbox is its own tmpfs, where the host's tmp_path does not exist
    assert result.exit_code == 1 and "FileNotFoundError" in result.stderr and not target.exists()
    result = run_python(f"open({str(Path.home() / 'escaped.txt')!r}, 'w').write('x')", FAST)
    assert result.limit == "filesystem" and not (Path.home() / "escaped.txt").exists()


def test_symlink_out_of_the_temp_dir_is_stopped():
    result = run_python("import os\nos.symlink('/etc/passwd', 'p')\nprint(open('p').read())", FAST)
    assert result.limit == "filesystem" and "root:" not in result.stdout


def test_opening_a_socket_is_stopped_by_the_network_limit():
    result = run_python("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))", FAST)
    assert result.limit == "network"


def test_fork_bomb_is_stopped_by_the_process_limit():
    result = run_python("import os\nwhile True:\n    os.fork()", FAST)
    assert result.limit == "processes"


def test_subprocess_is_stopped_by_the_process_limit(tmp_path):
    marker = tmp_path / "ran"
    result = run_python(f"import subprocess\nsubprocess.run(['touch', {str(marker)!r}])", FAST)
    assert result.limit == "processes" and not marker.exists()


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="_posixsubprocess.fork_exec signature of 3.11")
def test_spawn_past_the_audit_hook_is_refused_by_the_process_limit():
    # _posixsubprocess.fork_exec raises no audit event: RLIMIT_NPROC refuses the fork itself.
    code = (
        "import _posixsubprocess, os, time\n"
        "r, w = os.pipe()\n"
        "_posixsubprocess.fork_exec([b'/bin/sleep', b'30'], [b'/bin/sleep'], True, (w,), None, None,"
        " -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)\n"
        "time.sleep(4)\n"
        "print('survived')\n"
    )
    result = run_python(code, FAST)
    assert result.exit_code == 1 and "BlockingIOError" in result.stderr and "survived" not in result.stdout
    assert result.limit != "wall_time"  # stopped where it tried, not left to run out the clock


def test_ctypes_foreign_calls_are_refused():
    result = run_python("import ctypes\nctypes.CDLL(None).fork()", FAST)
    assert result.exit_code == 1 and "ctypes.dlsym is not available" in result.stderr


def test_allocating_4gb_is_stopped_by_the_memory_limit():
    result = run_python("x = bytearray(4 * 1024**3)\nprint('allocated')", FAST)
    assert result.limit == "memory" and "allocated" not in result.stdout


@pytest.mark.slow
def test_infinite_loop_is_stopped_by_the_cpu_limit():
    result = run_python("while True:\n    pass", SandboxLimits(cpu_s=1, wall_s=10.0))
    assert result.limit == "cpu_time"
    # SIGXCPU at 1 s of CPU, SIGKILL at 2 s (wall time depends on load; wait4's count, under load, too)
    assert 0.5 <= result.cpu_s <= 2.5


@pytest.mark.slow
def test_sleeping_forever_is_stopped_by_the_wall_clock_limit():
    result = run_python("import time\ntime.sleep(60)", SandboxLimits(cpu_s=5, wall_s=1.0))
    assert result.limit == "wall_time" and result.exit_code < 0
    # Not before the limit; the upper bound only says it was not left to sleep its 60 s (any load).
    assert 1.0 <= result.duration_s < 30


def test_printing_100mb_is_stopped_by_the_output_limit():
    result = run_python("print('x' * 100_000_000)", FAST)
    assert result.limit == "output"
    assert len(result.stdout) <= FAST.output_bytes
    assert result.duration_s < 3.0


@pytest.mark.parametrize(
    "attack",
    [
        # patch what a naive hook would call to resolve the path
        "import os, posixpath\nposixpath.realpath = os.path.realpath = lambda p, **k: os.getcwd() + '/x'\n"
        "os.lstat = lambda p: None\nprint(open('/etc/passwd').read())",
        "import builtins\nbuiltins.isinstance = lambda *a: False\nbuiltins.str = bytes\n"
        "print(open('/etc/passwd').read())",
        # walk up to the child's module and wipe its globals
        "import sys\nsys._getframe().f_back.f_globals.clear()\nprint(open('/etc/passwd').read())",
        # a directory fd to escape a relative path
        "import os\nfd = os.open('.', os.O_RDONLY)\nos.mkdir('../../escaped-by-dirfd', dir_fd=fd)",
    ],
)
def test_tampering_with_the_interpreter_does_not_lift_the_filesystem_limit(attack):
    result = run_python(attack, FAST)
    assert result.limit == "filesystem" and "root:" not in result.stdout, result.stderr


def test_introspection_that_reaches_the_hook_is_refused():
    result = run_python("import gc\nprint(len(gc.get_objects()))", FAST)
    assert result.exit_code == 1 and "gc.get_objects is not available" in result.stderr


def test_the_audit_hook_looks_up_no_global_or_builtin_names():
    # Code in the sandbox can patch builtins and the child's globals; the hook must only use closures.
    import dis
    import types

    from routerops.workers import _sandbox_child
    from routerops.workers.sandbox import CHILD_SCRIPT, LIMIT_EXIT_CODES

    cfg = {"limit_exit_codes": LIMIT_EXIT_CODES, "read_roots": ["/opt/python/lib"], "child_script": str(CHILD_SCRIPT)}
    hook = _sandbox_child.make_guard(cfg)
    functions, codes, todo = set(), set(), [hook]
    while todo:  # the hook and every Python function reachable through closures
        fn = todo.pop()
        if fn in functions:
            continue
        functions.add(fn)
        todo += [c.cell_contents for c in fn.__closure__ or () if isinstance(c.cell_contents, types.FunctionType)]
        stack = [fn.__code__]
        while stack:  # plus the code of comprehensions nested in them
            code = stack.pop()
            codes.add(code)
            stack += [const for const in code.co_consts if isinstance(const, types.CodeType)]
    for code in codes:
        names = [i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")]
        assert names == [], f"{code.co_name} looks up {names}"
    assert {f.__name__ for f in functions} >= {"hook", "check_path", "check_args", "resolve", "inside", "stop"}
