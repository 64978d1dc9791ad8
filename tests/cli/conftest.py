"""The CLI tests run `routerops` in this process (run_cli_in_process): what a user sees of a command
(its exit code, stdout and stderr) without a new interpreter's imports."""

import contextlib
import io
import logging
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_cli_in_process(argv: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python -m cli ARGV` (in `cwd`) run by its `main` in this process: the same exit code
    (argparse's usage errors included), stdout, and stderr with the log lines that main's
    `logging.basicConfig` prints there in a process of its own. A new interpreter per call cost
    ~6.5 s of CPU in imports alone (pandas, sklearn, torch; `python -c "import cli.main,
    evaluation.replay, models.registry"`), for what the tests check: the exit code and the one line
    of a refusal. An exception that escapes `main` fails the test, as its traceback would."""
    from cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    to_stderr = logging.StreamHandler(stderr)
    to_stderr.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    level = root.level
    root.addHandler(to_stderr)
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), contextlib.chdir(cwd):
            try:
                code = main([str(arg) for arg in argv])
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        root.removeHandler(to_stderr)
        root.setLevel(level)
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())
