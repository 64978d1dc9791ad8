"""What refusing one request costs the gateway's process: at the HTTP protocol (the door's first checks
as the headers are parsed, gateway/serving.py) against through uvicorn's task and the framework (the
admission middleware), the path every refusal took before.

A FastAPI app with the gateway's AdmissionMiddleware is served in a process of its own by `gateway
serve`'s stack (uvloop, StampedHttpToolsProtocol); in the `protocol` arm the app carries its
`routerops_door` (as gateway/app.py's does), in the `framework` arm it does not. Its one slot is held
and it has no queue, so every chat request (the sweep's body) is refused: 503 with Retry-After. The
load generator of benchmarks/gateway_overhead.py (its own process, raw keep-alive sockets) sends
`--requests` at `--rate`, the arms alternating over `--rounds`; per arm, the server's CPU seconds
(proc(5) utime + stime) per refusal, and the refusals' latency at the client.

    python benchmarks/gateway_refusal_cost.py [--requests 4000] [--rate 800] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import socket
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from routerops.loadgen import LoadGenerator, cpu_s, queries, run_arm, summary  # noqa: E402

ARMS = ("protocol", "framework")


def serve_refusing(conn, early: bool) -> None:
    """A process serving an app whose every chat request is refused; sends its port, serves until killed."""
    import uvicorn
    from fastapi import FastAPI

    from gateway.admission import Admission, AdmissionMiddleware, EarlyDoor
    from gateway.serving import StampedHttpToolsProtocol

    admission = Admission(max_in_flight=1, max_queue=0)
    asyncio.run(admission.acquire())  # the one slot, held for good
    app = FastAPI()
    app.add_middleware(AdmissionMiddleware, admission=admission)

    @app.post("/v1/chat/completions")
    async def chat() -> dict:  # never reached
        return {}

    if early:
        app.routerops_door = EarlyDoor(admission)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    conn.send(sock.getsockname()[1])
    config = uvicorn.Config(app, http=StampedHttpToolsProtocol, loop="uvloop", log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rate", type=float, default=800.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gateway_refusal_cost.json"))
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    texts = queries(50, seed=2)
    servers, cpu_per_refusal, latencies, load = {}, {arm: [] for arm in ARMS}, {arm: [] for arm in ARMS}, []
    generator = LoadGenerator(delay_s=None)
    try:
        for arm in ARMS:
            here, there = ctx.Pipe()
            proc = ctx.Process(target=serve_refusing, args=(there, arm == "protocol"), daemon=True)
            proc.start()
            servers[arm] = (proc, f"http://127.0.0.1:{here.recv()}/v1")
        for arm in ARMS:  # warm-up: connections, first-call paths
            proc, url = servers[arm]
            run_arm(generator, url, {}, "auto", texts, 200, 200, statuses=[])
        for _ in range(args.rounds):
            for arm in ARMS:
                proc, url = servers[arm]
                statuses: list[int] = []
                before = cpu_s(proc.pid)
                out = generator.run(url, {}, "auto", texts, args.rate, args.requests)
                refused = int((out["codes"] == 503).sum())
                if refused != args.requests:
                    raise RuntimeError(f"{arm}: {refused} of {args.requests} refused, statuses "
                                       f"{sorted(set(out['codes'].tolist()))}")
                cpu_per_refusal[arm].append((cpu_s(proc.pid) - before) / refused * 1e6)
                latencies[arm].append(out["latency_ms"])
                statuses.clear()
            load.append(os.getloadavg()[0])
    finally:
        generator.close()
        for proc, _ in servers.values():
            proc.terminate()
            proc.join(timeout=30)
    per_arm = {arm: {"cpu_us_per_refusal_per_round": cpu_per_refusal[arm],
                     "cpu_us_per_refusal_median": float(np.median(cpu_per_refusal[arm])),
                     "latency_at_client": summary(np.concatenate(latencies[arm]))} for arm in ARMS}
    result = {"benchmark": "gateway_refusal_cost", "requests_per_round": args.requests, "rate_per_s": args.rate,
              "rounds": args.rounds, "arms": per_arm,
              "framework_over_protocol_cpu": per_arm["framework"]["cpu_us_per_refusal_median"]
              / per_arm["protocol"]["cpu_us_per_refusal_median"],
              "command": "python benchmarks/gateway_refusal_cost.py " + " ".join(sys.argv[1:]),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                          "load_avg_1m_per_round": load}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("arms", "framework_over_protocol_cpu")}, indent=2))


if __name__ == "__main__":
    main()
