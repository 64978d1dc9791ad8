"""A pipeline's flow run from the command line (`routerops run NAME`) so that it can be stopped.

SIGTERM (a scheduler, `kill`) or Ctrl-C ends the run within seconds, with no traceback: the flow
run is marked Cancelled in Prefect, any MLflow run it left open is marked KILLED (and when it had
not opened one yet, a KILLED run of the pipeline's name records the stop), and the command exits
130 (Ctrl-C) or 143 (SIGTERM). The local LLM server is stopped by the stage that started it
(routerops/workers/server.py: its own process group); the journals keep every finished episode, so
the next run resumes.

Why the run gets a Prefect API server of its own: without PREFECT_API_URL, Prefect starts an
ephemeral server as a child in our process group, so Ctrl-C killed it first and the engine then
failed to report the run's end (httpx.ConnectError tracebacks, minutes of retries, a run left
"Running"). Ours runs in its own session (services/prefect_server.py) on the same PREFECT_HOME, so
`make prefect-ui` shows these runs as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Stopped(BaseException):
    """SIGTERM or SIGINT arrived; a BaseException like KeyboardInterrupt, so no `except Exception` eats it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def prefect_api(home: Path) -> Iterator[None]:
    """PREFECT_API_URL when it is set; else a Prefect API server for this run, in its own session."""
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from services.prefect_server import prefect_server

    with prefect_server(home, log_path=home / "run-server.log", services=False, stop_grace_s=3) as url, \
            temporary_settings(updates={PREFECT_API_URL: url}):
        try:
            yield
        finally:
            drain_prefect_workers()


def drain_prefect_workers() -> None:
    """Send the run's queued log lines and events while our server still listens: left for the
    interpreter's exit, Prefect's workers retried a stopped server for over a minute and printed
    "Error logging to API"."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):
            worker.drain_all(timeout=5)


def prefect_home() -> Path:
    """Where Prefect keeps its database: PREFECT_HOME (the Makefile sets .prefect), else ~/.prefect."""
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect")


class DropInterruptCrash:
    """A logging filter: Prefect's "Crash detected! Execution was aborted by an interrupt/termination
    signal." and "Finished in state Crashed('Execution was aborted by ...')" are the stop this module
    reports itself (as Cancelled, in one line)."""

    def filter(self, record) -> bool:
        return "Execution was aborted by a" not in record.getMessage()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGINT raise Stopped in the main thread (Prefect's engine turns SIGTERM into its own
    TerminationSignal while a flow runs; both are caught by `run_flow_cancellable`)."""
    def stop(signum, _frame):
        raise Stopped(signum)

    import logging

    loggers, drop = [logging.getLogger(n) for n in ("prefect.flow_runs", "prefect.task_runs")], DropInterruptCrash()
    previous = {sig: signal.signal(sig, stop) for sig in EXIT_CODES}
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for logger in loggers:
            logger.removeFilter(drop)


def which_signal(exc: BaseException) -> int:
    if isinstance(exc, Stopped):
        return exc.signum
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    return int(getattr(exc, "signal", signal.SIGTERM) or signal.SIGTERM)  # prefect's TerminationSignal


def cancel_flow_runs(flow_name: str, since: datetime, reason: str) -> list[str]:
    """Mark this process's runs of `flow_name` started since `since` and not finished otherwise
    (Running, or Crashed by the engine's interrupt handling) as Cancelled; returns their names."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowFilter, FlowFilterName, FlowRunFilter,
                                                FlowRunFilterStartTime, FlowRunFilterState,
                                                FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled

    open_states = [StateType.RUNNING, StateType.CRASHED, StateType.PENDING, StateType.CANCELLING]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
            flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since),
                                          state=FlowRunFilterState(type=FlowRunFilterStateType(any_=open_states))))
        for run in runs:
            client.set_flow_run_state(run.id, Cancelled(message=reason), force=True)
    return [run.name for run in runs]


def kill_mlflow_runs(params_file: Path, run_name: str, since: datetime, reason: str) -> list[str]:
    """Every MLflow run this process left RUNNING as KILLED; when there is none, one KILLED run named
    `run_name` so the stop shows in the UI beside the finished runs. Returns their ids."""
    import mlflow

    from evaluation.tracking import use_tracking
    from routerops.config import TrackConfig, load_params

    track = load_params(params_file, sections=("track",)).track if params_file.is_file() else TrackConfig()
    use_tracking(track)
    while mlflow.active_run():
        mlflow.end_run(status="KILLED")
    started_ms = int(since.timestamp() * 1000)
    running = mlflow.search_runs(experiment_names=[track.experiment], output_format="list",
                                 filter_string=f"attributes.status = 'RUNNING' and attributes.start_time >= {started_ms}")
    client = mlflow.MlflowClient()
    for run in running:
        client.set_terminated(run.info.run_id, status="KILLED")
    if running:
        return [run.info.run_id for run in running]
    with mlflow.start_run(run_name=run_name, tags={"routerops.stopped": reason}) as run:
        pass
    client.set_terminated(run.info.run_id, status="KILLED")
    return [run.info.run_id]


def run_flow_cancellable(flow: Callable[..., Any], run_name: str, tracking: Path, home: Path,
                         **parameters: Any) -> Any:
    """`flow(**parameters)`; on SIGTERM or Ctrl-C: runs marked, one line printed, exit 143 / 130.
    `tracking`: the params file whose `track` section names the MLflow store; `home`: PREFECT_HOME."""
    since = datetime.now(timezone.utc)
    started = time.monotonic()
    try:
        with prefect_api(home), stop_on_signals():
            try:
                return flow(**parameters)
            except BaseException as exc:
                if isinstance(exc, Exception) or isinstance(exc, (SystemExit, GeneratorExit)):
                    raise
                signum = which_signal(exc)
                with signals_ignored():  # a second Ctrl-C must not cut the bookkeeping short
                    reason = f"stopped by {signal.Signals(signum).name} after {time.monotonic() - started:.0f} s"
                    flow_runs = cancel_flow_runs(flow.name, since, reason)
                    mlflow_runs = kill_mlflow_runs(tracking, run_name, since, reason)
                print(f"\n{run_name} {reason}: Prefect flow run {', '.join(flow_runs) or '(none started)'} "
                      f"Cancelled, MLflow run {', '.join(mlflow_runs)} KILLED. Finished work is kept; "
                      "the next run resumes from it.", file=sys.stderr)
                raise SystemExit(EXIT_CODES.get(signum, 143)) from None
    except Stopped as exc:  # before the flow began (the server was starting) or after it ended
        print(f"\n{run_name} stopped by {signal.Signals(exc.signum).name} before it ran", file=sys.stderr)
        raise SystemExit(EXIT_CODES[exc.signum]) from None


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in EXIT_CODES}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
