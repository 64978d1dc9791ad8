"""The closing summary of `make demo`, read from a real run's reports (tests/routerops/data/tiny_run:
the reports of `routerops run main` at the e2e test's tiny scale, replay bootstrap off), and the
console/file split of routerops.runlog."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pandas as pd
import pytest

from routerops.layout import Layout
from routerops.run_summary import pipeline_summary
from routerops.runlog import ConsoleFilter, run_log

TINY_RUN = Path(__file__).parent / "data/tiny_run"


def test_the_summary_ranks_the_real_outcome_routers_and_names_champion_reports_uis_and_log(tmp_path):
    summary = pipeline_summary(Layout(TINY_RUN), log_file=tmp_path / "pipeline.log", elapsed_s=279)
    lines = summary.splitlines()
    assert lines[0] == "routerops pipeline finished in 4 min 39 s."
    assert "RouteLLM's GSM8K" in summary and "cross-fit k=3" in summary
    ranked = [line.split()[0] for line in lines if line.startswith("  ") and line.split()[0] in
              {"logistic", "random", "oracle", "single:gpt-4-1106-preview"}]
    assert ranked[:2] == ["logistic", "random"]  # by APGR; the oracle is an upper bound, listed after them
    logistic = next(line for line in lines if line.startswith("  logistic"))
    assert "0.624" in logistic and "0.863" in logistic and "0.01729" in logistic  # APGR, best accuracy, USD
    assert "router-knn version 1 (knn" in summary and "took the alias `champion` on the val split" in summary
    assert "no current champion: the first candidate is promoted" in summary
    for report in ("replay/leaderboard.md", "routers/leaderboard.md", "eval/leaderboard.md", "registry.json"):
        assert report in summary
    assert "accuracy_cost.png" not in summary  # not in this directory: never listed when absent
    assert "make mlflow-ui" in summary and "make prefect-ui" in summary
    assert lines[-1].startswith("Full log of this run:") and lines[-1].endswith("pipeline.log")


def test_the_summary_gives_the_bootstrap_interval_when_the_run_computed_one(tmp_path):
    root = tmp_path / "run"
    shutil.copytree(TINY_RUN, root)
    board = root / "reports/replay/leaderboard.csv"
    table = pd.read_csv(board)
    table["apgr_lo"], table["apgr_hi"] = table["apgr"] - 0.04, table["apgr"] + 0.03
    table.to_csv(board, index=False)
    logistic = next(line for line in pipeline_summary(Layout(root)).splitlines() if line.startswith("  logistic"))
    assert "[0.584, 0.654]" in logistic


def test_the_console_shows_each_warning_once_and_the_file_keeps_everything(tmp_path, capsys):
    console = logging.StreamHandler()  # what Prefect's console handler is to the root logger
    root = logging.getLogger()
    # The only console handler, as in `make demo`: earlier tests of the suite leave theirs on the root
    # logger (Prefect's, or one whose captured stream is closed), which would see the records first.
    saved, root.handlers = root.handlers[:], [console]
    try:
        with run_log(tmp_path / "logs/run.log") as log_file:
            chatty = logging.getLogger("some.library")
            chatty.info("loading weights")
            for _ in range(3):
                chatty.warning("Hint: inferred schema")
                warnings.warn("a library's hint", UserWarning)
            logging.getLogger("prefect.task_runs").info("Task run 'collect' - Finished in state Completed()")
            chatty.error("a real failure")
    finally:
        root.handlers = saved
    err = capsys.readouterr().err
    assert err.count("Hint: inferred schema") == 1 and err.count("UserWarning: a library's hint") == 1
    assert "loading weights" not in err and "Finished in state Completed()" in err and "a real failure" in err
    text = log_file.read_text()
    assert text.count("Hint: inferred schema") == 3 and "loading weights" in text and "a real failure" in text
    assert not ConsoleFilter().filter(logging.makeLogRecord({"name": "x", "levelno": logging.INFO, "msg": "m"}))


def test_a_second_run_log_still_captures_warnings_after_a_caller_resets_them(tmp_path):
    """The suite's order that broke CI: one run_log, then pytest's per-test catch_warnings puts its own
    showwarning back, then another run_log must route Python warnings to its file again."""
    with run_log(tmp_path / "first.log"):
        pass
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with run_log(tmp_path / "second.log") as log_file:
            warnings.warn("seen by the second log", UserWarning)
    assert "seen by the second log" in log_file.read_text()


def test_a_logged_run_draws_no_library_progress_bars_and_puts_the_switches_back(tmp_path, capsys):
    """`make orchestra` printed transformers' "Loading weights" and TRL's dataset-map bars on the console."""
    import datasets
    import transformers.utils.logging as hf_logging
    from datasets.utils import tqdm as datasets_bar

    hf_logging.enable_progress_bar()  # on, whatever an earlier test or the environment left
    datasets.enable_progress_bars()
    with run_log(tmp_path / "run.log"):
        for _ in hf_logging.tqdm(range(3), desc="Loading weights"):
            pass
        for _ in datasets_bar(range(3), desc="Building labels"):
            pass
    out = capsys.readouterr()
    assert "Loading weights" not in out.err + out.out and "Building labels" not in out.err + out.out
    assert hf_logging.is_progress_bar_enabled() and datasets.is_progress_bar_enabled()
    for _ in hf_logging.tqdm(range(3), desc="after the run"):
        pass
    assert "after the run" in capsys.readouterr().err


@pytest.mark.slow
def test_mlflow_first_imported_inside_the_run_keeps_its_info_lines_in_the_file(tmp_path):
    """The stages import MLflow only when they run, after run_log has sorted the handlers: its "Creating
    initial MLflow database tables..." used to reach `make demo`'s console (issue 40)."""
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        assert "mlflow" not in sys.modules
        from routerops.runlog import run_log
        with run_log(Path({str(tmp_path / "run.log")!r})):
            import mlflow
            mlflow.set_tracking_uri("sqlite:///{tmp_path / 'new.db'}")
            mlflow.search_experiments()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "MLflow database tables" not in out.stdout + out.stderr, out.stdout + out.stderr
    assert "Creating initial MLflow database tables" in (tmp_path / "run.log").read_text()
