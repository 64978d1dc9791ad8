"""The sandbox's root filesystem: a directory holding only the interpreter, its standard library, the
packages model-written code may import (ALLOWED_PACKAGES) and the shared libraries these link.

bubblewrap mounts it read-only as `/`, so nothing else of the host exists inside: no /etc, /root,
/home, repository or virtual environment, not even for stat(). It is built once per interpreter and
package versions (hard links where the filesystem allows, copies otherwise) under `image_cache()`,
atomically (built aside, then renamed), so concurrent pipelines share it and never see half of one.

Why a copy and not bind mounts of the host paths: when the pipeline runs as root the sandbox runs as
an unprivileged uid, which cannot even traverse /root (where pyenv, or a clone of the repository,
often keeps the interpreter and the venv); the image lives where that uid can read it.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

# What model-written code may import besides the standard library (present ones only).
ALLOWED_PACKAGES = ("numpy", "sympy", "mpmath", "scipy")
IMAGE_FORMAT = 1  # bump when the layout below changes: a new key, so a new image

# Paths inside the sandbox.
PYTHON_HOME = "/opt/python"
WORKDIR = "/sandbox"  # the program's private, size-limited tmpfs
CHILD_PATH = "/opt/routerops/child.py"  # mount point for _sandbox_child.py
MOUNT_POINTS = ("proc", "dev", WORKDIR.lstrip("/"))

# Standard-library parts no computation needs: tests, GUIs, installers, the static libpython.
_STDLIB_SKIPPED = ("site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
                   "config-*", "_tkinter*", "nis.*", "readline.*", "_curses*")


@dataclass(frozen=True)
class RuntimeImage:
    root: Path  # host directory mounted read-only as /
    python: str  # interpreter, inside the sandbox
    read_roots: tuple[str, ...]  # stdlib and site-packages, inside the sandbox (for the audit hook)
    library_path: str  # LD_LIBRARY_PATH inside the sandbox (libpython and the linked libraries)


def image_cache() -> Path:
    """ROUTEROPS_SANDBOX_CACHE, else a root-owned system cache (root) or the user's cache."""
    if os.environ.get("ROUTEROPS_SANDBOX_CACHE"):
        return Path(os.environ["ROUTEROPS_SANDBOX_CACHE"])
    if os.geteuid() == 0:  # readable by the sandbox's unprivileged uid, writable by root only
        return Path("/var/cache/routerops-sandbox")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "routerops" / "sandbox"


@functools.cache
def runtime_image(cache: Path | None = None) -> RuntimeImage:
    """The image for this interpreter and package set, built on first use."""
    cache = cache or image_cache()
    python_version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = f"{PYTHON_HOME}/lib/{python_version}"
    root = cache / f"python-{sys.version_info.major}.{sys.version_info.minor}-{_image_key()}"
    if not root.is_dir():
        _build_image(root)
    return RuntimeImage(root=root, python=f"{PYTHON_HOME}/bin/{_base_executable().name}",
                        read_roots=(stdlib, f"{stdlib}/site-packages"), library_path=f"{PYTHON_HOME}/lib")


def _base_executable() -> Path:
    """The interpreter binary itself (a venv's python is a link to it)."""
    return Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))


def _allowed_packages() -> dict[str, list[Path]]:
    """name -> [package dir, its bundled libraries (name.libs), its dist-info] for installed ones."""
    found = {}
    for name in ALLOWED_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        package = Path(list(spec.submodule_search_locations)[0])
        dist_info = glob.glob(str(package.with_name(f"{name}-*.dist-info")))
        extras = [package.with_name(f"{name}.libs"), *map(Path, dist_info)]
        found[name] = [package, *[p for p in extras if p.is_dir()]]
    return found


