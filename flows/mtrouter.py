"""MTRouter flow (paper 000): collect → ablations → evaluate → analyses → register → track.

`routerops run mtrouter` runs it at small scale on ScienceWorld with the embedded pool
(params.yaml, section `mtrouter`); point `mtrouter.pool` at a vLLM / API pool for the paper scale.
The same stages are in pipelines/mtrouter/dvc.yaml.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from routerops.layout import Layout
from routerops.runlog import run_flow_logged
from stages.mtrouter import check_run, load_run, resolved
from tasks.stages import TASKS


@flow(name="mtrouter", log_prints=True)
def mtrouter_flow(params_file: str = "params.yaml", root: str = ".") -> Path:
    layout = Layout(Path(root))
    run = load_run(layout.resolve(params_file))
    check_run(resolved(run, layout))  # fail before any rollout on what would fail later
    tasks, train = TASKS["mtrouter-collect"](run, layout)
    ablations = TASKS["mtrouter-ablations"](run, layout, tasks, train)
    evaluation = TASKS["mtrouter-evaluate"](run, layout, tasks, train)
    TASKS["mtrouter-analyses"](run, layout, evaluation)
    registry = TASKS["mtrouter-register"](run, layout, tasks, train, evaluation)
    runs = TASKS["mtrouter-track"](run, layout, registry)
    print((layout.mtrouter_reports / "evaluation.md").read_text())
    print(ablations.read_text())
    return runs


def run_with_log(params_file: str = "params.yaml", root: str = ".") -> Path:
    """The flow as `make mtrouter` runs it (`routerops run mtrouter`): quiet console, full log in a file."""
    layout = Layout(Path(root))
    return run_flow_logged("mtrouter", mtrouter_flow, layout.mtrouter_reports, layout.run_log("mtrouter"),
                           params_file=params_file, root=root)

