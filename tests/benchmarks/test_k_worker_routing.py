"""benchmarks/k_worker_routing.py's --update: one router family is added to an earlier run's table
without refitting the others, and only when both runs read the same table, split and seeds."""

from __future__ import annotations

import json

import pytest


def result(rows: dict, seeds=(0, 1, 2), command="python benchmarks/k_worker_routing.py") -> dict:
    return {"price_book": "book-1", "workers": ["a", "b"], "seeds": list(seeds), "n": {"train": 6, "val": 2, "test": 2},
            "best_single": {"worker": "b", "accuracy": 0.6, "usd_per_query": 1.0}, "rows": rows,
            "timings_s": {name: 1.0 for name in rows}, "command": command}


def test_update_keeps_rows_not_rerun_and_replaces_those_rerun(bench, tmp_path):
    path = tmp_path / "k_worker_routing.json"
    path.write_text(json.dumps(result({"mf": {"acc_at_15": 0.4}, "knn": {"acc_at_15": 0.5}, "single:b": {}, "single:a": {}})))
    new = result({"knn": {"acc_at_15": 0.55}, "lexical": {"acc_at_15": 0.6}}, command="… --routers knn lexical")
    merged = bench.updated(new, path)
    assert merged["rows"] == {"knn": {"acc_at_15": 0.55}, "mf": {"acc_at_15": 0.4}, "lexical": {"acc_at_15": 0.6},
                              "single:a": {}, "single:b": {}}
    # the full run's order (single models in worker order, then the routers), not the JSON's sorted one
    assert list(merged["rows"]) == ["single:a", "single:b", "knn", "mf", "lexical"]
    assert set(merged["timings_s"]) == {"knn", "mf", "lexical", "single:a", "single:b"}
    assert merged["commands"] == ["python benchmarks/k_worker_routing.py", "… --routers knn lexical"]
    assert bench.updated(new, tmp_path / "absent.json") is new  # nothing earlier: the run as it is


def test_update_refuses_an_earlier_run_on_other_seeds(bench, tmp_path):
    path = tmp_path / "k_worker_routing.json"
    path.write_text(json.dumps(result({"mf": {"acc_at_15": 0.4}}, seeds=(0,))))
    with pytest.raises(SystemExit, match="another table, split or seeds"):
        bench.updated(result({"knn": {"acc_at_15": 0.5}}), path)
