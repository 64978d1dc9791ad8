"""Issue 25's CLI findings outside `replay`, each failing before its fix: --db-url values that ended in a
driver's traceback, import-routellm overwriting its input or silently dropping a model, and a pool file
whose call limits (concurrency -3, timeout_s .nan) were put in force by `pool publish`."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from routerops.errors import InputError
from routerops.pricing import load_pool
from cli import main as cli

REPO = Path(__file__).resolve().parents[2]


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().err


def one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and all(word in err for word in words), err


@pytest.mark.parametrize("case", ["missing folder", "not SQLite", "a folder", "unknown scheme", "no URL"])
def test_keys_create_refuses_a_bad_db_url_in_one_line(case, tmp_path, capsys):
    junk = tmp_path / "notes.db"
    junk.write_text("hello\n")
    url = {"missing folder": f"sqlite:///{tmp_path}/no-such-folder/gw.db", "not SQLite": f"sqlite:///{junk}",
           "a folder": f"sqlite:///{tmp_path}", "unknown scheme": "nosuchdb://host/db", "no URL": "gateway.db"}[case]
    code, err = run(["gateway", "keys", "create", "--budget-usd", "1", "--db-url", url], capsys)
    one_line_error(code, err, "--db-url")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"] and junk.read_text() == "hello\n"


def test_keys_create_still_works_on_a_new_and_on_an_existing_database(tmp_path, capsys):
    db = tmp_path / "gw.db"
    for _ in range(2):  # creates the database, then adds a key to it
        code, err = run(["gateway", "keys", "create", "--budget-usd", "1", "--db-url", f"sqlite:///{db}"], capsys)
        assert code == 0, err
    assert sqlite3.connect(db).execute("select count(*) from sqlite_master").fetchone()[0] > 0


def routellm_csv(path: Path, drop: str | None = None) -> Path:
    columns = {"prompt": ["What is 1+1?"], "m1": ["True"], "m1_response": ["2"], "m2": ["False"], "m2_response": ["3"]}
    columns.pop(drop, None)
    pd.DataFrame(columns).to_csv(path, index=False)
    return path


def test_import_routellm_refuses_out_equal_to_csv(tmp_path, capsys):
    csv = routellm_csv(tmp_path / "responses.csv")
    before = hashlib.sha256(csv.read_bytes()).hexdigest()
    code, err = run(["import-routellm", "--csv", str(csv), "--out", str(csv)], capsys)
    one_line_error(code, err, "--out", "overwrite")
    assert hashlib.sha256(csv.read_bytes()).hexdigest() == before


def test_an_out_under_proc_is_one_line_and_nothing_written(tmp_path, capsys):
    """issue 25's probes (once benchmarks/cli_probes.py): an output under /proc, which no one can create,
    is refused in one line before any work (replay's case is tests/cli/test_replay_cli.py's)."""
    csv = routellm_csv(tmp_path / "responses.csv")
    code, err = run(["import-routellm", "--csv", str(csv), "--out", "/proc/routerops-test/t.parquet"], capsys)
    one_line_error(code, err, "--out")
    src = tmp_path / "raw"
    src.mkdir()
    code, err = run(["reprice", "--src", str(src), "--price-book", str(REPO / "configs/prices/current.yaml"),
                     "--out", "/proc/routerops-test/priced"], capsys)
    one_line_error(code, err, "--out")


@pytest.mark.parametrize(("drop", "named"), [("m2", "'m2'"), ("m2_response", "'m2_response'")])
def test_import_routellm_names_a_missing_model_column(drop, named, tmp_path, capsys):
    out = tmp_path / "t.parquet"
    code, err = run(["import-routellm", "--csv", str(routellm_csv(tmp_path / "r.csv", drop)), "--out", str(out)], capsys)
    one_line_error(code, err, f"field {named}", "column missing")
    assert not out.exists()


POOL = """name: p
workers:
  - {{name: smol-direct, kind: llm, primitives: [answer], {field}: {value}}}
"""


@pytest.mark.parametrize(("field", "value"), [
    ("concurrency", "-3"), ("concurrency", "0"), ("concurrency", "2.5"), ("concurrency", "true"),
    ("timeout_s", ".nan"), ("timeout_s", ".inf"), ("timeout_s", "0"), ("timeout_s", "-1"), ("timeout_s", "'10'"),
    ("max_retries", "-1"), ("max_retries", ".nan"),
])
def test_the_pool_loader_refuses_call_limits_nothing_could_run_under(field, value, tmp_path):
    path = tmp_path / "pool.yaml"
    path.write_text(POOL.format(field=field, value=value))
    with pytest.raises(InputError) as refused:
        load_pool(path)
    assert refused.value.field == f"workers[0].{field}"


def test_pool_publish_refuses_them_and_publishes_nothing(tmp_path, capsys):
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL.format(field="concurrency", value="-3"))
    params = tmp_path / "params.yaml"
    params.write_text(f"pool: {{file: {REPO / 'configs/pools/embedded-smollm2.yaml'}}}\nprices: {{evaluation: "
                      f"{REPO / 'configs/prices/current.yaml'}}}\nops: {{publish_dir: {tmp_path / 'store'}}}\n")
    code, err = run(["pool", "publish", str(pool), "--params", str(params), "--root", str(tmp_path)], capsys)
    one_line_error(code, err, "workers[0].concurrency", "-3")
    assert not (tmp_path / "store").exists()


def test_valid_call_limits_load_as_given(tmp_path):
    path = tmp_path / "pool.yaml"
    path.write_text("workers:\n  - {name: w, kind: llm, primitives: [answer], concurrency: 1, timeout_s: 2, "
                    "max_retries: 0}\n")
    worker = load_pool(path).workers[0]
    assert (worker.concurrency, worker.timeout_s, worker.max_retries) == (1, 2.0, 0)
