"""Issue 9's price-book and table edges through `routerops` (its console script for one case, its `main` in
this process for the rest): exit code 2, one line naming the file and the field, no traceback, and every file
that existed before left as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from routerops import schema
from tests.cli.conftest import run_cli_in_process

REPO = Path(__file__).resolve().parents[2]
ROUTEROPS = Path(sys.executable).parent / "routerops"  # the console script of the venv running pytest
BOOK = REPO / "configs/prices/current.yaml"
POOL = REPO / "configs/pools/embedded-smollm2.yaml"

pytestmark = pytest.mark.slow  # the console-script case starts the CLI in a subprocess (~8 s of imports)

sys.path.insert(0, str(Path(__file__).parent))
try:
    from tests.cli.test_cli import trajectories, write_set  # the CLI tests' two-episode trajectory set
finally:
    sys.path.pop(0)


def routerops(*args: str, cwd: Path = REPO, script: bool = False) -> subprocess.CompletedProcess:
    """The CLI's exit code and output: by the venv's `routerops` script in a process of its own when `script`
    (one case here, so the installed entry point is run), else by the same `main` in this process."""
    if not script:
        return run_cli_in_process(list(args), cwd)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([str(ROUTEROPS), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def fingerprints(folder: Path) -> dict[str, str]:
    return {p.name: schema.file_sha256(p) for p in sorted(folder.iterdir())}


def assert_clean_error(out: subprocess.CompletedProcess, *named: str) -> None:
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.startswith("routerops: error: ")
    for text in named:
        assert text in out.stderr, out.stderr


def bad_book(tmp_path: Path, problem: str) -> Path:
    path = tmp_path / "bad.yaml"
    book = yaml.safe_load(BOOK.read_text())
    if problem == "null version":
        book["version"] = None
    elif problem == "empty version":
        book["version"] = ""
    elif problem == "misspelt key":
        book["versoin"] = book.pop("version")
    if problem == "binary":
        path.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)))  # a gzip header, then noise
    else:
        path.write_text(yaml.safe_dump(book))
    return path


@pytest.mark.parametrize("problem, field", [
    ("null version", "field 'version'"),
    ("empty version", "field 'version'"),
    ("misspelt key", "did you mean 'version'"),
    ("binary", "not UTF-8 text: byte 0x8b at offset 1"),
])
def test_a_bad_price_book_leaves_the_previous_outputs_untouched(tmp_path, problem, field):
    src = write_set(tmp_path / "src", *trajectories())
    out = write_set(tmp_path / "out", *trajectories())  # what an earlier, good re-pricing wrote
    before = fingerprints(out), fingerprints(src)
    book = bad_book(tmp_path, problem)
    done = routerops("reprice", "--src", str(src), "--price-book", str(book), "--out", str(out))
    assert_clean_error(done, str(book), field)
    assert (fingerprints(out), fingerprints(src)) == before


def test_a_token_count_of_1e30_is_named_by_file_row_and_episode(tmp_path):
    episodes, turns = trajectories()
    turns["prompt_tokens"] = turns["prompt_tokens"].astype(float)
    turns.loc[1, "prompt_tokens"] = 1e30
    src = tmp_path / "src"
    src.mkdir()
    schema.write_table(episodes, src / "episodes.parquet", "episodes")
    # Written as floats, as a tool that passed the column through pandas would: to_table would refuse.
    table = pa.Table.from_pandas(turns[schema.TURN_SCHEMA.names], preserve_index=False)
    pq.write_table(table.replace_schema_metadata(schema.TURN_SCHEMA.metadata), src / "turns.parquet")
    done = routerops("reprice", "--src", str(src), "--price-book", str(BOOK), "--out", str(tmp_path / "out"))
    assert_clean_error(done, str(src / "turns.parquet"), "prompt_tokens", "row 2 (episode e2): 1e+30")
    assert not (tmp_path / "out").exists()


def test_out_equal_to_src_or_a_file_is_refused_before_any_work(tmp_path):
    src = write_set(tmp_path / "src", *trajectories())
    before = fingerprints(src)
    done = routerops("reprice", "--src", str(src), "--price-book", str(BOOK), "--out", str(src) + "/.")
    assert_clean_error(done, "--out", "is the --src folder")
    assert fingerprints(src) == before
    report = tmp_path / "report.txt"
    report.write_text("keep me")
    done = routerops("reprice", "--src", str(src), "--price-book", str(BOOK), "--out", str(report))
    assert_clean_error(done, str(report), "exists and is not a folder")
    assert report.read_text() == "keep me"


def test_the_reprice_stage_with_a_bad_book_leaves_priced_data_untouched(tmp_path):
    book = bad_book(tmp_path, "misspelt key")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"pool": {"file": str(POOL)},
                                                          "prices": {"evaluation": str(book)}}))
    write_set(tmp_path / "data/raw", *trajectories())
    priced = write_set(tmp_path / "data/priced", *trajectories())
    before = fingerprints(priced)
    done = routerops("stage", "reprice", "--root", str(tmp_path), "--params", "params.yaml", cwd=tmp_path)
    assert_clean_error(done, str(book), "versoin")
    assert fingerprints(priced) == before and not (tmp_path / "reports").exists()


def test_import_of_a_non_utf8_outcome_csv_names_line_and_offset(tmp_path):
    csv = tmp_path / "responses.csv"
    frame = pd.DataFrame({"prompt": ["What is 1+1?", "Combien font 2+2 ?"], "small": ["True", "False"],
                          "small_response": ["2", "5"], "big": ["True", "True"], "big_response": ["2", "4"]})
    data = frame.to_csv(index=False).replace("Combien", "Combien € ").encode("cp1252")
    csv.write_bytes(data)
    offset = data.index(b"\x80")
    out = tmp_path / "outcomes.parquet"
    done = routerops("import-routellm", "--csv", str(csv), "--out", str(out), script=True)
    assert_clean_error(done, str(csv), f"byte 0x80 at offset {offset} (line 3)")
    assert not out.exists()
