"""The main pipeline flow: outcomes → materialise → collect → reprice → validate → evaluate → grid → routers →
register, replay (real model outcomes) → track.

Run it with `routerops run main` from the repository root (what `make demo` does). Each task
gets the previous stage's real outputs; the same stage functions back `dvc.yaml`, and the flow ends
by recording its outputs in dvc.lock (`dvc commit`), so `dvc repro` right after is up to date.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

from prefect import flow

from routerops.config import load_params
from routerops.layout import Layout
from routerops.run_summary import pipeline_summary
from routerops.runlog import run_log
from tasks.stages import TASKS


@flow(name="routerops-pipeline", log_prints=True)
def pipeline(params_file: str = "params.yaml", root: str = ".", record_in_dvc: bool = True) -> Path:
    layout = Layout(Path(root))
    params = load_params(layout.resolve(params_file))
    outcomes = TASKS["outcomes"](params, layout)
    tasks = TASKS["materialise"](params, layout, outcomes)
    raw = TASKS["collect"](params, layout, tasks)
    priced = TASKS["reprice"](params, layout, raw)
    validation = TASKS["validate"](params, layout, priced)
    report = TASKS["evaluate"](params, layout, priced, validation)
    grid = TASKS["grid"](params, layout, priced, tasks)
    router_report = TASKS["routers"](params, layout, grid)
    registry = TASKS["register"](params, layout, grid, router_report)
    replay_report = TASKS["replay"](params, layout, outcomes)
    runs = TASKS["track"](params, layout, registry, replay_report["leaderboard"], report["leaderboard"])
    if record_in_dvc:
        record_outputs_in_dvc(layout.root)
    return runs


def record_outputs_in_dvc(root: Path) -> None:
    """Hash the main pipeline's outputs into dvc.lock so DVC knows this flow already produced them."""
    subprocess.run([sys.executable, "-m", "dvc", "commit", "--force", "--quiet", "dvc.yaml"], check=True, cwd=root)


def run_with_summary(params_file: str = "params.yaml", root: str = ".", record_in_dvc: bool = True) -> Path:
    """The flow as `make demo` runs it (`routerops run main`): the console keeps warnings (each once),
    errors and one line per stage; everything else goes to the log file, which the closing summary names."""
    layout, started = Layout(Path(root)), time.monotonic()
    with run_log(layout.run_log("pipeline")) as log_file:
        try:
            runs = pipeline(params_file=params_file, root=root, record_in_dvc=record_in_dvc)
        except BaseException:
            print(f"\nThe pipeline failed; its full log: {log_file}", file=sys.stderr)
            raise
        summary = pipeline_summary(layout, log_file, time.monotonic() - started)
        logging.getLogger(__name__).info("summary\n%s", summary)
    print("\n" + summary, end="")
    return runs