def _image_key() -> str:
    """Changes when the interpreter, a package version or the image layout changes."""
    exe = _base_executable()
    versions = {}
    for name, dirs in _allowed_packages().items():
        try:
            versions[name] = [importlib.metadata.version(name), str(dirs[0])]
        except importlib.metadata.PackageNotFoundError:
            versions[name] = ["unknown", str(dirs[0])]
    stat = exe.stat()
    blob = json.dumps([IMAGE_FORMAT, sys.version, str(exe), stat.st_size, stat.st_mtime_ns, versions], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _build_image(root: Path) -> None:
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root.parent))
    try:
        _populate(staging)
        os.chmod(staging, 0o755)  # mkdtemp made it private; the sandbox uid must read it
        try:
            os.rename(staging, root)
        except OSError:  # another process finished the same image first: use theirs
            if not root.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _populate(staging: Path) -> None:
    exe = _base_executable()
    home = staging / PYTHON_HOME.lstrip("/")
    lib = home / "lib"
    stdlib = lib / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (home / "bin").mkdir(parents=True)
    _link_or_copy(exe, home / "bin" / exe.name)
    shutil.copytree(sysconfig.get_path("stdlib"), stdlib, ignore=shutil.ignore_patterns(*_STDLIB_SKIPPED),
                    copy_function=_link_or_copy, ignore_dangling_symlinks=True)
    dynload = sysconfig.get_config_var("DESTSHARED")  # lib-dynload; outside the stdlib dir on some distros
    if dynload and not (stdlib / "lib-dynload").exists():
        shutil.copytree(dynload, stdlib / "lib-dynload", ignore=shutil.ignore_patterns(*_STDLIB_SKIPPED),
                        copy_function=_link_or_copy, ignore_dangling_symlinks=True)
    site = stdlib / "site-packages"
    site.mkdir()
    package_dirs = [d for dirs in _allowed_packages().values() for d in dirs]
    for source in package_dirs:
        shutil.copytree(source, site / source.name, copy_function=_link_or_copy, ignore_dangling_symlinks=True)
    _copy_linked_libraries(staging, lib, [exe, *sorted(staging.rglob("*.so*"))])
    for mount_point in MOUNT_POINTS:
        (staging / mount_point).mkdir()
    (staging / "tmp").symlink_to(WORKDIR)  # programs that write to /tmp write to their own tmpfs
    child = staging / CHILD_PATH.lstrip("/")
    child.parent.mkdir(parents=True)
    child.touch()


def _copy_linked_libraries(staging: Path, lib: Path, objects: list[Path]) -> None:
    """Every shared library the objects link (their ldd closure) into `lib`, the dynamic loader at its
    own path; libraries already in the image (numpy.libs..., found through $ORIGIN rpaths) stay put."""
    libraries, loaders = _ldd_closure(objects)
    inside = str(staging) + "/"
    for name, path in libraries.items():
        real = os.path.realpath(path)
        if not real.startswith(inside) and not (lib / name).exists():
            _link_or_copy(real, lib / name)
    # glibc dlopens libgcc_s for thread cancellation and unwinding; it is in no DT_NEEDED list.
    libc_dir = Path(libraries.get("libc.so.6", "/nonexistent")).parent
    if (libc_dir / "libgcc_s.so.1").exists() and not (lib / "libgcc_s.so.1").exists():
        _link_or_copy(os.path.realpath(libc_dir / "libgcc_s.so.1"), lib / "libgcc_s.so.1")
    for loader in loaders:
        target = staging / loader.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(os.path.realpath(loader), target)


def _ldd_closure(objects: list[Path]) -> tuple[dict[str, str], set[str]]:
    """({soname: host path}, {dynamic loader paths}) from `ldd` (which resolves the whole closure)."""
    libraries: dict[str, str] = {}
    loaders: set[str] = set()
    for start in range(0, len(objects), 200):
        batch = [str(p) for p in objects[start:start + 200]]
        out = subprocess.run(["ldd", *batch], capture_output=True, text=True, env={"LC_ALL": "C"}).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
                libraries.setdefault(parts[0], parts[2])
            elif len(parts) == 2 and parts[0].startswith("/") and parts[1].startswith("(0x"):
                loaders.add(parts[0])
    if not loaders:
        raise OSError("ldd found no dynamic loader for the interpreter; is `ldd` (libc-bin) installed?")
    return libraries, loaders


def _link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Hard link (instant, no space) where allowed, else a copy that keeps the mode and times."""
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or protected_hardlinks for a file we do not own
        shutil.copy2(src, dst)
