"""Schemathesis against the gateway's OpenAPI schema, longer than the suite's run
(tests/gateway/test_schema_fuzz.py: 25 examples per route and mode): every route, valid and invalid
requests generated from the schema, each checked for no 5xx and an answer as documented (status,
content type, body schema). Failures are collected, not raised, and written with the counts.

Same setup as the test: a live gateway (uvicorn in a thread) over a fitted router and a real
endpoint (DelayedEndpoint), a valid key with a large budget, one worker accepting image parts.

    python benchmarks/gateway_fuzz.py [--examples 500] [--seed 0] [--out benchmarks/results/gateway_fuzz.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=500, help="generated requests per route and mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gateway_fuzz.json"))
    args = parser.parse_args()
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.generation.modes import GenerationMode

    tests = ROOT / "tests" / "gateway"
    fuzz = load(tests / "test_schema_fuzz.py", "schema_fuzz")
    router = load(tests / "test_hardening.py", "hardening").router.__wrapped__()
    counts: dict[str, dict] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gateway-fuzz-") as tmp:
        live = fuzz.LiveGateway(router, Path(tmp) / "gw.db")
        try:
            schema = fuzz.load_schema(live, args.examples)
            for result in schema.get_all_operations():
                operation = result.ok()
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                    tally = counts.setdefault(f"{operation.label} [{mode.value}]", {"sent": 0, "failures": []})

                    @seed(args.seed)
                    @given(case=operation.as_strategy(generation_mode=mode))
                    @settings(max_examples=args.examples, deadline=None, database=None,
                              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
                    def check(case):
                        tally["sent"] += 1
                        try:
                            response = case.call_and_validate(base_url=live.base_url, headers=live.headers)
                        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - recorded, the run goes on
                            if len(tally["failures"]) < 20:
                                tally["failures"].append(f"{type(exc).__name__}: {str(exc)[:500]}")
                            tally["failed"] = tally.get("failed", 0) + 1
                            return
                        status = f"{response.status_code // 100}xx"
                        tally[status] = tally.get(status, 0) + 1

                    try:
                        check()
                    except Unsatisfiable:  # nothing in this route can be made invalid but the key, which is ours
                        tally["unsatisfiable"] = True
                    print(json.dumps({k: v for k, v in tally.items() if k != "failures"} | {"route": operation.label,
                                                                                             "mode": mode.value}),
                          flush=True)
        finally:
            live.close()
    sent = sum(c["sent"] for c in counts.values())
    failed = sum(c.get("failed", 0) for c in counts.values())
    result = {"benchmark": "gateway_fuzz", "tool": "schemathesis", "examples_per_route_and_mode": args.examples,
              "seed": args.seed, "requests_sent": sent, "failed_checks": failed,
              "server_errors_5xx": sum(c.get("5xx", 0) for c in counts.values()),
              "checks": "schemathesis defaults: not_a_server_error, status_code_conformance, content_type_conformance, "
                        "response_schema_conformance, positive_data_acceptance, negative_data_rejection, ...",
              "per_route": counts, "seconds": time.perf_counter() - started,
              "command": "python benchmarks/gateway_fuzz.py " + " ".join(sys.argv[1:]),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                          "load_avg_1m": os.getloadavg()[0]}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("requests_sent", "failed_checks", "server_errors_5xx", "seconds")}))


if __name__ == "__main__":
    main()
