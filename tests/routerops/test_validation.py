"""The GX trajectory suite: a clean synthetic set passes; each corruption fails with its check named."""

from __future__ import annotations

import datetime as dt
import json

import pandas as pd
import pytest

from routerops import schema
from routerops.errors import InputError
from routerops.pricing import Pool, Price, PriceBook, WorkerSpec
from routerops.validation import check_trajectory_rows, validate_trajectories, write_validation_report

POOL = Pool(name="test", workers=(
    WorkerSpec(name="smol-direct", kind="llm", primitives=("answer",)),
    WorkerSpec(name="smol-cot", kind="llm", primitives=("answer",)),
    WorkerSpec(name="python", kind="python", primitives=("python",)),
))
BOOK = PriceBook(version="v-test", effective_date=dt.date(2026, 11, 1), prices={
    "smol-direct": Price(input_per_1m=0.10, output_per_1m=0.40, cached_input_per_1m=0.05),
    "smol-cot": Price(input_per_1m=2.50, output_per_1m=10.00, cached_input_per_1m=1.25),
    "python": Price(input_per_1m=0.0, output_per_1m=0.0, per_call=0.00002),
})
# Workers called by each episode, in turn order; the empty one stopped before any call.
EPISODE_WORKERS = [["smol-direct"], ["smol-direct", "smol-cot"], ["smol-cot", "python", "smol-cot"], []]


def typed(rows: list[dict], kind: str) -> pd.DataFrame:
    """Rows in the schema's column order and Arrow types (what read_table would return)."""
    frame = pd.DataFrame(rows, columns=schema.empty_frame(kind).columns)
    return schema.to_table(frame, kind).to_pandas()


def make_trajectories() -> tuple[pd.DataFrame, pd.DataFrame]:
    episodes, turns = [], []
    for e, workers in enumerate(EPISODE_WORKERS):
        eid = schema.episode_id("run-1", f"task-{e}", "random", 0)
        rows = []
        for i, worker in enumerate(workers):
            p, c, k = 100 + 17 * i + e, 20 + 3 * i, 10 * i
            rows.append({
                "episode_id": eid, "turn_index": i, "actor": "random", "worker": worker, "primitive": "answer",
                "subtask_id": "", "depends_on": "[]", "message": "q", "response": "a",
                "observation": "" if worker == "smol-direct" else f"observation {i}", "prompt_tokens": p,
                "completion_tokens": c, "cached_tokens": k, "latency_s": 0.1, "cost_usd": BOOK.cost(worker, p, c, k),
                "errors": "[]", "propensity": 1.0 / 3,
            })
        turns += rows
        episodes.append({
            "episode_id": eid, "run_id": "run-1", "task_id": f"task-{e}", "suite": "s", "split": "test",
            "policy": "random", "policy_version": "1", "seed": 0, "budget_usd": 1.0, "turn_limit": 4,
            "price_book_version": BOOK.version, "final_answer": "a", "score": 1.0 if e % 2 else 0.0,
            "success": bool(e % 2), "turns": len(rows),
            "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
            "completion_tokens": sum(r["completion_tokens"] for r in rows),
            "cached_tokens": sum(r["cached_tokens"] for r in rows),
            "cost_usd": sum(r["cost_usd"] for r in rows), "ended_by": "done", "error": "",
        })
    return typed(episodes, "episodes"), typed(turns, "turns")


@pytest.fixture(scope="module")
def clean() -> tuple[pd.DataFrame, pd.DataFrame]:
    return make_trajectories()


@pytest.mark.slow
def test_clean_set_passes(clean):
    episodes, turns = clean
    report = validate_trajectories(episodes, turns, POOL, BOOK)
    assert report.passed, [(f.check, f.examples) for f in report.failures()]
    assert (report.n_episodes, report.n_turns) == (4, 6)
    checks = {r.check for r in report.results}
    assert {"episode_id_unique", "turn_key_unique", "turn_index_contiguous", "turn_count_matches",
            "tokens_non_negative", "turn_cost_derived", "episode_cost_is_sum", "worker_in_pool", "score_in_range",
            "propensity_in_range", "ended_by_known", "turn_episode_exists", "observation_present"} <= checks


def corrupt(frame: pd.DataFrame, row: int, column: str, value) -> pd.DataFrame:
    frame = frame.copy()
    frame.loc[frame.index[row], column] = value
    return frame


def duplicate_episode(e, t):
    return pd.concat([e, e.iloc[[1]]], ignore_index=True), t


def gap_in_turn_index(e, t):
    return e, corrupt(t, 5, "turn_index", 3)  # episode 2 has turns 0, 1, 3


def negative_tokens(e, t):
    return e, corrupt(t, 0, "completion_tokens", -5)


def typed_in_cost(e, t):
    return e, corrupt(t, 1, "cost_usd", 0.01)


def unknown_worker(e, t):
    return e, corrupt(t, 0, "worker", "gpt-99")


def score_above_one(e, t):
    return corrupt(e, 0, "score", 1.5), t


def zero_propensity(e, t):
    return e, corrupt(t, 2, "propensity", 0.0)


def missing_observation(e, t):
    return e, corrupt(t, 3, "observation", None)  # "" would be valid: the environment said nothing


