"""Logged outcomes: validation, the wide routing view, RouteLLM's GSM8K table, replay episodes."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evaluation.replay import to_routing_data  # the wide view routers use lives with them
from routerops.envs.jsonl_qa import import_jsonl_qa
from routerops.envs.replay import (
    ReplayEnvironment,
    final_worker,
    import_routellm_gsm8k,
    load_logged_outcomes,
    replay_tasks,
    replay_workers,
    smollm2_token_counter,
    validate_logged_outcomes,
    write_logged_outcomes,
)
from routerops.errors import InputError
from routerops.policies import SinglePolicy
from routerops.pricing import Price, PriceBook, load_price_book
from routerops.rollout import run_episode, worst_case_cost
from routerops.types import Action, EpisodeState, TurnRecord

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO / "../shared/data"
ROUTELLM = SHARED / "routellm"
shared = pytest.mark.skipif(not ROUTELLM.is_dir(), reason="../shared/data/routellm is absent")

BOOK = PriceBook(version="unit", effective_date=dt.date(2026, 1, 1),
                 prices={"big": Price(10.0, 30.0), "small": Price(0.5, 1.0, per_call=1e-4)})


def table() -> pd.DataFrame:
    """3 queries × 2 workers; `small` is right on q1 only, `big` on q1 and q2."""
    rows = []
    for i, (q, ans) in enumerate([("What is 2 + 2?", 4), ("What is 12 * 12?", 144), ("What is 7 / 0?", 0)]):
        for worker, right in (("small", i == 0), ("big", i < 2)):
            rows.append({"dataset": "unit", "query_id": f"q{i}", "query": q, "worker": worker,
                         "score": float(right), "prompt_tokens": 10 + i, "completion_tokens": 5 * (i + 1),
                         "response": f"Work.\n#### {ans if right else ans + 1}"})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- validation


def test_a_valid_table_round_trips_through_parquet_and_csv(tmp_path):
    df = table()
    df.attrs["prompt_prefix"] = "Q: 1+1\nA: 2\n\n"
    parquet = load_logged_outcomes(write_logged_outcomes(df, tmp_path / "t.parquet"))
    assert parquet.attrs["prompt_prefix"] == df.attrs["prompt_prefix"]
    df.to_csv(tmp_path / "t.csv", index=False)
    csv = load_logged_outcomes(tmp_path / "t.csv")
    for loaded in (parquet, csv):
        pd.testing.assert_frame_equal(loaded[df.columns].reset_index(drop=True), validate_logged_outcomes(df),
                                      check_dtype=False)
        assert loaded["prompt_tokens"].dtype == np.int64 and loaded["score"].dtype == np.float64


def test_csv_keeps_ids_as_text_and_booleans_count_as_scores(tmp_path):
    df = table().assign(query_id=lambda d: d["query_id"].str.replace("q", "00"))
    df.to_csv(tmp_path / "t.csv", index=False)
    assert set(load_logged_outcomes(tmp_path / "t.csv")["query_id"]) == {"000", "001", "002"}
    assert validate_logged_outcomes(table().assign(score=lambda d: d["score"] > 0.5))["score"].tolist() == \
        table()["score"].tolist()


def _drop_row(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(index=3)


BAD_TABLES = {
    "duplicate pair": (lambda d: pd.concat([d, d.iloc[[2]]]), "query_id"),
    "missing worker for a query": (_drop_row, "worker"),
    "score above 1": (lambda d: d.assign(score=[0, 1, 1.5, 0, 0, 0]), "score"),
    "score below 0": (lambda d: d.assign(score=[0, 1, -0.1, 0, 0, 0]), "score"),
    "score not a number": (lambda d: d.assign(score=["x", "1", "1", "0", "0", "0"]), "score"),
    "negative prompt tokens": (lambda d: d.assign(prompt_tokens=[1, 2, -3, 4, 5, 6]), "prompt_tokens"),
    "fractional completion tokens": (lambda d: d.assign(completion_tokens=[1, 2.5, 3, 4, 5, 6]), "completion_tokens"),
    "missing column": (lambda d: d.drop(columns="completion_tokens"), "completion_tokens"),
    "empty worker": (lambda d: d.assign(worker=["small", "big", "", "big", "small", "big"]), "worker"),
    "query text differs per worker": (lambda d: d.assign(query=["a", "b", "c", "c", "d", "d"]), "query"),
}


@pytest.mark.parametrize("case", list(BAD_TABLES))
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_bad_tables_raise_input_error_naming_file_and_field(tmp_path, case, suffix):
    mutate, field = BAD_TABLES[case]
    path = tmp_path / f"bad{suffix}"
    bad = mutate(table())
    bad.to_csv(path, index=False) if suffix == ".csv" else bad.to_parquet(path, index=False)
    with pytest.raises(InputError) as err:
        load_logged_outcomes(path)
    assert (err.value.path, err.value.field) == (str(path), field), err.value


def test_missing_file_and_unknown_type_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        load_logged_outcomes(tmp_path / "absent.parquet")
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(InputError, match="unsupported file type"):
        load_logged_outcomes(tmp_path / "t.json")


def test_writing_an_invalid_table_leaves_nothing(tmp_path):
    with pytest.raises(InputError):
        write_logged_outcomes(_drop_row(table()), tmp_path / "t.parquet")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- the wide routing view


def test_routing_data_is_wide_with_costs_from_the_price_book():
    shuffled = table().sample(frac=1.0, random_state=3)
    data = to_routing_data(shuffled, BOOK, embed=lambda texts: np.ones((len(texts), 4)))
    by_id = {q: i for i, q in enumerate(data.query_ids)}
    assert sorted(data.query_ids) == ["q0", "q1", "q2"] and sorted(data.workers) == ["big", "small"]
    for row in table().to_dict("records"):
        i, j = by_id[row["query_id"]], data.workers.index(row["worker"])
        assert data.scores[i, j] == row["score"]
        assert data.costs[i, j] == pytest.approx(BOOK.cost(row["worker"], row["prompt_tokens"], row["completion_tokens"]))
        assert data.responses[i][j] == row["response"] and data.queries[i] == row["query"]
    assert data.embeddings.shape == (3, 4) and data.embeddings.dtype == np.float32


def test_routing_data_needs_a_price_for_every_worker():
    book = PriceBook(version="v9", effective_date=dt.date(2026, 1, 1), prices={"big": Price(1.0, 1.0)})
    with pytest.raises(InputError) as err:
        to_routing_data(table(), book)
    assert err.value.field == "prices.small"


def test_the_routellm_price_book():
    book = load_price_book(REPO / "configs/prices/routellm-2024.yaml")
    assert book.effective_date == dt.date(2024, 6, 1) and book.version == "routellm-2024"
    assert book.cost("gpt-4-1106-preview", 1_000_000, 1_000_000) == pytest.approx(40.0)
    assert book.cost("mistralai/Mixtral-8x7B-Instruct-v0.1", 1_000_000, 1_000_000) == pytest.approx(1.2)


# ---------------------------------------------------------------- replay episodes through the rollout engine


async def test_single_worker_replay_scores_and_prices_the_logged_outcome():
    df, env = table(), ReplayEnvironment(table())
    workers = replay_workers(df)
    for task in replay_tasks(df):
        for worker in ("small", "big"):
            episode, turns = await run_episode(task, SinglePolicy(worker), env, workers, BOOK, 1.0, 2, "r", 0)
            row = df[(df.query_id == task.task_id) & (df.worker == worker)].iloc[0]
            assert episode["score"] == row["score"] and episode["success"] == (row["score"] == 1.0)
            assert (turns[0]["prompt_tokens"], turns[0]["completion_tokens"]) == (row["prompt_tokens"],
                                                                                  row["completion_tokens"])
            assert turns[0]["response"] == row["response"]
            assert episode["cost_usd"] == pytest.approx(BOOK.cost(worker, row["prompt_tokens"], row["completion_tokens"]))
            assert episode["final_answer"] == row["response"].rsplit("#### ", 1)[1]


class SmallThenBig:
    """Calls `small`, then `big`, then stops."""

    name, version, seed = "small-then-big", "1", 0

    def act(self, state, actions, rng):
        order = [Action("small", "answer"), Action("big", "answer")]
        return order[len(state.turns)] if len(state.turns) < 2 else Action("", "stop")


async def test_the_final_workers_logged_score_is_the_episode_score():
    df = table()
    task = replay_tasks(df)[1]  # q1: small wrong, big right
    episode, turns = await run_episode(task, SmallThenBig(), ReplayEnvironment(df), replay_workers(df), BOOK,
                                       1.0, 3, "r", 0)
    assert [t["worker"] for t in turns] == ["small", "big"] and episode["score"] == 1.0


def test_a_failed_call_does_not_count_as_the_final_answer():
    def turn(worker, errors):
        return TurnRecord(0, "p", worker, "answer", "", "", 0, 0, 0, 0.0, 0.0, errors, 1.0)

    state = EpisodeState(task=replay_tasks(table())[1],
                         turns=[turn("big", []), turn("small", [{"rule": "worker_error", "severity": "high"}])])
    assert final_worker(state) == "big" and ReplayEnvironment(table()).score(state) == 1.0
    assert final_worker(EpisodeState(task=state.task)) is None


def test_replay_workers_declare_the_logged_prefix_and_completion_cap():
    df = table()
    df.attrs["prompt_prefix"] = "Question: 1+1\nAnswer: 2\n\n"
    workers = replay_workers(df)
    assert workers["big"].spec.generation == {"max_tokens": 15, "system": df.attrs["prompt_prefix"]}
    assert workers["small"].spec.primitives == ("answer",)


# ---------------------------------------------------------------- RouteLLM's GSM8K table (real data)


def test_smollm2_tokenizer_counts_real_bpe_tokens():
    count = smollm2_token_counter()
    assert count("Hello world") == 2
    assert count("") == 0 and count("Natalia sold clips to 48 of her friends") > 5


def test_loading_the_tokenizer_prints_nothing(capfd):
    """llama.cpp's log goes to a logger: a vocab-only load printed a context warning in every replay."""
    smollm2_token_counter.cache_clear()
    assert smollm2_token_counter()("Hello world") == 2
    out = capfd.readouterr()
    assert "llama_context" not in out.err + out.out


