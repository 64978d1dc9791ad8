"""Issue 9's serving edges, for both servables (evaluation/serving/single_turn.py, evaluation/serving/mtrouter.py),
in process and through MLflow's pyfunc: a misspelt column never silently removes a limit, a bad
budget or a missing query is an InputError naming the row, and a huge text is read only up to
MAX_TEXT_CHARS (a 10 MB query took 24 s)."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evaluation.serving.mtrouter import ServedMTRouter
from evaluation.servable import MAX_TEXT_CHARS
from evaluation.serving.single_turn import ServedRouter
from models.mtrouter.router import MTRouter
from routerops.errors import InputError

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
try:  # the registry tests' synthetic logged outcomes, text-only router and MLflow store
    from test_registry import BOOK, BUDGET, routing_data, surface_router, tracking  # noqa: F401 (fixture)
finally:
    sys.path.pop(0)

# The MTRouter tests' tiny pool, book and trajectories, as tests/stages/conftest.py shares them.
_spec = importlib.util.spec_from_file_location("mtrouter_fixtures", HERE.parent / "models/mtrouter/conftest.py")
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
tiny_cfg, pool, book, tables = _fixtures.tiny_cfg, _fixtures.pool, _fixtures.book, _fixtures.tables

QUERIES = ["What is 12 plus 30?", "Which city is the capital of Peru?"]
HUGE = ("What is 417 plus 86? Show the steps. " * 300_000)[:10_000_000]  # 10 MB, as in the issue


@pytest.fixture(scope="module")
def served() -> ServedRouter:
    train = routing_data(160, seed=5)
    return ServedRouter.from_fitted(surface_router().fit(train), train, BOOK.version, embedding=None,
                                    family="surface")


@pytest.fixture(scope="module")
def served_mt(pool, book, tiny_cfg, tables) -> ServedMTRouter:
    episodes, turns, prompts = tables
    return ServedMTRouter(MTRouter(pool, book, tiny_cfg).fit(episodes, turns, prompts), "tiny")


def input_error(call, frame) -> InputError:
    with pytest.raises(InputError) as err:
        call(frame)
    return err.value


# ---------------------------------------------------------------- single-turn router, in process


def test_a_misspelt_budget_column_is_rejected_not_ignored(served):
    err = input_error(served.predict, pd.DataFrame({"query": QUERIES, "budget": [BUDGET, BUDGET]}))
    assert err.field == "budget" and "did you mean 'budget_usd'" in err.problem


def test_an_unrelated_column_lists_what_the_model_reads(served):
    err = input_error(served.predict, pd.DataFrame({"query": QUERIES, "user_id": [1, 2]}))
    assert err.field == "user_id" and "query, budget_usd" in err.problem


@pytest.mark.parametrize("budget", [-1e-4, -np.inf, "cheap", "0.001", True])
def test_a_negative_or_non_numeric_budget_is_an_input_error(served, budget):
    err = input_error(served.predict, pd.DataFrame({"query": QUERIES, "budget_usd": [BUDGET, budget]}, dtype=object))
    assert err.field == "budget_usd[1]" and "number ≥ 0" in err.problem


def test_null_nan_and_infinite_budgets_mean_no_limit(served):
    unlimited = served.predict(QUERIES)
    for budget in (None, np.nan, np.inf):
        out = served.predict(pd.DataFrame({"query": QUERIES, "budget_usd": [budget, budget]}))
        pd.testing.assert_frame_equal(out, unlimited)
    broke = served.predict(pd.DataFrame({"query": QUERIES, "budget_usd": [0, 0.0]}))
    assert (broke.expected_cost_usd == min(served.bundle.expected_cost_usd.values())).all()


@pytest.mark.parametrize("query", [None, np.nan, "", "   ", 42])
def test_a_missing_or_blank_query_is_an_input_error_not_the_text_none(served, query):
    err = input_error(served.predict, pd.DataFrame({"query": [QUERIES[0], query], "budget_usd": [BUDGET, BUDGET]}))
    assert err.field == "query[1]"
    assert input_error(served.predict, [query]).field == "query[0]"


def test_a_10_mb_query_is_routed_on_its_first_max_text_chars_and_fast(served, caplog):
    with caplog.at_level(logging.WARNING, logger="evaluation.servable"):
        out = served.predict(pd.DataFrame({"query": [HUGE], "budget_usd": [BUDGET]}))
    # Uncapped, the text statistics alone took ~1.6 s and the encoder ~15 s; what keeps it fast is that
    # only the first MAX_TEXT_CHARS are read (the same answer as the head alone, asserted below), not a
    # wall-clock bound that a busy machine would break.
    head = served.predict(pd.DataFrame({"query": [HUGE[:MAX_TEXT_CHARS]], "budget_usd": [BUDGET]}))
    pd.testing.assert_frame_equal(out, head)
    assert "routed on their first 100000" in caplog.text
    assert len(served.routing_data([HUGE]).queries[0]) == MAX_TEXT_CHARS


# ---------------------------------------------------------------- single-turn router through MLflow


@pytest.mark.slow
def test_through_mlflow_a_misspelt_budget_fails_and_bad_values_are_input_errors(served, tracking):
    import mlflow
    from mlflow.exceptions import MlflowException

    from evaluation.registry import register

    model = mlflow.pyfunc.load_model(register(served, include_code=False).model_uri)
    # MLflow drops a column its signature does not name before predict() sees it; the required
    # budget_usd is what turns a misspelt `budget` into an error instead of "no limit".
    with pytest.raises(MlflowException, match=r"missing inputs \['budget_usd'\].*extra inputs: \['budget'\]"):
        model.predict(pd.DataFrame({"query": QUERIES, "budget": [BUDGET, BUDGET]}))
    with pytest.raises(MlflowException, match="budget_usd"):
        model.predict(pd.DataFrame({"query": QUERIES, "budget_usd": ["cheap", "dear"]}))
    with pytest.raises(InputError, match=r"budget_usd\[0\]"):
        model.predict(pd.DataFrame({"query": QUERIES, "budget_usd": [-1.0, BUDGET]}))
    with pytest.raises(InputError, match=r"query\[1\]"):
        model.predict(pd.DataFrame({"query": [QUERIES[0], None], "budget_usd": [BUDGET, BUDGET]}))
    request = pd.DataFrame({"query": QUERIES, "budget_usd": [None, BUDGET]})
    pd.testing.assert_frame_equal(model.predict(request), served.predict(request), check_dtype=False)


# ---------------------------------------------------------------- multi-turn MTRouter


def mt_frame(**columns) -> pd.DataFrame:
    history = json.dumps([{"action": "cheap says 1", "observation": "observation after turn 1"}])
    base = {"task": ["hard puzzle 99: combine 99 and 102", "easy puzzle 98: combine 98 and 101"],
            "history": ["[]", history]}
    return pd.DataFrame({**base, **columns})


def test_mtrouter_rejects_a_misspelt_budget_column(served_mt):
    err = input_error(served_mt.predict, mt_frame(budget=[0.0, 0.0]))
    assert err.field == "budget" and "did you mean 'budget_usd'" in err.problem
    err = input_error(served_mt.predict, mt_frame(turns=[0, 0]))
    assert err.field == "turns" and "did you mean 'turns_left'" in err.problem


@pytest.mark.parametrize("column, value", [
    ("budget_usd", "lots"), ("budget_usd", True), ("budget_usd", -0.5), ("turns_left", -1), ("turns_left", "3"),
])
def test_mtrouter_rejects_a_negative_or_non_numeric_limit(served_mt, column, value):
    err = input_error(served_mt.predict, mt_frame(**{column: pd.Series([1.0, value], dtype=object)}))
    assert err.field == f"{column}[1]"


@pytest.mark.parametrize("task", [None, np.nan, " "])
def test_mtrouter_rejects_a_missing_task(served_mt, task):
    assert input_error(served_mt.predict, mt_frame(task=[task, "x"])).field == "task[0]"


def test_mtrouter_reads_a_huge_task_from_its_start_and_a_huge_observation_from_its_end(served_mt):
    long_obs = json.dumps([{"action": "look", "observation": HUGE}])
    capped_obs = json.dumps([{"action": "look", "observation": HUGE[-MAX_TEXT_CHARS:]}])
    out = served_mt.predict(pd.DataFrame({"task": [HUGE, "short task"], "history": ["[]", long_obs]}))
    capped = served_mt.predict(pd.DataFrame({"task": [HUGE[:MAX_TEXT_CHARS], "short task"],
                                             "history": ["[]", capped_obs]}))
    pd.testing.assert_frame_equal(out, capped)


def test_mtrouter_through_mlflow_needs_every_column_so_a_typo_cannot_hide(served_mt, tracking):
    import mlflow
    from mlflow.exceptions import MlflowException

    from evaluation.registry import register

    model = mlflow.pyfunc.load_model(register(served_mt, include_code=False).model_uri)
    with pytest.raises(MlflowException, match=r"budget_usd.*extra inputs: \['budget'\]"):
        model.predict(mt_frame(candidates=[None, None], budget=[0.0, 0.0], turns_left=[None, None]))
    nulls = mt_frame(candidates=[None, None], budget_usd=[None, None], turns_left=[None, None])
    pd.testing.assert_frame_equal(model.predict(nulls), served_mt.predict(mt_frame()))
    with pytest.raises(InputError, match=r"turns_left\[0\]"):
        model.predict(nulls.assign(turns_left=[-1.0, 2.0]))
