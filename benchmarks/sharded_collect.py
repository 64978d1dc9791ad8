"""Wall time of one small collection in 1 shard (in-process) vs N shards on a local two-process Dask
cluster, through the Prefect collect task; writes benchmarks/results/sharded_collect.json.

The endpoint is routerops.workers.chaos.DelayedEndpoint (a real OpenAI-compatible server answering
after `--delay` seconds) plus a sympy tool, with collect.concurrency 1 so one process is the bottleneck
sharding removes. Cluster start-up is timed apart, and the first sharded run (workers importing the stack) apart
from a second one: both are paid once per flow run.

    python benchmarks/sharded_collect.py --delay 0.25 --shards 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--delay", type=float, default=0.25)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/sharded_collect.json")
    args = parser.parse_args()
    sys.path.insert(0, os.getcwd())
    from distributed import LocalCluster
    from prefect.testing.utilities import prefect_test_harness

    from routerops.config import load_params
    from routerops.workers.chaos import DelayedEndpoint
    from tests.flows.test_sharded_collect import run_collect_task
    from tests.stages.test_collect_shards import write_project

    tmp = Path(tempfile.mkdtemp())
    os.environ["PREFECT_HOME"] = str(tmp / "prefect")
    result = {"delay_s": args.delay, "episodes": 44, "concurrency": 1}
    with prefect_test_harness(server_startup_timeout=300):
        started = time.monotonic()
        with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster:
            result["cluster_start_s"] = round(time.monotonic() - started, 1)
            # The first sharded run pays the workers' imports (prefect, pandas, the stages) on top.
            for name, shards in (("cold", args.shards), ("warm", args.shards), ("", 1)):
                with DelayedEndpoint(delay_s=args.delay) as url:
                    layout, tasks = write_project(tmp / f"{name}-{shards}", url, shards, cluster.scheduler_address)
                    started = time.monotonic()
                    run_collect_task(load_params(layout.root / "params.yaml"), layout, tasks)
                    key = f"collect_s_shards_{shards}" + (f"_{name}_workers" if name else "")
                    result[key] = round(time.monotonic() - started, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
