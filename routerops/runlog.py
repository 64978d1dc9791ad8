"""A run that speaks briefly: verbose logs to a file, the console keeps what a person acts on.

`run_log(path)` (used by `routerops run main`, i.e. `make demo`) sends every log record at INFO
and above (and the warnings Python and libraries raise) to `path`, and lets through to the console
only: warnings and errors, each distinct warning once, and the lines of the loggers named in
`console_loggers` (Prefect's flow- and task-run lines: which stage finished); no library progress
bars (`quiet_progress_bars`). It changes handlers
that exist when it starts (Prefect's console handler on the root logger, MLflow's own stream
handler), so call it after importing them; it adds no handler of its own to the console.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

FILE_FORMAT = "%(asctime)s | %(levelname)-7s | %(name)s - %(message)s"
# Prefect's run loggers: "Task run 'collect-0f3' - Finished in state Completed()" and the
# prints of a flow run with log_prints; one line per stage.
CONSOLE_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class ConsoleFilter(logging.Filter):
    """Warnings and errors, each distinct warning once (by logger and first line: a warning repeated
    from a loop, or re-shown because a library reset Python's warning registry, prints once), plus
    records of `loggers` and their children."""

    def __init__(self, loggers: Sequence[str] = CONSOLE_LOGGERS):
        super().__init__()
        self.loggers = tuple(loggers)
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        if record.levelno >= logging.WARNING:
            key = (record.name, record.getMessage().strip().splitlines()[0] if record.getMessage().strip() else "")
            if key in self.seen:
                return False
            self.seen.add(key)
            return True
        return any(record.name == name or record.name.startswith(name + ".") for name in self.loggers)


def _console_handlers(logger: logging.Logger) -> list[logging.Handler]:
    # MLflow's handler writes through its own stream object (MlflowLoggingStream, which forwards to
    # sys.stderr), so it is recognised by that object's type.
    return [h for h in logger.handlers
            if isinstance(h, logging.StreamHandler) and (getattr(h, "stream", None) in (sys.stderr, sys.stdout)
                                                         or type(h.stream).__name__ == "MlflowLoggingStream")
            or type(h).__name__ == "PrefectConsoleHandler"]


@contextlib.contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """Within the block, no tqdm bars from transformers ("Loading weights") or datasets / TRL ("Building
    labels for train dataset"): on a console they are dozens of redrawn lines per
    model load or SFT stage, and in a log file carriage-return noise. Each library's own switch, put
    back as it was when the block ends; a library that is not installed is skipped."""
    switches = []
    with contextlib.suppress(ImportError):
        import transformers.utils.logging as hf_logging

        switches.append((hf_logging.is_progress_bar_enabled(), hf_logging.disable_progress_bar, hf_logging.enable_progress_bar))
    with contextlib.suppress(ImportError):
        import datasets

        switches.append((datasets.is_progress_bar_enabled(), datasets.disable_progress_bars, datasets.enable_progress_bars))
    for was_on, disable, _ in switches:
        if was_on:
            disable()
    try:
        yield
    finally:
        for was_on, _, enable in switches:
            if was_on:
                enable()


def configure_late_loggers() -> None:
    """Import now the libraries that configure their own console loggers at import: the stages import
    them only when they run (stages/declarations.py), after `run_log` has sorted the handlers, so
    MLflow's "Creating initial MLflow database tables..." reached the console (issue 40)."""
    with contextlib.suppress(ImportError):
        import mlflow  # noqa: F401 - its `mlflow` logger: own stream handler, no propagation


@contextlib.contextmanager
def run_log(path: Path, console_loggers: Sequence[str] = CONSOLE_LOGGERS) -> Iterator[Path]:
    """Within the block: records at INFO and above to `path` (overwritten), the console filtered by
    ConsoleFilter. Loggers that do not propagate (MLflow's) get the file handler and the filter too."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    configure_late_loggers()
    to_file = logging.FileHandler(path, mode="w", encoding="utf-8")
    to_file.setLevel(logging.INFO)
    to_file.setFormatter(logging.Formatter(FILE_FORMAT))
    console = ConsoleFilter(console_loggers)
    root = logging.getLogger()
    loggers = [root] + [lg for lg in logging.Logger.manager.loggerDict.values()
                        if isinstance(lg, logging.Logger) and not lg.propagate and lg.handlers]
    touched: list[tuple[logging.Handler, logging.Filter]] = []
    levels = {lg: lg.level for lg in loggers}
    for logger in loggers:
        logger.addHandler(to_file)
        for handler in _console_handlers(logger):
            handler.addFilter(console)
            touched.append((handler, console))
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)  # library INFO lines reach the file; the console filter drops them
    # Python warnings become `py.warnings` records: to the file, and once to the console. Off first:
    # captureWarnings(True) installs nothing while an earlier capture is still on, and pytest's (or any
    # caller's) warnings.catch_warnings may have put its own showwarning back since.
    shown_by = warnings.showwarning
    logging.captureWarnings(False)
    logging.captureWarnings(True)
    try:
        with quiet_progress_bars():
            yield path
    finally:
        logging.captureWarnings(False)  # a block that ends leaves Python's warnings as it found them
        warnings.showwarning = shown_by
        for handler, flt in touched:
            handler.removeFilter(flt)
        for logger, level in levels.items():
            logger.removeHandler(to_file)
            logger.setLevel(level)
        to_file.close()


def run_flow_logged(name: str, flow: Callable[..., Any], reports: Path, log_file: Path, **kwargs: Any) -> Any:
    """`flow(**kwargs)` under `run_log(log_file)` (as `make demo`: warnings once, errors and one line per
    stage on the console, the rest in the file); on failure the console names the file, on success it
    names the reports folder too."""
    with run_log(log_file) as log:
        try:
            out = flow(**kwargs)
        except BaseException:
            print(f"\nThe {name} flow failed; its full log: {log}", file=sys.stderr)
            raise
    print(f"\nReports: {reports}\nFull log of this run: {log}")
    return out
