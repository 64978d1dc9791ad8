"""Issue 25's sandbox findings, each run with the audit hook switched off (only the operating system
and the parent's supervision are left): every writable mount has a size inside the disk limit, the
limit a result names comes from what the parent observed itself, and the reaper (the sandbox's pid 1,
the same uid as the program) cannot be written from inside. Each test failed before its fix."""

from __future__ import annotations

import pytest

from routerops.workers.sandbox import LIMIT_NAMES, SandboxLimits, run_python, sandbox_problem

pytestmark = pytest.mark.skipif(sandbox_problem() is not None, reason=f"no OS sandbox here: {sandbox_problem()}")

LIMITS = SandboxLimits(cpu_s=2, wall_s=6.0, memory_mb=256, output_bytes=100_000)
MB = 1_000_000


def _filled(result, label: str) -> tuple[int, str]:
    """(bytes written, how it ended) from a line `label <bytes> <errno or 'done'>`."""
    line = next((x for x in result.stdout.splitlines() if x.startswith(label + " ")), None)
    assert line, f"{label!r} never ran:\n{result.stdout}\n{result.stderr}"
    _, written, ended = line.split()
    return int(written), ended


FILL = """
import os
def fill(label, folder, total):
    written, ended = 0, 'done'
    try:
        for i in range(total // 1_000_000):  # 1 MB files: RLIMIT_FSIZE (file_bytes) never stops it
            with open(f'{folder}/fill{i}', 'wb') as f:
                written += f.write(b'x' * 1_000_000)
                f.flush()
    except OSError as exc:
        ended = str(exc.errno)
    print(label, written, ended, flush=True)
"""


def test_every_writable_mount_stops_within_the_disk_limit():
    """/dev and /dev/shm were tmpfs mounts of the kernel's default size (half of RAM): 180 MB went
    into each while /sandbox stopped at 64 MB. Now /dev is read-only and /dev/shm is sized, and the
    working directory and /dev/shm together hold at most disk_bytes."""
    limits = SandboxLimits(cpu_s=4, wall_s=10.0, memory_mb=256, disk_bytes=16 * MB, shm_bytes=4 * MB)
    result = run_python(FILL + """
fill('dev', '/dev', 40_000_000)
fill('shm', '/dev/shm', 40_000_000)
fill('sandbox', '.', 40_000_000)
print('mounts', sorted(line.split()[1] for line in open('/proc/self/mounts') if ' rw,' in line), flush=True)
""", limits, audit_hook=False)
    dev, dev_end = _filled(result, "dev")
    shm, shm_end = _filled(result, "shm")
    sandbox, sandbox_end = _filled(result, "sandbox")
    assert (dev, dev_end) == (0, "30"), result.stdout  # EROFS: /dev holds device nodes only
    assert shm_end == "28" and shm <= limits.shm_bytes  # ENOSPC at its size
    assert sandbox_end == "28" and shm + sandbox <= limits.disk_bytes  # the two share disk_bytes
    assert sandbox >= limits.disk_bytes - limits.shm_bytes - 2 * MB  # and the working directory keeps the rest
    mounts = next(x for x in result.stdout.splitlines() if x.startswith("mounts "))
    # Every read-write mount left is a sized tmpfs (or not storage at all: devices, devpts, proc).
    assert "'/sandbox'" in mounts and "'/dev/shm'" in mounts and "'/dev'," not in mounts


@pytest.mark.parametrize(("name", "exit_code"), [("network", 0), ("memory", 1)])
def test_a_program_cannot_forge_the_limit_report(name, exit_code):
    """The limit travelled on a descriptor the program inherited: writing `network` to it made a clean
    exit read limit='network'. Now no descriptor of the program reaches the parent but stdout and
    stderr, and /proc/1/fd (the reaper's status pipe) is closed to it."""
    assert name in LIMIT_NAMES
    result = run_python(f"""
import os, sys, json
forged = []
for fd in range(3, 1024):
    try:
        os.write(fd, {name!r}.encode())
        forged.append(fd)
    except OSError:
        pass
for entry in ('/proc/1/fd', '/proc/self/fd'):
    try:
        fds = os.listdir(entry)
    except OSError:
        continue
    for fd in fds:
        for payload in ({name!r}.encode(), json.dumps({{'exit_code': -9, 'cpu_s': 999.0}}).encode()):
            try:
                with open(f'{{entry}}/{{fd}}', 'wb', buffering=0) as f:
                    f.write(payload)
                forged.append(entry + '/' + fd)
            except OSError:
                pass
print('forged', sorted(set(map(str, forged))), flush=True)
sys.exit({exit_code})
""", LIMITS, audit_hook=False)
    assert "forged" in result.stdout, result.stderr
    assert result.exit_code == exit_code and result.limit is None, (result.stdout, result.stderr)