@pytest.fixture(scope="module")
def routellm() -> pd.DataFrame:
    return import_routellm_gsm8k(ROUTELLM / "gsm8k_responses.csv", ROUTELLM / "gsm8k_contaminated_prompts.jsonl")


@shared
@pytest.mark.shared
def test_routellm_gsm8k_matches_the_published_accuracies(routellm):
    assert routellm["query_id"].nunique() == 1307 and len(routellm) == 2 * 1307
    wide = routellm.pivot(index="query_id", columns="worker", values="score")
    assert wide["gpt-4-1106-preview"].mean() == pytest.approx(0.858, abs=0.001)
    assert wide["mistralai/Mixtral-8x7B-Instruct-v0.1"].mean() == pytest.approx(0.637, abs=0.001)
    assert wide.max(axis=1).mean() == pytest.approx(0.930, abs=0.001)
    assert routellm.attrs["prompt_tokens_basis"] == "question"
    assert (routellm["prompt_tokens"] > 0).all() and (routellm["completion_tokens"] > 0).all()


@shared
@pytest.mark.shared
def test_routellm_query_ids_join_the_gsm8k_test_tasks(routellm):
    tasks = {t.task_id: t for t in import_jsonl_qa(SHARED / "gsm8k/test.jsonl", "gsm8k", "gsm8k", "test")}
    queries = routellm.drop_duplicates("query_id")
    assert all(tasks[q].prompt == text for q, text in zip(queries["query_id"], queries["query"]))
    dropped = set(tasks) - set(queries["query_id"])
    assert len(dropped) == 12 and "gsm8k/test/0" in dropped  # Janet's ducks is contaminated


