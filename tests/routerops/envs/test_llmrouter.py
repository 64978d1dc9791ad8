"""Importing LLMRouter's nine-model table (routerops.envs.llmrouter, `routerops import-llmrouter`)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from routerops.envs.llmrouter import assign_splits, import_llmrouter, price_book_from_candidates, write_price_book
from routerops.envs.replay import load_logged_outcomes
from routerops.errors import InputError
from routerops.pricing import load_price_book

MODELS = ("cheap", "mid", "dear")


def write_source(tmp_path, n: int = 20):
    rows = []
    for i in range(n):
        scores = {"cheap": float(i % 2), "mid": 0.6 if i % 3 else 0.4, "dear": 1.0}
        # every other row stores the dict's Python repr, as some releases do
        rows.append({"question": f"question {i} " + "word " * i, "scores": scores if i % 2 else repr(scores),
                     "cluster_id": i % 3})
    path = tmp_path / "dcrouter.json"
    path.write_text(json.dumps(rows))
    candidates = {m: {"input_price": p, "output_price": p, "size": "7B"} for m, p in zip(MODELS, (0.1, 0.2, 0.9))}
    cpath = tmp_path / "cands.json"
    cpath.write_text(json.dumps(candidates))
    return path, cpath


def test_import_binarises_splits_and_keeps_clusters(tmp_path):
    path, _ = write_source(tmp_path)
    frame = import_llmrouter(path, count_tokens=len, completion_tokens=7)
    assert frame["query_id"].nunique() == 20 and sorted(frame["worker"].unique()) == sorted(MODELS)
    mid = frame[frame.worker == "mid"].set_index("query_id")
    assert mid.loc["dcrouter/0", "score"] == 0.0 and mid.loc["dcrouter/1", "score"] == 1.0  # > 0.5 = correct
    assert mid.loc["dcrouter/1", "raw_score"] == 0.6
    assert mid.loc["dcrouter/4", "dataset"] == "dcrouter/c1"
    assert mid.loc["dcrouter/3", "prompt_tokens"] == len("question 3 " + "word " * 3)
    assert (frame["completion_tokens"] == 7).all()
    per_query = frame.drop_duplicates("query_id")["split"].value_counts().to_dict()
    assert per_query == {"train": 12, "val": 4, "test": 4}
    again = import_llmrouter(path, count_tokens=len)
    assert (again["split"] == frame["split"]).all()  # seeded: the same split every time
    other = import_llmrouter(path, count_tokens=len, split_seed=1)
    assert not (other["split"] == frame["split"]).all()


def test_assign_splits_refuses_bad_fractions():
    labels = assign_splits(10, 0, (0.5, 0.3, 0.2))
    assert sorted(np.unique(labels, return_counts=True)[1]) == [2, 3, 5]
    with pytest.raises(InputError, match="fractions"):
        assign_splits(10, 0, (0.5, 0.6, 0.2))


def test_bad_scores_are_named(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"question": "q", "scores": {"a": 1.5}, "cluster_id": 0}]))
    with pytest.raises(InputError, match=r"\[0\]\.scores\.a"):
        import_llmrouter(path, count_tokens=len)


def test_price_book_round_trips(tmp_path):
    _, cpath = write_source(tmp_path)
    write_price_book(price_book_from_candidates(cpath), tmp_path / "book.yaml")
    book = load_price_book(tmp_path / "book.yaml")
    assert book.prices["dear"].input_per_1m == 0.9 and book.prices["cheap"].output_per_1m == 0.1


def test_command_writes_a_replayable_table(tmp_path):
    from cli.data import import_llmrouter_command

    path, cpath = write_source(tmp_path)
    args = argparse.Namespace(json=str(path), candidates=str(cpath), out=str(tmp_path / "t.parquet"),
                              prices_out=str(tmp_path / "p.yaml"), split_seed=0, fractions=[0.6, 0.2, 0.2],
                              completion_tokens=0)
    import_llmrouter_command(args)
    table = load_logged_outcomes(tmp_path / "t.parquet")
    assert set(table["split"]) == {"train", "val", "test"}
    assert set(load_price_book(tmp_path / "p.yaml").prices) == set(MODELS)


def test_the_real_table_imports_with_its_documented_accuracies(shared_data):
    frame = import_llmrouter(shared_data / "llmrouter" / "dcrouter_train.json", count_tokens=len)
    assert frame["query_id"].nunique() == 5608 and frame["worker"].nunique() == 9
    accuracy = frame.groupby("worker")["score"].mean()
    assert accuracy.idxmax() == "llama-3.1-nemotron-51b-instruct" and abs(accuracy.max() - 0.628) < 0.001
    assert abs(accuracy.min() - 0.175) < 0.001  # llama3-chatqa-1.5-8b (data README)
    book = price_book_from_candidates(shared_data / "llmrouter" / "llm_candidates.json")
    assert set(frame["worker"]) <= set(book["prices"])
