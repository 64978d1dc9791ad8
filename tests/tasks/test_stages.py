"""The Prefect tasks come from the stage declarations: one per stage, named after it, with its
declared retry and print policy, wrapping the very function `routerops stage NAME` runs."""

from __future__ import annotations

from stages import STAGES
from tasks.stages import TASKS, collect_on_dask


def test_one_task_per_stage_named_after_it_running_the_stage_function():
    assert set(TASKS) == set(STAGES)
    for name, task in TASKS.items():
        assert task.name == name
        assert task.fn is (collect_on_dask if name == "collect" else STAGES[name].run()), name


def test_the_declared_policies_reach_the_tasks():
    retried = {name: (task.retries, task.retry_delay_seconds) for name, task in TASKS.items() if task.retries}
    assert retried == {"collect": (2, 5), "retrain-collect-grid": (2, 5), "mtrouter-collect": (1, 5),
                       "orchestra-baselines": (1, 5), "orchestra-teacher": (1, 5), "orchestra-probe": (1, 5),
                       "orchestra-evaluate": (1, 5), "arena-policies": (1, 0), "arena-lm": (1, 0),
                       "arena-orchestra": (1, 0)}
    assert TASKS["orchestra-sft"].log_prints is False
    assert {name for name, task in TASKS.items() if task.log_prints is not None} == {"orchestra-sft"}
