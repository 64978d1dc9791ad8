"""A user's logged-outcome CSV as they saved it (issue 40): `;`, tab or `|` delimited, and every
error naming the row by the line an editor shows it on, with values as written (no numpy reprs)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from routerops.envs.csv_rows import plain, record_lines, sniff_delimiter
from routerops.envs.replay import REQUIRED_COLUMNS, load_logged_outcomes
from routerops.errors import InputError


def table(n: int = 4, multiline: bool = True) -> pd.DataFrame:
    rows = [{"dataset": "d", "query_id": f"q{i}", "query": f"What is {i}, plus one?", "worker": worker,
             "score": i % 2, "prompt_tokens": 10 + i, "completion_tokens": 5,
             "response": f"Let me think.\nAnswer: {i + 1}" if multiline else f"{i + 1}"}
            for i in range(n) for worker in ("weak", "strong")]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("sep", [",", ";", "\t", "|"])
def test_any_common_delimiter_reads_the_same_table(tmp_path, sep):
    path = tmp_path / "outcomes.csv"
    table().to_csv(path, sep=sep, index=False)
    loaded = load_logged_outcomes(path)
    expected = load_logged_outcomes(write_comma(tmp_path))
    pd.testing.assert_frame_equal(loaded, expected)
    assert sniff_delimiter(path, REQUIRED_COLUMNS) == sep


def write_comma(tmp_path):
    path = tmp_path / "comma.csv"
    table().to_csv(path, index=False)
    return path


def test_a_bad_score_names_its_line_and_the_value_as_written(tmp_path):
    frame = table()
    frame.loc[5, "score"] = 100  # the 6th data row; every row spans two lines (the response has a newline)
    path = tmp_path / "bad.csv"
    frame.to_csv(path, sep=";", index=False)
    with pytest.raises(InputError) as err:
        load_logged_outcomes(path)
    # header = line 1; data row k (1-based) starts on line 2 + 2 (k - 1): row 6 → line 12
    assert str(err.value) == f"{path}: field 'score': line 12: 100 is not a number in [0, 1]"
    assert path.read_text().splitlines()[11].startswith("d;q2;")  # what line 12 holds


def test_blank_lines_do_not_shift_the_line_named(tmp_path):
    frame = table(multiline=False)
    frame.loc[3, "prompt_tokens"] = -1
    path = tmp_path / "gaps.csv"
    lines = frame.to_csv(index=False).splitlines()
    path.write_text("\n".join(lines[:2] + [""] + lines[2:]) + "\n")  # a blank line 3, which pandas skips
    with pytest.raises(InputError, match=r"field 'prompt_tokens': line 6: -1 is not a token count"):
        load_logged_outcomes(path)
    assert record_lines(path, ",")[:3] == [1, 2, 4]


def test_parquet_rows_are_numbered_from_one_and_text_errors_show_no_numpy_repr(tmp_path):
    frame = table()
    frame.loc[2, "score"] = 2
    path = tmp_path / "t.parquet"
    frame.to_parquet(path)
    with pytest.raises(InputError, match=r"field 'score': row 3: 2 is not a number in \[0, 1\]"):
        load_logged_outcomes(path)
    assert plain(np.int64(100)) == "100" and plain(np.float64(0.5)) == "0.5" and plain("x") == "'x'"


def test_a_missing_column_lists_what_the_header_has(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("question,model,correct\nq,m,1\n")
    with pytest.raises(InputError, match=r"field 'dataset': column missing \(columns found: question, model, correct"):
        load_logged_outcomes(path)