def unknown_end_reason(e, t):
    return corrupt(e, 0, "ended_by", "crashed"), t


def orphan_turn(e, t):
    return e.iloc[1:], t  # episode 0's turn now has no episode


def wrong_turn_count(e, t):
    return corrupt(e, 1, "turns", 3), t


def episode_cost_not_sum(e, t):
    return corrupt(e, 2, "cost_usd", float(e["cost_usd"].iloc[2]) * 1.01), t


def repeated_turn(e, t):
    return e, pd.concat([t, t.iloc[[0]]], ignore_index=True)


@pytest.mark.parametrize("damage, check, table, column", [
    (duplicate_episode, "episode_id_unique", "episodes", "episode_id"),
    (gap_in_turn_index, "turn_index_contiguous", "turns", "turn_index"),
    (negative_tokens, "tokens_non_negative", "turns", "completion_tokens"),
    (typed_in_cost, "turn_cost_derived", "turns", "cost_usd"),
    (unknown_worker, "worker_in_pool", "turns", "worker"),
    (score_above_one, "score_in_range", "episodes", "score"),
    (zero_propensity, "propensity_in_range", "turns", "propensity"),
    (missing_observation, "observation_present", "turns", "observation"),
    (unknown_end_reason, "ended_by_known", "episodes", "ended_by"),
    (orphan_turn, "turn_episode_exists", "turns", "episode_id"),
    (wrong_turn_count, "turn_count_matches", "episodes", "turns"),
    (episode_cost_not_sum, "episode_cost_is_sum", "episodes", "cost_usd"),
    (repeated_turn, "turn_key_unique", "turns", "episode_id,turn_index"),
])
def test_each_corruption_fails_with_its_check(clean, damage, check, table, column):
    episodes, turns = damage(*clean)
    report = validate_trajectories(episodes, turns, POOL, BOOK)
    assert not report.passed
    failed = [f for f in report.failures() if f.check == check]
    assert failed, f"{check} did not fail; failures: {report.failed_checks()}"
    assert failed[0].table == table and failed[0].column == column
    assert failed[0].unexpected_count >= 1 and failed[0].examples


def test_examples_name_the_failing_row(clean):
    episodes, turns = score_above_one(*clean)
    failure = next(f for f in validate_trajectories(episodes, turns, POOL, BOOK).failures()
                   if f.check == "score_in_range")
    assert failure.examples == [{"score": 1.5, "episode_id": episodes["episode_id"].iloc[0]}]


def test_typed_in_cost_is_caught_but_repricing_passes(clean):
    """A new price book re-prices the turns; the stored costs are then wrong until recomputed."""
    episodes, turns = clean
    cheaper = PriceBook(version="v-next", effective_date=dt.date(2027, 1, 1),
                        prices={w: Price(p.input_per_1m / 2, p.output_per_1m / 2, p.cached_input_per_1m / 2,
                                         p.per_call) for w, p in BOOK.prices.items()})
    stale = validate_trajectories(episodes.assign(price_book_version="v-next"), turns, POOL, cheaper)
    assert {"turn_cost_derived", "episode_cost_is_sum"} & stale.failed_checks() == {"turn_cost_derived"}
    from routerops.pricing import derive_costs

    repriced = turns.assign(cost_usd=derive_costs(turns, cheaper))
    sums = repriced.groupby("episode_id")["cost_usd"].sum()
    e2 = episodes.assign(price_book_version="v-next", cost_usd=episodes["episode_id"].map(sums).fillna(0.0))
    assert validate_trajectories(e2, repriced, POOL, cheaper).passed


def test_check_trajectory_rows_names_file_and_field(clean, tmp_path):
    episodes, turns = negative_tokens(*clean)
    with pytest.raises(InputError) as err:
        check_trajectory_rows(episodes, turns, POOL, BOOK, tmp_path / "episodes.parquet", tmp_path / "turns.parquet")
    assert err.value.path.endswith("turns.parquet")
    assert err.value.field in {"completion_tokens", "cost_usd"}
    assert "turns.parquet" in str(err.value) and err.value.field in str(err.value)


def test_check_trajectory_rows_reports_a_broken_type(clean):
    episodes, turns = clean
    broken = turns.astype({"turn_index": object})
    broken.loc[0, "turn_index"] = "first"
    with pytest.raises(InputError, match="turn_index") as err:
        check_trajectory_rows(episodes, broken, POOL, BOOK, "e.parquet", "t.parquet")
    assert (err.value.path, err.value.field) == ("t.parquet", "turn_index")


def test_check_trajectory_rows_returns_report_when_clean(clean):
    assert check_trajectory_rows(*clean, POOL, BOOK).passed


def test_write_validation_report_is_json_and_atomic(clean, tmp_path):
    episodes, turns = unknown_worker(*clean)
    report = validate_trajectories(episodes, turns, POOL, BOOK)
    path = write_validation_report(report, tmp_path / "out" / "validation.json")
    data = json.loads(path.read_text())
    assert data["passed"] is False
    assert any(r["check"] == "worker_in_pool" and not r["success"] for r in data["results"])
    assert sorted(p.name for p in path.parent.iterdir()) == ["validation.json"]
