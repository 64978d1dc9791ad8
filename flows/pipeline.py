"""The main pipeline flow: materialise → collect → reprice → validate → evaluate → routers →
register → track.

Run it with `python -m flows.pipeline` from the repository root (what `make demo` does). The same
stage functions back `dvc.yaml`; the flow finishes by recording its outputs in dvc.lock
(`dvc commit`), so `dvc repro` right after finds everything up to date.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from prefect import flow

from routerops.config import load_params
from tasks.stages import (
    collect_task,
    evaluate_task,
    materialise_task,
    register_task,
    reprice_task,
    routers_task,
    track_task,
    validate_task,
)


@flow(name="routerops-pipeline", log_prints=True)
def pipeline(params_file: str = "params.yaml", record_in_dvc: bool = True) -> dict[str, str]:
    params = load_params(params_file)
    tasks_file = materialise_task(params)
    raw = collect_task(params, tasks_file)
    priced = reprice_task(params, raw)
    validation = validate_task(params, priced)
    report = evaluate_task(params, validation)
    router_report = routers_task(params, report)
    registered = register_task(params, router_report)
    run_ids = track_task(params, registered)
    if record_in_dvc:
        record_outputs_in_dvc()
    return run_ids


def record_outputs_in_dvc() -> None:
    """Hash the stage outputs into dvc.lock so DVC knows this flow already produced them."""
    subprocess.run([sys.executable, "-m", "dvc", "commit", "--force", "--quiet"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--no-dvc", action="store_true", help="do not record outputs in dvc.lock")
    args = parser.parse_args()
    pipeline(params_file=args.params, record_in_dvc=not args.no_dvc)


if __name__ == "__main__":
    main()
