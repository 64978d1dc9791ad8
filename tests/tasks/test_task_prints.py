"""Tasks whose libraries read their own prints keep them: `datasets` (under TRL's SFTTrainer) finds a
function's globals with dill, which disassembles it into a captured stdout. Under a flow with
log_prints=True, Prefect's print patch sent that disassembly to the run's log instead: ~180 lines of
bytecode in `make orchestra` (issue 26), and dill found no globals at all."""

from __future__ import annotations

import logging

import pytest

from tasks.stages import TASKS

orchestra_sft_task = TASKS["orchestra-sft"]


def test_the_sft_task_keeps_its_prints_whatever_the_flow_says():
    assert orchestra_sft_task.log_prints is False


def _sample(values):
    return len(values) + max(values)


def _globals_dill_finds() -> list[str]:
    from dill.detect import nestedglobals

    return sorted(nestedglobals(_sample))


@pytest.mark.slow
def test_in_a_log_prints_flow_a_task_like_sft_logs_no_bytecode_and_dill_sees_the_globals(caplog, prefect_api):
    from prefect import flow, task

    like_sft = task(_globals_dill_finds, name="like-sft", log_prints=orchestra_sft_task.log_prints)
    loud = task(_globals_dill_finds, name="loud")  # inherits the flow's log_prints=True

    @flow(log_prints=True)
    def both():
        return like_sft(), loud()

    with caplog.at_level(logging.INFO):
        quiet_found, loud_found = both()
    assert quiet_found == ["len", "max"]
    assert loud_found == []  # the mechanism: the disassembly went to the log, not to dill

    def bytecode_logged_by(name: str) -> list[str]:
        return [r.getMessage() for r in caplog.records
                if str(getattr(r, "task_run_name", "")).startswith(name) and "LOAD_GLOBAL" in r.getMessage()]

    assert not bytecode_logged_by("like-sft")
    assert bytecode_logged_by("loud")
