"""The isolation backend of the Python sandbox: bubblewrap (`bwrap`) with a seccomp filter.

`bwrap_command` builds the command line that runs one program: its own user, mount, PID, IPC, UTS,
network and cgroup namespaces; the runtime image (sandbox_image.py) read-only as `/`; a fresh
size-limited tmpfs as the working directory and a sized /dev/shm as the only writable places (/dev
read-only; seccomp refuses SysV shared memory and memfds, memory no size limits); /proc of its own
PID namespace, where the child script is pid 1, non-dumpable (the kernel delivers no signal to it
that it has no handler for, so the program cannot kill its reaper, and when it ends every process of
the namespace ends); a clean environment;
no capabilities, no new privileges, no nested user namespaces; and the seccomp filter below. When the
pipeline runs as root, bwrap itself runs as an unprivileged uid (SANDBOX_UID), so even the host sees
the program as `nobody`.

`sandbox_problem()` says why code cannot run here (no bwrap, no libseccomp, no user namespaces...),
naming what to install; None when a probe program ran and printed what it should.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass

from routerops.errors import RouteropsError
from routerops.workers.sandbox_image import CHILD_PATH, WORKDIR, RuntimeImage, runtime_image

SANDBOX_UID = SANDBOX_GID = 65534  # nobody / nogroup: what a root pipeline runs the sandbox as
MIN_BWRAP = (0, 8)
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`; Fedora: "
                "`dnf install bubblewrap`), or run `make install`, which does it on Debian")

# Syscalls Python and its allowed packages never need and that widen the kernel surface a program can
# attack, or would undo the isolation (Docker's and Flatpak's default profiles deny the same ones).
DENIED_SYSCALLS = (
    # namespaces, mounts and root changes: the sandbox's own must stay as they are
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    # other processes' memory and descriptors
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "process_madvise",
    # kernel interfaces with a record of privilege escalations
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "open_by_handle_at", "name_to_handle_at", "fanotify_init",
    # memory outside every limit (issue 25): SysV shared memory segments and message queues outlive
    # the detach that took them out of RLIMIT_AS, and a memfd is a tmpfs file of the kernel's own
    # mount, outside the sized ones (/dev/shm is the bounded way to share memory)
    "shmget", "msgget", "memfd_create", "memfd_secret",
    # the machine's state
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "acct", "syslog", "quotactl", "quotactl_fd", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "sethostname", "setdomainname", "iopl", "ioperm", "vhangup", "uselib", "lookup_dcookie",
)
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
TIOCSTI, TIOCLINUX = 0x5412, 0x541C  # push input into / control a terminal
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")  # tmpfs rounds its size up to whole pages


class SandboxUnavailable(RouteropsError):
    """The isolation backend cannot start here: the code primitive refuses to run anything."""


@dataclass(frozen=True)
class Backend:
    bwrap: str
    image: RuntimeImage
    seccomp: bytes  # compiled BPF program, as bwrap's --seccomp reads it
    run_as: tuple[int, int] | None  # (uid, gid) bwrap runs as; None: as the pipeline's own user
    setpriv: str | None  # util-linux setpriv, to kill bwrap when the pipeline dies
    unshare: str  # util-linux unshare and mount: they mount the sandbox's tmpfs with an inode cap (bwrap cannot)
    mount: str
    mount_points: tuple[str, str]  # empty host directories the (working directory, /dev/shm) tmpfs mount on


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def build_backend(bwrap: str) -> Backend:
    """Everything but the probe: raises SandboxUnavailable naming what is missing."""
    _check_version(bwrap)
    image = _image()
    return Backend(bwrap=bwrap, image=image, seccomp=seccomp_program(),
                   run_as=(SANDBOX_UID, SANDBOX_GID) if os.geteuid() == 0 else None,
                   setpriv=_setpriv_with_pdeathsig(), unshare=_require("unshare"), mount=_require("mount"),
                   mount_points=_mount_points(image))


def _require(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise SandboxUnavailable(f"util-linux's `{tool}` is needed to cap the sandbox's tmpfs inodes "
                                 "(Debian/Ubuntu: `apt-get install -y util-linux mount`)")
    return found


def _mount_points(image: RuntimeImage) -> tuple[str, str]:
    """Two empty directories beside the image, readable by the sandbox's uid: the tmpfs mounts on them
    exist only in the sandbox's own mount namespace, so one pair serves every concurrent sandbox."""
    base = image.root.parent / "mounts"
    points = (base / "work", base / "shm")
    try:
        for point in points:
            point.mkdir(parents=True, exist_ok=True)
            point.chmod(0o755)
        base.chmod(0o755)
    except OSError as exc:
        raise SandboxUnavailable(f"cannot create the sandbox's mount points under {base}: {exc}") from exc
    return str(points[0]), str(points[1])


def _check_version(bwrap: str) -> None:
    """--disable-userns and a size-limited --tmpfs (--size) came with bubblewrap 0.8."""
    try:
        said = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout
        version = tuple(int(part) for part in said.split()[-1].split(".")[:2])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise SandboxUnavailable(f"cannot run {bwrap} --version ({exc}): {INSTALL_HINT}") from exc
    if version < MIN_BWRAP:
        raise SandboxUnavailable(f"bubblewrap {'.'.join(map(str, MIN_BWRAP))} or newer is needed, {bwrap} is "
                                 f"{said.strip()}: install a newer one (Debian 12 and Ubuntu 24.04 ship 0.8+)")


