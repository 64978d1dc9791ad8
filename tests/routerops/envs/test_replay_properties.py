"""Property-based tests (Hypothesis) of the logged-outcomes validator and loader (issue 25): whatever
table or file a user brings, the result is a checked table or an InputError naming the field; never
another exception. Tables are drawn from a few query ids, workers and texts, so that duplicates, holes
in the grid and near-valid tables are common, with cells of every type a CSV reader, pandas or a
Parquet file can hand over."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routerops.envs.replay import REQUIRED_COLUMNS, load_logged_outcomes, validate_logged_outcomes
from routerops.errors import InputError

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

odd = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
                st.lists(st.integers(), max_size=2), st.just(pd.NA), st.just(pd.NaT), st.binary(max_size=3))
valid = {
    "dataset": st.sampled_from(["d", "e"]),
    "query_id": st.sampled_from(["q1", "q2", "q3"]),
    "query": st.sampled_from(["What is 2+2?", "Name a prime."]),
    "worker": st.sampled_from(["weak", "strong"]),
    "score": st.sampled_from([0, 1, 0.5, 1.0, True]),
    "prompt_tokens": st.integers(min_value=0, max_value=500),
    "completion_tokens": st.integers(min_value=0, max_value=500),
    "response": st.text(max_size=5),
    "split": st.sampled_from(["train", "test"]),
}
rows = st.fixed_dictionaries({c: valid[c] for c in REQUIRED_COLUMNS},
                             optional={"response": valid["response"], "split": valid["split"]})


@st.composite
def tables(draw) -> pd.DataFrame:
    """A grid of valid rows (often complete, sometimes with holes or duplicates), then up to three cells
    replaced by odd values, and sometimes a required column dropped."""
    if draw(st.booleans()):  # a complete grid: every query × every worker
        queries = draw(st.lists(st.sampled_from(["q1", "q2", "q3"]), min_size=1, max_size=3, unique=True))
        workers = draw(st.lists(st.sampled_from(["weak", "strong", "third"]), min_size=1, max_size=3, unique=True))
        records = [{**draw(rows), "query_id": q, "query": f"text {q}", "dataset": "d", "worker": w}
                   for q in queries for w in workers]
    else:
        records = draw(st.lists(rows, max_size=8))
    frame = pd.DataFrame(records)
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        if frame.empty:
            break
        row = draw(st.integers(min_value=0, max_value=len(frame) - 1))
        column = draw(st.sampled_from([*frame.columns, "response", "split"]))
        if column not in frame.columns:
            frame[column] = ""
        frame[column] = frame[column].astype(object)
        frame.at[row, column] = draw(odd)
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        frame = frame.drop(columns=[draw(st.sampled_from(REQUIRED_COLUMNS))], errors="ignore")
    return frame


def assert_clean(table: pd.DataFrame) -> None:
    """What validates is what the routers assume: scores in [0, 1], token counts integers ≥ 0, text ids,
    every query with a row for every worker, once."""
    assert not table.empty
    assert table["score"].map(lambda v: math.isfinite(v) and 0 <= v <= 1).all()
    for column in ("prompt_tokens", "completion_tokens"):
        assert table[column].map(lambda v: float(v).is_integer() and v >= 0).all()
    for column in ("dataset", "query_id", "query", "worker"):
        assert table[column].map(lambda v: isinstance(v, str) and v.strip() != "").all()
    grid = table.groupby("query_id")["worker"].agg(lambda w: tuple(sorted(w)))
    assert grid.nunique() == 1 and len(set(grid.iloc[0])) == len(grid.iloc[0])


@SETTINGS
@given(tables())
def test_any_table_validates_or_is_an_input_error(frame):
    try:
        table = validate_logged_outcomes(frame, source="fuzz")
    except InputError as exc:
        assert exc.path == "fuzz" and exc.field
        return
    assert_clean(table)


CSV_HEADER = ",".join(REQUIRED_COLUMNS)
csv_cells = st.one_of(st.sampled_from(["q1", "q2", "weak", "strong", "0", "1", "0.5", "-1", "2", "nan", "inf", "",
                                       "1e999", "9" * 30, '"a,b"', '"', "True", "  ", "\\N", "1.5", "0x10"]),
                      st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=4))
csv_files = st.one_of(
    st.lists(st.lists(csv_cells, min_size=len(REQUIRED_COLUMNS), max_size=len(REQUIRED_COLUMNS) + 1), max_size=6).map(
        lambda lines: ("\n".join([CSV_HEADER] + [",".join(line) for line in lines]) + "\n").encode()),
    st.binary(max_size=80),
    st.text(max_size=80).map(lambda t: (CSV_HEADER + "\n" + t).encode()),
)


@SETTINGS
@given(csv_files, st.sampled_from([".csv", ".parquet"]))
def test_any_file_loads_or_is_an_input_error(data, suffix):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"table{suffix}"
        path.write_bytes(data)
        try:
            table = load_logged_outcomes(path)
        except InputError as exc:
            assert exc.path == str(path) and exc.field
            return
    assert_clean(table)


def test_a_valid_table_survives_the_fuzzing_strategies():
    """The strategies can produce a table that passes: the property is not vacuous."""
    frame = pd.DataFrame([{"dataset": "d", "query_id": q, "query": f"text {q}", "worker": w, "score": 1,
                           "prompt_tokens": 3, "completion_tokens": np.int64(4)} for q in ("q1", "q2")
                          for w in ("weak", "strong")])
    assert_clean(validate_logged_outcomes(frame))
