"""One error style for every command (issue 25): exit 2, one line on stderr naming the file or flag and
the fix, nothing written, no traceback.

The commands are enumerated from the parsers themselves (cli/main.py's, and gateway/cli.py's behind
`routerops gateway`), so a new subcommand is driven here as soon as it exists: each argument is
classified by its name as an output, an input file or another value, and a new name this table does not
know fails `test_every_argument_of_every_command_is_classified` until it is added."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from cli import main as cli
from gateway.cli import add_gateway_parser

REPO = Path(__file__).resolve().parents[2]
BOOK = REPO / "configs/prices/current.yaml"
POOL = REPO / "configs/pools/embedded-smollm2.yaml"
JUNK = b"\x00\xff\xfe not what this command reads {[\n"

# Arguments that name where a command writes. --root is the Layout the stages write data/ and reports/
# under (and publish its store under); --db-url is the gateway's database.
OUTPUTS = {"out", "root", "db_url", "prices_out"}  # prices_out: import-llmrouter's price book
OUTPUTS |= {"home"}  # routerops serve: the Prefect server's home under --root
# Arguments that name a file (or folder) the command reads.
INPUTS = {"table", "train_table", "prices", "price_book", "pool", "src", "csv", "contaminated", "train", "path",
          "file", "params", "tracking_uri", "pool_file", "log",
          "json", "candidates"}  # import-llmrouter's outcomes and model prices
# Everything else: a value that is not a file, given a valid one (or left at its default).
VALUES = {"help", "command", "name", "format", "suite", "split", "limit", "split_column", "train_split",
          "score_splits", "llm_base_url", "routers", "k", "seeds", "bootstrap", "drop_overlap", "rest",
          "budget_usd", "period", "host", "port", "local_server", "loop", "http",
          "router", "estimators", "direct_model", "gate", "gate_metric", "gate_estimator"}  # routerops ope
VALUES |= {"local_base_url"}  # an endpoint's URL (gateway serve)
INPUTS |= {"config", "trajectories"}  # gateway serve's settings file; routerops register's pipeline root
VALUES |= {"otlp_endpoint", "key_id", "objective", "gate_split"}  # gateway serve, gateway keys, routerops register
VALUES |= {"controller", "version", "map"}  # arena evaluate: a registered name, its version, worker pairs
VALUES |= {"replay_urls"}  # gateway serve: replay endpoints' URLs, a JSON object (checked by GatewayConfig)
VALUES |= {"overrides"}  # routerops run --set KEY=VALUE
VALUES |= {"experiment"}  # replay: the MLflow experiment of its run
VALUES |= {"s3_port", "bound"}  # routerops serve's S3 port, routerops drift check's bound
REQUIRED_VALUES = {"budget_usd": "1", "routers": "some-router", "key_id": "abc123", "router": "knn",
                   "controller": "router-none"}  # required options that take a value


def leaf_commands() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(argv prefix, parser) of every command a user can run, from the parsers."""
    found = []

    def walk(prefix: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            choices = [a for a in parser._actions if not a.option_strings and a.choices and a.dest == "name"]
            if choices:  # `stage NAME`: every stage is a command of its own
                found.extend(((*prefix, name), parser) for name in choices[0].choices)
            else:
                found.append((prefix, parser))
            return
        for name, child in subs[0].choices.items():
            if prefix == () and name == "gateway":  # parsed by gateway/cli.py's own parser
                gateway = argparse.ArgumentParser(prog="routerops")
                add_gateway_parser(gateway.add_subparsers(dest="command"))
                walk(("gateway",), gateway._subparsers._group_actions[0].choices["gateway"])
            else:
                walk((*prefix, name), child)

    walk((), cli.build_parser())
    return found


COMMANDS = leaf_commands()
IDS = [" ".join(prefix) for prefix, _ in COMMANDS]


def is_number_or_flag(action: argparse.Action) -> bool:
    """A number or an on/off switch can name no file: such arguments need no classifying."""
    return action.type in (int, float) or action.nargs == 0


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._SubParsersAction)
            and a.dest not in ("help", "name") and not (a.dest == "name" and a.choices)]


def test_every_argument_of_every_command_is_classified():
    names = {a.dest for _, parser in COMMANDS for a in arguments(parser) if not is_number_or_flag(a)}
    assert names - OUTPUTS - INPUTS - VALUES == set(), (
        "classify the new arguments above (output, input file or value) so the error-style test drives them")
    assert len(COMMANDS) >= 10 and ("replay",) in [c for c, _ in COMMANDS]