def _setpriv_with_pdeathsig() -> str | None:
    """util-linux setpriv, when it can set a parent-death signal (2.33+); the sandbox works without."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    try:
        usage = subprocess.run([setpriv, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return setpriv if "--pdeathsig" in usage else None


def _image() -> RuntimeImage:
    try:
        return runtime_image()
    except (OSError, ValueError) as exc:  # ldd missing, cache not writable...
        raise SandboxUnavailable(f"cannot build the sandbox's runtime image: {exc}") from exc


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes:
    """DENIED_SYSCALLS fail with EPERM, namespace-creating clone() too; clone3 says ENOSYS (its flags
    are out of a filter's reach, and glibc then falls back to clone); sockets other than AF_UNIX say
    EAFNOSUPPORT; a foreign architecture's syscall ABI kills the process (libseccomp's default)."""
    try:
        import pyseccomp as seccomp
    except ImportError as exc:
        raise SandboxUnavailable(f"the seccomp bindings are missing ({exc}): `pip install pyseccomp`") from exc
    except RuntimeError as exc:  # pyseccomp raises it when libseccomp.so.2 cannot be found
        raise SandboxUnavailable(f"libseccomp is missing ({exc}): `apt-get install -y libseccomp2`") from exc
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) >= 0:  # negative: not on this architecture
            rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
    for flag in CLONE_NAMESPACE_FLAGS:
        rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.NE, socket.AF_UNIX))
    for request in (TIOCSTI, TIOCLINUX):
        rules.add_rule(seccomp.ERRNO(errno.EPERM), "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
    with tempfile.TemporaryFile() as out:
        rules.export_bpf(out)
        out.seek(0)
        return out.read()


def memfd_with(data: bytes, name: str) -> int:
    """An anonymous file holding `data`, positioned at its start (bwrap reads it from there)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def sandbox_env(image: RuntimeImage) -> dict[str, str]:
    """The whole environment the program sees: nothing of the pipeline's (API keys live there)."""
    # One BLAS/OpenMP thread: threads count against the process limit and would share the CPU limit.
    env = {"PATH": f"{os.path.dirname(image.python)}", "HOME": WORKDIR, "TMPDIR": WORKDIR, "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8", "LD_LIBRARY_PATH": image.library_path}
    env.update({k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    return env


# Run by `sh` in a user and mount namespace of its own (util-linux unshare), before bwrap: mounts the
# working directory's and /dev/shm's tmpfs with a size AND an inode count, then runs bwrap, which
# binds them. bwrap's own --tmpfs takes only --size: 121,788 empty files fit in a 64 MB sandbox and
# grew the host's kernel slab by 121 MB (issue 42 item 6); each tmpfs inode costs ~1 KB of it.
MOUNT_SCRIPT = '"$1" -t tmpfs -o "$4" tmpfs "$2" && "$1" -t tmpfs -o "$5" tmpfs "$3" && shift 5 && exec "$@"'


def tmpfs_prefix(backend: Backend, workdir_bytes: int, shm_bytes: int, files: int) -> list[str]:
    """The command that mounts both sized tmpfs and then runs the rest of the command line (bwrap)."""
    work, shm = backend.mount_points
    return [backend.unshare, "--user", "--map-root-user", "--mount", "--propagation", "private", "--",
            "/bin/sh", "-c", MOUNT_SCRIPT, "sh", backend.mount, work, shm,
            f"size={workdir_bytes},nr_inodes={files},mode=0700", f"size={shm_bytes},nr_inodes={files},mode=1777"]


def bwrap_command(backend: Backend, fds: dict[str, int], workdir_bytes: int, argv: list[str], *,
                  shm_bytes: int, files: int = 4096) -> list[str]:
    """fds: 'seccomp', 'child' (the child script), 'program' (main.py), 'info' (bwrap's JSON status).

    Every writable mount has a size (bubblewrap and nsjail practice: no tmpfs at the kernel's default,
    half of RAM, outside the memory limit): the working directory holds workdir_bytes, /dev/shm (POSIX
    shared memory, multiprocessing's semaphores) holds shm_bytes, and /dev itself, a tmpfs bubblewrap
    fills with device nodes and cannot size, is remounted read-only once /dev/shm is mounted in it.
    Each also holds at most `files` inodes (files, directories, links: tmpfs_prefix mounts them).
    A size or inode count of 0 would mean no limit to tmpfs: sizes must be at least one page, and
    `files` at least 2 (the tmpfs root and main.py)."""
    if min(workdir_bytes, shm_bytes) < PAGE_BYTES:
        raise ValueError(f"tmpfs sizes must be at least {PAGE_BYTES} bytes (0 is unlimited to tmpfs), got "
                         f"{workdir_bytes} and {shm_bytes}")
    if files < 2:
        raise ValueError(f"the sandbox's tmpfs needs at least 2 inodes (0 is unlimited to tmpfs), got {files}")
    image = backend.image
    cmd = [backend.setpriv, "--pdeathsig", "KILL", "--"] if backend.setpriv else []
    cmd += tmpfs_prefix(backend, workdir_bytes, shm_bytes, files)
    cmd += [backend.bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--hostname", "sandbox",
            "--die-with-parent", "--new-session", "--as-pid-1", "--clearenv"]
    for key, value in sandbox_env(image).items():
        cmd += ["--setenv", key, value]
    cmd += ["--ro-bind", str(image.root), "/", "--proc", "/proc", "--dev", "/dev",
            "--bind", backend.mount_points[1], "/dev/shm", "--remount-ro", "/dev",
            "--bind", backend.mount_points[0], WORKDIR,
            "--ro-bind-data", str(fds["child"]), CHILD_PATH, "--file", str(fds["program"]), f"{WORKDIR}/main.py",
            "--chdir", WORKDIR, "--seccomp", str(fds["seccomp"]), "--info-fd", str(fds["info"]), "--", *argv]
    return cmd
