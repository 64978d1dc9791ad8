"""The orchestrator flow (paper 004, Uno-Orchestra §4): tasks → baselines, teacher, probe π(0) →
verifier filter → SFT → RL (Agentic-GRPO) → evaluate before SFT, after SFT and after RL → register.

`routerops run orchestra` (`make orchestra`) runs it at small scale on the embedded pool with
SmolLM2-135M-Instruct as the controller (params.yaml, section `orchestra`); configs/paper/orchestra.yaml
holds the paper-scale LM settings. The same stages are in pipelines/orchestra/dvc.yaml.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from routerops.layout import Layout
from routerops.runlog import run_flow_logged
from stages.orchestra import check_run, load_run
from tasks.stages import TASKS


@flow(name="orchestra", log_prints=True)
def orchestra_flow(params_file: str = "params.yaml", root: str = ".") -> Path:
    layout = Layout(Path(root))
    run = load_run(layout.resolve(params_file))
    check_run(run, layout, layout.resolve(params_file))  # fail before any rollout on what would fail later
    tasks = TASKS["orchestra-tasks"](run, layout)
    baselines = TASKS["orchestra-baselines"](run, layout, tasks)
    teacher = TASKS["orchestra-teacher"](run, layout, tasks)
    probe = TASKS["orchestra-probe"](run, layout, tasks)
    curriculum = TASKS["orchestra-filter"](run, layout, tasks, teacher, probe)
    sft_adapter = TASKS["orchestra-sft"](run, layout, curriculum["sft"])
    rl_adapter = TASKS["orchestra-rl"](run, layout, curriculum["rl"], sft_adapter)
    results = TASKS["orchestra-evaluate"](run, layout, tasks, sft_adapter, rl_adapter, baselines)
    registry = TASKS["orchestra-register"](run, layout, tasks, rl_adapter, results)
    print(layout.orchestra_results_markdown.read_text())
    return registry


def run_with_log(params_file: str = "params.yaml", root: str = ".") -> Path:
    """The flow as `make orchestra` runs it (`routerops run orchestra`): quiet console, full log in a file."""
    layout = Layout(Path(root))
    return run_flow_logged("orchestra", orchestra_flow, layout.orchestra_reports, layout.run_log("orchestra"),
                           params_file=params_file, root=root)

