"""Every command answers `--help`, a usage error or a missing file without importing the heavy
libraries (issue 40, item 2): the CLI parses first and imports what a command runs when it runs. Held
by the modules a fresh interpreter has imported when the command ends, not by timing (the machine is
shared); `benchmarks`-style timings are in docs/operations/serve.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a fresh interpreter per command
REPO = Path(__file__).resolve().parents[2]
HEAVY = ("pydantic", "torch", "transformers", "mlflow", "prefect", "pandas", "sklearn", "fastapi", "sentence_transformers",
         "openai", "sqlalchemy", "uvicorn", "pyarrow")
# Run main(argv) in a fresh interpreter; print its exit code and the top-level modules it imported.
PROBE = """
import json, sys
from cli.main import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted({m.split('.')[0] for m in sys.modules})}), file=sys.__stdout__)
"""
COMMANDS = {
    "routerops --help": ["--help"],
    "routerops run main --help": ["run", "main", "--help"],
    "routerops replay --help": ["replay", "--help"],
    "routerops replay --table /nonexistent": ["replay", "--table", "/nonexistent.csv", "--prices",
                                              "configs/prices/current.yaml"],
    "routerops replay (usage error)": ["replay", "--table"],
    "routerops register --help": ["register", "--help"],
    "routerops register --table /nonexistent": ["register", "--table", "/nonexistent.csv", "--prices",
                                                "configs/prices/current.yaml", "--router", "knn"],
    "routerops gateway serve --help": ["gateway", "serve", "--help"],
    "routerops gateway serve --no-such-flag": ["gateway", "serve", "--no-such-flag"],
    "routerops gateway serve --config /nonexistent": ["gateway", "serve", "--config", "/nonexistent.yaml"],
    "routerops gateway keys create --help": ["gateway", "keys", "create", "--help"],
    "routerops gateway keys spend --help": ["gateway", "keys", "spend", "--help"],
    "routerops stage --help": ["stage", "--help"],
    "routerops validate --src /nonexistent": ["validate", "--src", "/nonexistent"],
    "routerops reprice --price-book /nonexistent": ["reprice", "--price-book", "/nonexistent.yaml", "--out", "x"],
    "routerops import-qa /nonexistent": ["import-qa", "/nonexistent.jsonl", "--out", "x"],
    "routerops ope --help": ["ope", "--help"],
    "routerops serve --help": ["serve", "--help"],
    "routerops drift check --help": ["drift", "check", "--help"],
    "routerops run main --no-such-flag": ["run", "main", "--no-such-flag"],
}


def imported_by(argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", list(COMMANDS.values()), ids=list(COMMANDS))
def test_help_usage_errors_and_missing_files_import_no_heavy_library(argv):
    result = imported_by(argv)
    heavy = sorted(set(HEAVY) & set(result["modules"]))
    if argv[:2] == ["gateway", "serve"]:  # serve's flags are its settings model's
        heavy = [m for m in heavy if m != "pydantic"]
    assert heavy == [], f"routerops {' '.join(argv)} imported {heavy}"
    expected = 0 if "--help" in argv else 2
    assert result["code"] == expected, result["code"]


def test_the_probe_sees_a_heavy_import():
    """The probe would catch a regression: a command past its checks imports its libraries (pandas here:
    `configs` is a folder without trajectories, so validate reads and refuses it)."""
    result = imported_by(["validate", "--src", "configs"])
    assert result["code"] == 2 and "pandas" in result["modules"]


def test_the_parser_copies_of_library_constants_match_the_libraries():
    """cli/main.py and gateway/cli.py spell a few names out instead of importing their (heavy) modules."""
    from gateway import cli as gateway_cli
    from gateway import store
    from routerops import publishing
    from cli import main as cli

    from gateway.settings import GatewaySettings

    assert gateway_cli.PERIODS == store.PERIODS
    assert gateway_cli.DEFAULT_DB == GatewaySettings.model_fields["database"].default
    assert [kind for kind, _ in cli.PUBLISHED_KINDS] == list(publishing.KINDS)
    assert all(publishing.published_event_name(kind) == f"routerops.{kind}.published" for kind in publishing.KINDS)