def test_the_reapers_memory_and_descriptors_are_out_of_reach():
    """With the guard off the program could open /proc/1/mem read-write: the reaper that enforces the
    limits was the program's to rewrite. The reaper is non-dumpable now."""
    result = run_python("""
import os
def attempt(label, action):
    try:
        print(label, '->', repr(action()), flush=True)
    except OSError as exc:
        print(label, '-> refused', type(exc).__name__, exc.errno, flush=True)
attempt('mem', lambda: open('/proc/1/mem', 'r+b', buffering=0).close())
attempt('mem-read', lambda: open('/proc/1/mem', 'rb', buffering=0).close())
attempt('fds', lambda: os.listdir('/proc/1/fd'))
attempt('environ', lambda: open('/proc/1/environ', 'rb').read())
attempt('own-fds', lambda: len(os.listdir('/proc/self/fd')) > 0)
""", LIMITS, audit_hook=False)
    said = dict(line.split(" -> ", 1) for line in result.stdout.splitlines() if " -> " in line)
    assert said["mem"] == "refused PermissionError 13", result.stdout + result.stderr
    assert said["mem-read"] == "refused PermissionError 13"
    assert said["fds"] == "refused PermissionError 13"
    assert said["environ"] == "refused PermissionError 13"
    assert said["own-fds"] == "True"  # the program itself is dumpable as usual: its own /proc works
    assert result.exit_code == 0 and result.limit is None


def test_the_tripwire_still_names_its_limit_by_exit_status():
    """The labels the audit hook gave still reach the result, now as the exit status the parent saw."""
    result = run_python("import socket\nsocket.socket()", LIMITS)
    assert result.limit == "network" and "network limit" in result.stderr


def test_no_shared_memory_outside_the_sized_mounts():
    """With the guard off, SysV segments (kept after shmdt, out of RLIMIT_AS) and memfds (files of the
    kernel's internal tmpfs) held 200 MB each past a 256 MB memory limit; seccomp refuses them now."""
    result = run_python("""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def attempt(label, ret):
    print(label, ret if ret >= 0 else -ctypes.get_errno(), flush=True)
attempt('shmget', libc.shmget(0, ctypes.c_size_t(20_000_000), 0o1600))
attempt('msgget', libc.msgget(0, 0o1600))
try:
    print('memfd', os.memfd_create('x'), flush=True)
except OSError as exc:
    print('memfd', -exc.errno, flush=True)
""", LIMITS, audit_hook=False)
    said = dict(line.split() for line in result.stdout.splitlines())
    assert said == {"shmget": "-1", "msgget": "-1", "memfd": "-1"}, result.stdout + result.stderr  # EPERM


def test_the_number_of_files_stops_at_the_inode_cap():
    """Issue 42 item 6: 121,788 empty files were created in 9 s in the 64 MB sandbox (the size limit
    counts bytes, not inodes) and the host's kernel slab grew by 121 MB. Each writable tmpfs now holds
    at most `files` inodes: the working directory's root and main.py take two, /dev/shm's root one."""
    limits = SandboxLimits(cpu_s=4, wall_s=10.0, memory_mb=256)
    result = run_python("""
import os
def create(label, folder, most):
    made, ended = 0, 'done'
    try:
        for i in range(most):
            os.close(os.open(f'{folder}/e{i}', os.O_CREAT | os.O_WRONLY, 0o600))
            made += 1
    except OSError as exc:
        ended = str(exc.errno)
    print(label, made, ended, flush=True)
create('sandbox', '.', 20_000)
create('shm', '/dev/shm', 20_000)
""", limits, audit_hook=False)
    assert _filled(result, "sandbox") == (limits.files - 2, "28"), result.stdout  # ENOSPC at the cap
    assert _filled(result, "shm") == (limits.files - 1, "28"), result.stdout