@shared
@pytest.mark.shared
def test_routellm_without_the_contamination_list_keeps_all_rows():
    df = import_routellm_gsm8k(ROUTELLM / "gsm8k_responses.csv")
    assert df["query_id"].nunique() == 1319


@shared
@pytest.mark.shared
@pytest.mark.slow
def test_routellm_eight_shot_prompt_tokens_and_budget_bound(routellm):
    eight = import_routellm_gsm8k(ROUTELLM / "gsm8k_responses.csv", ROUTELLM / "gsm8k_contaminated_prompts.jsonl",
                                  train_path=SHARED / "gsm8k/train.jsonl")
    assert eight.attrs["prompt_tokens_basis"] == "8-shot" and eight.attrs["prompt_prefix"].count("Question: ") == 8
    extra = eight["prompt_tokens"].to_numpy() - routellm["prompt_tokens"].to_numpy()
    assert extra.min() > 1000  # the 8 worked examples
    # The rollout engine's worst-case bound (bytes of the request + the declared prefix) covers
    # every logged call, so a budget enforced before a replayed call is never overrun.
    book = load_price_book(REPO / "configs/prices/routellm-2024.yaml")
    env, workers = ReplayEnvironment(eight), replay_workers(eight)
    tasks = {t.task_id: t for t in replay_tasks(eight)}
    for row in eight.to_dict("records"):
        payload = env.request(EpisodeState(task=tasks[row["query_id"]]), "answer")
        bound = worst_case_cost(workers[row["worker"]].spec, payload, book)
        assert bound >= book.cost(row["worker"], row["prompt_tokens"], row["completion_tokens"])


def test_bad_routellm_csv_names_the_column(tmp_path):
    path = tmp_path / "r.csv"
    pd.DataFrame({"prompt": ["q"], "m": ["maybe"], "m_response": ["r"]}).to_csv(path, index=False)
    with pytest.raises(InputError) as err:
        import_routellm_gsm8k(path)
    assert (err.value.path, err.value.field) == (str(path), "m")
    pd.DataFrame({"question": ["q"], "m": ["True"], "m_response": ["r"]}).to_csv(path, index=False)
    with pytest.raises(InputError) as err:
        import_routellm_gsm8k(path)
    assert err.value.field == "prompt"


def test_routellm_cells_with_newlines_and_commas_survive(tmp_path):
    path = tmp_path / "r.csv"
    pd.DataFrame({"prompt": ["a, b?", "c?"], "m": ["True", "False"], "m_response": ["x\ny, z\n#### 3", ""],
                  "n": ["False", "False"], "n_response": ["", "#### 4"]}).to_csv(path, index=False)
    df = import_routellm_gsm8k(path, count_tokens=smollm2_token_counter())
    assert df["response"].tolist() == ["x\ny, z\n#### 3", "", "", "#### 4"]
    assert df["score"].tolist() == [1.0, 0.0, 0.0, 0.0] and df["query_id"].tolist()[0] == "gsm8k/test/0"
    assert df["completion_tokens"].tolist()[1] == 0