def load_fixture(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / f"tests/cli/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """A valid file for every input argument, and the folder they live in."""
    folder = tmp_path_factory.mktemp("inputs")
    helpers = load_fixture("test_cli")
    src = helpers.write_set(folder / "raw", *helpers.trajectories())
    rows = [{"dataset": "d", "query_id": f"q{i}", "query": f"Question {i}?", "worker": w, "score": float((i + j) % 2),
             "prompt_tokens": 10, "completion_tokens": 20, "split": "train" if i < 6 else "test"}
            for i in range(10) for j, w in enumerate(("smol-direct", "smol-cot"))]
    table = folder / "table.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    routellm = folder / "routellm.csv"
    pd.DataFrame({"prompt": ["1+1?"], "a": ["True"], "a_response": ["2"]}).to_csv(routellm, index=False)
    qa = folder / "qa.jsonl"
    qa.write_text(json.dumps({"question": "1+1?", "answer": "2\n#### 2"}) + "\n")
    params = folder / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text())
    log = folder / "decisions.csv"  # routerops ope's exported decision log (its columns; one graded row)
    pd.DataFrame([{"decision_id": "d1", "router": "r", "chosen": "smol-direct", "propensity": 1.0,
                   "explanation": "{}", "score": 1.0, "cost_usd": 0.0, "worker": "smol-direct"}]).to_csv(log, index=False)
    dcrouter = folder / "dcrouter.json"  # import-llmrouter's two inputs
    dcrouter.write_text(json.dumps([{"question": f"q{i}?", "scores": {"a": 1.0, "b": 0.0}, "cluster_id": 0}
                                    for i in range(5)]))
    candidates = folder / "candidates.json"
    candidates.write_text(json.dumps({m: {"input_price": 0.1, "output_price": 0.1} for m in ("a", "b")}))
    return {"json": dcrouter, "candidates": candidates, "log": log, "table": table, "train_table": table, "prices": BOOK, "price_book": BOOK, "pool": POOL, "src": src,
            "csv": routellm, "path": qa, "params": params, "folder": folder}


def valid_input(dest: str, prefix: tuple[str, ...], inputs: dict[str, Path]) -> str | None:
    if dest == "file":
        return str(POOL if prefix[0] == "pool" else BOOK)
    return str(inputs[dest]) if dest in inputs else None


def bad_input(dest: str, prefix: tuple[str, ...], inputs: dict[str, Path], tmp: Path) -> str:
    """A file of junk with the suffix the valid input has, so the reader that opens it is the real one."""
    valid = valid_input(dest, prefix, inputs)
    suffix = Path(valid).suffix if valid else ".yaml"
    bad = tmp / f"bad-{dest}{suffix or '.bin'}"
    bad.write_bytes(JUNK)
    return str(bad)


def argv_for(prefix, parser, inputs, tmp: Path, *, outputs: str, bad: bool) -> tuple[list[str], list[Path]]:
    """The command line: outputs `unwritable` (under a regular file) or fresh paths in tmp/out; inputs
    valid, or (bad=True) junk. Returns it and the output paths that must not exist afterwards."""
    blocker = tmp / "a-regular-file"
    blocker.write_text("not a folder\n")
    argv, written = [*prefix], []
    for action in arguments(parser):
        dest, flag = action.dest, (action.option_strings or [None])[0]
        if dest in OUTPUTS:
            target = (blocker if outputs == "unwritable" else tmp / "out") / f"out-{dest}"
            written.append(target)
            value = f"sqlite:///{target}.db" if dest == "db_url" else str(target)
            if dest == "db_url" and bad:
                junk = tmp / "not-a-database.db"
                junk.write_bytes(JUNK)
                value = f"sqlite:///{junk}"
            if dest == "root":  # the Layout: the stage or the publish store reads params.yaml there
                value = str(target)
        elif dest in INPUTS:
            if dest == "tracking_uri" or (not bad and not action.required and flag and dest != "params"):
                continue  # an MLflow URI is no file; with valid inputs, optional ones keep their default
            value = bad_input(dest, prefix, inputs, tmp) if bad else valid_input(dest, prefix, inputs)
            if dest == "params" and not bad:
                value = str(inputs["params"])
        elif action.required:
            value = REQUIRED_VALUES[dest]
        else:
            continue
        argv += [flag, value] if flag else [value]
    return argv, written


def tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def drive(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse refusing the command line
        code = exc.code
    return code, capsys.readouterr().err


def assert_error_style(code: int, err: str, written: list[Path], before: set[str], tmp: Path, argv) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"{argv}: exit {code}\n{err}"
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("routerops: error: "), f"{argv}:\n{err}"
    assert all(not p.exists() and not Path(f"{p}.db").exists() for p in written), written
    assert tree(tmp) == before, f"{argv} left {sorted(tree(tmp) - before)}"


@pytest.mark.parametrize(("prefix", "parser"), COMMANDS, ids=IDS)
def test_an_unwritable_output_is_one_line_exit_2_and_nothing_written(prefix, parser, inputs, tmp_path, capsys):
    argv, written = argv_for(prefix, parser, inputs, tmp_path, outputs="unwritable", bad=False)
    if not written:
        pytest.skip(f"{' '.join(prefix)} writes no file")
    before = tree(tmp_path)
    code, err = drive(argv, capsys)
    assert_error_style(code, err, written, before, tmp_path, argv)
    assert any(word in err for word in ("--out", "--root", "--db-url", "params.yaml", "publish_dir")), err


@pytest.mark.parametrize(("prefix", "parser"), COMMANDS, ids=IDS)
def test_a_bad_input_file_is_one_line_exit_2_and_nothing_written(prefix, parser, inputs, tmp_path, capsys):
    argv, written = argv_for(prefix, parser, inputs, tmp_path, outputs="fresh", bad=True)
    if not any(str(tmp_path / "bad-") in a or "not-a-database" in a for a in argv):
        pytest.skip(f"{' '.join(prefix)} reads no file")
    before = tree(tmp_path)
    code, err = drive(argv, capsys)
    assert_error_style(code, err, written, before, tmp_path, argv)
    assert "bad-" in err or "not-a-database" in err, err  # names the file


@pytest.mark.parametrize(("prefix", "parser"), COMMANDS, ids=IDS)
def test_a_command_line_argparse_refuses_is_one_line_too(prefix, parser, capsys):
    code, err = drive([*prefix, "--no-such-flag", "x"], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and " error: " in err and "--help" in err, err  # a missing or unknown flag


def test_the_sqlite_check_accepts_a_real_database_and_a_new_file(tmp_path):
    """The --db-url check refuses junk, not the gateway's own database or a new one."""
    db = tmp_path / "gw.db"
    sqlite3.connect(db).execute("create table t (x)").connection.close()
    cli.check_db_url(f"sqlite:///{db}")
    cli.check_db_url(f"sqlite:///{tmp_path / 'new.db'}")
    assert not (tmp_path / "new.db").exists() and os.listdir(tmp_path) == ["gw.db"]
