"""Edges of the files routerops reads (issue 9): price books, trajectory and logged-outcome tables,
JSONL files. Each wrong file is an InputError naming the file and the field, row or byte — never a
traceback, never a silently accepted value. The CLI's exit code 2 for them is tested in
tests/stages/test_reprice_edges.py."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from routerops import schema
from routerops.files import read_json_lines
from routerops.envs.replay import load_logged_outcomes
from routerops.envs.suites import read_tasks
from routerops.errors import InputError
from routerops.files import CHUNK_BYTES, check_utf8, read_text
from routerops.pricing import load_pool, load_price_book

REPO = Path(__file__).resolve().parents[2]


def book_data(**changes) -> dict:
    data = {"version": "v1", "effective_date": "2026-01-01", "currency": "USD",
            "prices": {"a": {"input_per_1m": 1.0, "output_per_1m": 2.0}}}
    return {**data, **changes}


def write_book(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "book.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def raises_input_error(call, *args) -> InputError:
    with pytest.raises(InputError) as err:
        call(*args)
    return err.value


# ---------------------------------------------------------------- price books


@pytest.mark.parametrize("version", [None, "", "   ", True, 1.5, ["v1"]])
def test_a_version_that_names_nothing_is_rejected(tmp_path, version):
    path = write_book(tmp_path, book_data(version=version))
    err = raises_input_error(load_price_book, path)
    assert err.path == str(path) and err.field == "version"


@pytest.mark.parametrize("text, version", [
    ("version: 2026-11-01", "2026-11-01"),  # an unquoted date, as configs/prices/current.yaml has it
    ("version: 7", "7"),
    ("version: '2026.11'", "2026.11"),
])
def test_dates_integers_and_text_are_versions(tmp_path, text, version):
    path = tmp_path / "book.yaml"
    path.write_text(f"{text}\neffective_date: 2026-11-01\nprices:\n  a: {{input_per_1m: 1, output_per_1m: 2}}\n")
    assert load_price_book(path).version == version


def test_a_misspelt_top_level_key_is_named_with_the_key_it_resembles(tmp_path):
    data = book_data()
    data["versoin"] = data.pop("version")
    err = raises_input_error(load_price_book, write_book(tmp_path, data))
    assert err.field == "versoin" and "did you mean 'version'" in err.problem


def test_an_unknown_top_level_key_lists_the_allowed_ones(tmp_path):
    err = raises_input_error(load_price_book, write_book(tmp_path, book_data(notes="from the vendor page")))
    assert err.field == "notes" and "version, effective_date, currency, prices" in err.problem


def test_a_misspelt_price_field_suggests_the_real_one(tmp_path):
    data = book_data(prices={"a": {"input_per_1m": 1.0, "output_per_1m": 2.0, "per_cal": 0.1}})
    err = raises_input_error(load_price_book, write_book(tmp_path, data))
    assert err.field == "prices.a.per_cal" and "did you mean 'per_call'" in err.problem


def test_a_worker_priced_twice_is_rejected(tmp_path):
    path = tmp_path / "book.yaml"
    path.write_text("version: v1\neffective_date: 2026-01-01\nprices:\n"
                    "  a: {input_per_1m: 1, output_per_1m: 2}\n  a: {input_per_1m: 0, output_per_1m: 0}\n")
    err = raises_input_error(load_price_book, path)
    assert "duplicate key 'a'" in err.problem and "line 5" in err.problem


def test_a_currency_other_than_usd_is_rejected(tmp_path):
    err = raises_input_error(load_price_book, write_book(tmp_path, book_data(currency="EUR")))
    assert err.field == "currency" and "USD" in err.problem


def test_a_binary_file_is_named_with_the_offset_of_its_first_bad_byte(tmp_path):
    path = tmp_path / "book.yaml"
    path.write_bytes(b"version: v1\n\x00\x01\xff\xfe binary")
    err = raises_input_error(load_price_book, path)
    assert err.field == "<file>" and "offset 14 (line 2)" in err.problem and "binary" in err.problem


def test_a_latin1_file_is_named_with_its_line(tmp_path):
    path = tmp_path / "book.yaml"
    path.write_bytes("version: v1\neffective_date: 2026-01-01\n# prix en €\n".encode("cp1252"))
    err = raises_input_error(load_price_book, path)
    assert "byte 0x80" in err.problem and "line 3" in err.problem and "UTF-8" in err.problem


def test_the_shipped_price_books_and_pools_still_load():
    for path in sorted((REPO / "configs/prices").glob("*.yaml")):
        assert load_price_book(path).version
    for path in (REPO / "configs/pool.yaml", REPO / "configs/pools/embedded-smollm2.yaml", REPO / "configs/paper/pool.yaml"):
        assert load_pool(path).workers


def test_an_unknown_top_level_pool_key_is_rejected(tmp_path):
    pool = yaml.safe_load((REPO / "configs/pools/embedded-smollm2.yaml").read_text())
    pool["wrokers"] = pool.pop("workers")
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    err = raises_input_error(load_pool, tmp_path / "pool.yaml")
    assert err.field == "wrokers" and "did you mean 'workers'" in err.problem


# ---------------------------------------------------------------- token counts in tables


def turns_frame(prompt_tokens) -> pd.DataFrame:
    n = len(prompt_tokens)
    frame = schema.empty_frame("turns").reindex(range(n))
    frame["episode_id"] = [f"e{i}" for i in range(n)]
    frame["prompt_tokens"] = prompt_tokens
    for column in ("completion_tokens", "cached_tokens", "turn_index"):
        frame[column] = 0
    return frame


def write_turns_with_float_tokens(path: Path, prompt_tokens: list[float]) -> Path:
    """A turns file whose writer stored token counts as floats (as pandas does after a NaN)."""
    table = pa.Table.from_pandas(turns_frame(prompt_tokens), preserve_index=False)
    pq.write_table(table.replace_schema_metadata(schema.TURN_SCHEMA.metadata), path)
    return path


@pytest.mark.parametrize("value", [1e30, float("inf"), float("nan"), -3.0, 2.5])
def test_a_float_token_count_that_is_no_count_names_file_row_and_episode(tmp_path, value):
    path = write_turns_with_float_tokens(tmp_path / "turns.parquet", [10.0, value])
    err = raises_input_error(schema.read_table, path, "turns")
    assert (err.path, err.field) == (str(path), "prompt_tokens")
    assert err.problem.startswith("row 2 (episode e1):")


def test_an_int64_token_count_beyond_the_bound_is_rejected(tmp_path):
    frame = turns_frame([10, schema.MAX_TOKEN_COUNT + 1])
    path = tmp_path / "turns.parquet"
    pq.write_table(schema.to_table(frame, "turns"), path)
    err = raises_input_error(schema.read_table, path, "turns")
    assert err.field == "prompt_tokens" and "row 2" in err.problem


def test_whole_float_token_counts_are_read_as_integers(tmp_path):
    path = write_turns_with_float_tokens(tmp_path / "turns.parquet", [10.0, 1e9])
    assert schema.read_table(path, "turns")["prompt_tokens"].tolist() == [10, 10**9]


def logged_outcomes() -> pd.DataFrame:
    return pd.DataFrame([{"dataset": "d", "query_id": f"q{q}", "query": f"What is {q} plus {q}?", "worker": w,
                          "score": 1.0, "prompt_tokens": 10, "completion_tokens": 5}
                         for q in range(3) for w in ("small", "big")])


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_logged_outcome_token_count_of_1e30_names_its_row(tmp_path, suffix):
    frame = logged_outcomes().astype({"completion_tokens": float})
    frame.loc[3, "completion_tokens"] = 1e30  # cast to int64 it used to wrap to -9.2e18, silently
    path = tmp_path / f"t{suffix}"
    frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path)
    err = raises_input_error(load_logged_outcomes, path)
    where = "line 5" if suffix == ".csv" else "row 4"  # a CSV row by its line in the file (header = line 1)
    assert err.field == "completion_tokens" and err.problem.startswith(f"{where}: 1e+30 is not a token count")


def test_a_non_utf8_logged_outcome_csv_names_the_line_and_offset(tmp_path):
    path = tmp_path / "t.csv"
    logged_outcomes().to_csv(path, index=False)
    text = path.read_bytes()
    bad = text.replace(b"What is 2 plus 2?", "What is 2 plus 2 €?".encode("cp1252"), 1)
    path.write_bytes(bad)
    err = raises_input_error(load_logged_outcomes, path)
    offset = bad.index(b"\x80")
    assert err.field == "<file>" and f"offset {offset} (line 6)" in err.problem


# ---------------------------------------------------------------- any text file


def test_jsonl_readers_name_the_line_of_a_bad_byte(tmp_path):
    path = tmp_path / "qa.jsonl"
    data = b'\n{"question": "caf\xe9", "answer": "#### 1"}\n'  # Latin-1 é on line 2
    path.write_bytes(data)
    offset = data.index(b"\xe9")
    for read in (read_json_lines, read_tasks):
        err = raises_input_error(read, path)
        assert err.path == str(path) and f"offset {offset} (line 2)" in err.problem


def test_check_utf8_finds_a_bad_byte_past_the_first_chunk_and_accepts_split_characters(tmp_path):
    path = tmp_path / "big.csv"
    line = "é,€,𝄞\n".encode()  # 2-, 3- and 4-byte characters: some straddle the chunk boundary
    body = line * (2 * CHUNK_BYTES // len(line))
    path.write_bytes(body)
    check_utf8(path)  # valid: no error, however the characters fall across chunks
    path.write_bytes(body + b"x\xff\n")
    err = raises_input_error(check_utf8, path)
    lines_before = body.count(b"\n")
    assert f"offset {len(body) + 1} (line {lines_before + 1})" in err.problem


def test_a_missing_or_unreadable_file_is_an_input_error(tmp_path):
    assert raises_input_error(read_text, tmp_path / "missing.yaml").problem == "file not found"
    assert raises_input_error(load_price_book, tmp_path).problem == "file not found"  # a directory


def test_a_binary_params_file_is_an_input_error(tmp_path):
    from routerops.config import load_params

    (tmp_path / "params.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    err = raises_input_error(load_params, tmp_path / "params.yaml")
    assert "offset 0" in err.problem
