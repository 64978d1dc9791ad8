"""Hostile-client probes of the gateway (issue 25's gateway section, rerun and extended): each probe is
one attempt to dodge a budget, draw a 500 / a traceback, or break a connection; it *holds* when the
gateway answers as it should (the expected status with an OpenAI-format error body, or a charge that
equals what the worker billed and stays within its reservation, or the budget kept). Counts and each
probe's outcome are written as JSON.

Setup (tests/gateway/test_hardening.py's): a live gateway (uvicorn in a thread) over a fitted router,
every LLM worker at a real endpoint that bills one prompt token per byte of every string it is sent
plus 20,000 tokens per image part.

    python benchmarks/gateway_probes.py [--out benchmarks/results/gateway_probes.json]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

spec = importlib.util.spec_from_file_location("hardening", ROOT / "tests" / "gateway" / "test_hardening.py")
H = importlib.util.module_from_spec(spec)
spec.loader.exec_module(H)
TEXT, IMAGE = H.TEXT, H.IMAGE
BIG = "x" * 6000


def is_error(r: httpx.Response, status: int) -> bool:
    try:
        error = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return r.status_code == status and set(error) == {"message", "type", "param", "code"}


def refused(s, r: httpx.Response, status: int = 400) -> bool:
    """The expected error, and the worker never called, nothing charged."""
    return is_error(r, status) and s.endpoint.requests == 0 and s.spent() == 0.0


def within(s, r: httpx.Response) -> bool:
    """Answered, charged what the worker billed, and that within the reservation."""
    if r.status_code != 200:
        return False
    routed = r.json()["routerops"]
    billed = H.billed_cost(s.endpoint.received[-1], routed["worker"])
    return abs(routed["cost_usd"] - billed) <= 1e-12 + 1e-9 * billed and billed <= routed["worst_cost_usd"]


def attempt(probe, *args) -> bool:
    """A probe's verdict; an exception in the client (a dropped connection, a body that is not JSON) is
    a probe that did not hold."""
    try:
        return bool(probe(*args))
    except Exception as exc:  # noqa: BLE001
        print(f"probe raised {type(exc).__name__}: {exc}"[:300], file=sys.stderr)
        return False


def budget_probes(router, tmp: Path) -> dict[str, bool]:
    text_only = {
        "image_url part, no worker accepts images": lambda s: refused(s, s.chat(IMAGE)),
        "content as an object": lambda s: refused(s, s.chat([{"role": "user", "content": {"type": "text", "text": BIG}}])),
        "input_audio part": lambda s: refused(s, s.chat([{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}])),
        "file part": lambda s: refused(s, s.chat([{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}])),
        "unknown part type": lambda s: refused(s, s.chat([{"role": "user", "content": [{"type": "video", "video": BIG}]}])),
        "image part in a system message": lambda s: refused(s, s.chat([{"role": "system", "content": IMAGE[0]["content"]},
                                                                         *TEXT])),
        "tools, no worker accepts tools": lambda s: refused(s, s.chat(TEXT, tools=[
            {"type": "function", "function": {"name": "f", "description": BIG}}])),
        "text parts": lambda s: within(s, s.chat([{"role": "user", "content": [{"type": "text", "text": BIG}] * 3}])),
        "name field": lambda s: within(s, s.chat([{"role": "user", "name": BIG, "content": "hi"}])),
        "unknown message field": lambda s: within(s, s.chat([{"role": "user", "content": "hi", "metadata": BIG}])),
        "system message as content parts": lambda s: within(s, s.chat([
            {"role": "system", "content": [{"type": "text", "text": BIG}]}, *TEXT])),
        "developer message": lambda s: within(s, s.chat([{"role": "developer", "content": BIG}, *TEXT])),
        "assistant tool_calls arguments": lambda s: within(s, s.chat([*TEXT, {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": BIG}}]},
            {"role": "tool", "tool_call_id": "c", "content": BIG}, *TEXT])),
        "assistant refusal part": lambda s: within(s, s.chat([*TEXT, {"role": "assistant", "content": [
            {"type": "refusal", "refusal": BIG}]}, *TEXT])),
        "response_format schema": lambda s: within(s, s.chat(TEXT, response_format={
            "type": "json_schema", "json_schema": {"name": "n", "schema": {"description": BIG}}})),
        "multi-byte text": lambda s: within(s, s.chat([{"role": "user", "content": "漢字🙂" * 1500}])),
    }
    accepting = {
        "image_url part, a worker accepts images": lambda s: within(s, s.chat(IMAGE)),
        "three image parts": lambda s: within(s, s.chat([{"role": "user", "content": IMAGE[0]["content"] * 3}])),
        "tools, workers accept tools": lambda s: within(s, s.chat(TEXT, tools=[
            {"type": "function", "function": {"name": "f", "description": BIG, "parameters": {"type": "object"}}}],
            tool_choice="auto")),
    }
    held = {}
    for accepts, probes in (({}, text_only), ({"smol-direct": {"image_url": H.IMAGE_TOKENS, "tools": 64},
                                               "smol-cot": {"tools": 64}}, accepting)):
        for name, probe in probes.items():
            s = H.Served(router, Path(tempfile.mkdtemp(dir=tmp)), accepts=accepts)
            try:
                held[name] = attempt(probe, s)
            finally:
                s.close()
    held["concurrent burst on a budget for ten"] = concurrent_burst(router, tmp)
    held["worker billing past its reservation: charged, recorded, budget + one overrun"] = overbilling(router, tmp)
    return held


def concurrent_burst(router, tmp: Path) -> bool:
    worst = H.BOOK.cost("smol-direct", 200, 8)
    s = H.Served(router, Path(tempfile.mkdtemp(dir=tmp)), delay_s=0.2, budget_usd=10 * worst)

    async def burst():
        async with httpx.AsyncClient(timeout=30) as c:
            return await asyncio.gather(*(c.post(f"{s.url}/chat/completions", headers=s.headers, json={
                "model": "auto", "max_tokens": 8, "messages": TEXT}) for _ in range(60)))
    try:
        codes = [r.status_code for r in asyncio.run(burst())]
        return set(codes) <= {200, 429} and s.spent() <= 10 * worst and 429 in codes
    finally:
        s.close()


def overbilling(router, tmp: Path) -> bool:
    def usage(body):
        u = H.multimodal_usage(body)
        return {**u, "prompt_tokens": u["prompt_tokens"] + 5000}

    budget = 3 * H.BOOK.cost("smol-direct", 5000, 8)
    s = H.Served(router, Path(tempfile.mkdtemp(dir=tmp)), usage=usage, budget_usd=budget)
    try:
        codes = [s.chat(TEXT).status_code for _ in range(8)]
        overruns = s.gw.store.overruns(s.info.key_id)
        return (429 in codes and bool(overruns)
                and s.spent() <= budget + max(o["overrun_usd"] for o in overruns) + 1e-12)
    finally:
        s.close()


def error_probes(router, tmp: Path) -> dict[str, bool]:
    s = H.Served(router, Path(tempfile.mkdtemp(dir=tmp)), max_body_bytes=2 * 2**20)
    chat, good = f"{s.url}/chat/completions", {"model": "auto", "messages": TEXT, "max_tokens": 8}

    def raw(path: str, content: bytes, status: int = 400, **headers) -> bool:
        r = httpx.post(f"{s.url}{path}", content=content, timeout=30,
                       headers={**s.headers, "content-type": "application/json", **headers})
        return is_error(r, status)

    def field(**extra) -> bool:
        return is_error(httpx.post(chat, headers=s.headers, json={**good, **extra}, timeout=30), 400)
    try:
        decision = s.chat(TEXT).json()["routerops"]["decision_id"]
        feedback = f"/decisions/{decision}/feedback"
        other, _ = s.gw.store.create_key(1.0, "day")
        probes = {
            "chat body not UTF-8": lambda: raw("/chat/completions", b'{"model": "auto", "messages": "caf\xe9"}'),
            "chat body 100,000 levels of [": lambda: raw("/chat/completions", b"[" * 100_000 + b"]" * 100_000),
            "chat body 100,000 levels of {\"a\":": lambda: raw("/chat/completions", b'{"a":' * 100_000),
            "feedback body {": lambda: raw(feedback, b"{"),
            "feedback body [1]": lambda: raw(feedback, b"[1]"),
            "feedback body not UTF-8": lambda: raw(feedback, b"\xff\xfe"),
            "feedback 100,000 levels": lambda: raw(feedback, b"[" * 100_000),
            "feedback score 2": lambda: raw(feedback, b'{"score": 2}'),
            "feedback score NaN": lambda: raw(feedback, b'{"score": NaN}'),
            "NaN in a passed field": lambda: raw("/chat/completions",
                                                 b'{"model": "auto", "messages": [{"role": "user", "content": "x"}], '
                                                 b'"response_format": {"a": NaN}}'),
            "1e999": lambda: raw("/chat/completions", b'{"model": "auto", "max_tokens": 1e999}'),
            "a 5,000-digit integer": lambda: raw("/chat/completions", b'{"max_tokens": ' + b"9" * 5000 + b"}"),
            "unpaired surrogate escape": lambda: raw("/chat/completions",
                                                     b'{"model": "auto", "messages": [{"role": "user", "content": "\\ud800"}]}'),
            "NUL in content is answered": lambda: httpx.post(chat, headers=s.headers, timeout=30, json={
                **good, "messages": [{"role": "user", "content": "a\x00b"}]}).status_code == 200,
            "empty body": lambda: raw("/chat/completions", b""),
            "text/plain body": lambda: raw("/chat/completions", b"hello", **{"content-type": "text/plain"}),
            "body over the limit": lambda: raw("/chat/completions", b" " * (3 * 2**20), 413),
            "messages as a string": lambda: field(messages="hi"),
            "message without a role": lambda: field(messages=[{"content": "hi"}]),
            "tool message without tool_call_id": lambda: field(messages=[{"role": "tool", "content": "x"}]),
            "max_tokens as a string": lambda: field(max_tokens="8"),
            "max_tokens 0": lambda: field(max_tokens=0),
            "max_tokens over the cap": lambda: field(max_tokens=10**9),
            "n = 2": lambda: field(n=2),
            "stream 'yes'": lambda: field(stream="yes"),
            "budget_usd -1": lambda: field(budget_usd=-1),
            "temperature as an object": lambda: field(temperature={}),
            "stop as a number": lambda: field(stop=3),
            "unknown path": lambda: is_error(httpx.get(f"{s.url}/nope", timeout=30), 404),
            "wrong method": lambda: is_error(httpx.get(chat, timeout=30), 405),
            "no key": lambda: is_error(httpx.post(chat, json=good, timeout=30), 401),
            "a key with non-ASCII bytes": lambda: is_error(httpx.post(chat, json=good, timeout=30, headers={
                "authorization": b"Bearer rk-\xc3\xa9\xff"}), 401),
            "another key's decision": lambda: is_error(httpx.get(f"{s.url}/decisions/{decision}", timeout=30, headers={
                "Authorization": f"Bearer {other}"}), 404),
            "a 10,000-character decision id": lambda: is_error(httpx.get(f"{s.url}/decisions/{'d' * 10_000}",
                                                                         headers=s.headers, timeout=30), 404),
            "unknown model": lambda: is_error(httpx.post(chat, headers=s.headers, json={**good, "model": "gpt-9"},
                                                         timeout=30), 404),
        }
        return {name: attempt(probe) for name, probe in probes.items()}
    finally:
        s.close()


def overload_probes(router, tmp: Path) -> dict[str, bool]:
    s = H.Served(router, Path(tempfile.mkdtemp(dir=tmp)), delay_s=0.5, max_in_flight=4, max_queue=4,
                 max_queue_wait_s=0.1)

    async def burst():
        async with httpx.AsyncClient(timeout=30) as c:
            return await asyncio.gather(*(c.post(f"{s.url}/chat/completions", headers=s.headers, json={
                "model": "auto", "messages": TEXT, "max_tokens": 8}) for _ in range(100)), return_exceptions=True)
    try:
        answers = asyncio.run(burst())
        dropped = [a for a in answers if isinstance(a, Exception)]
        shed = [a for a in answers if not isinstance(a, Exception) and a.status_code == 503]
        return {"100 at once, 4 slots + 4 queued: no dropped connection": not dropped,
                "the excess is 503 with Retry-After, counted": bool(shed) and all(
                    is_error(r, 503) and r.headers.get("retry-after") for r in shed)
                and s.gw.admission.stats.shed == len(shed)}
    finally:
        s.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gateway_probes.json"))
    args = parser.parse_args()
    router = H.router.__wrapped__()
    with tempfile.TemporaryDirectory(prefix="gateway-probes-") as tmp:
        groups = {"budget": budget_probes(router, Path(tmp)), "errors": error_probes(router, Path(tmp)),
                  "overload": overload_probes(router, Path(tmp))}
    result = {"benchmark": "gateway_probes",
              "attempted": sum(len(g) for g in groups.values()), "held": sum(sum(g.values()) for g in groups.values()),
              "per_group": {k: {"attempted": len(g), "held": sum(g.values())} for k, g in groups.items()},
              "failed": [f"{k}: {name}" for k, g in groups.items() for name, ok in g.items() if not ok],
              "probes": groups, "command": "python benchmarks/gateway_probes.py " + " ".join(sys.argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("attempted", "held", "per_group", "failed")}, indent=2))


if __name__ == "__main__":
    main()
