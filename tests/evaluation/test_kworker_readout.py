"""evaluation/kworker_readout.py (the read-outs of experiments/k_worker_*.py): --update: one router family is added to an earlier run's table
without refitting the others, and only when both runs read the same table, split and seeds."""

from __future__ import annotations

import json

import pytest

from evaluation import kworker_readout


def result(rows: dict, seeds=(0, 1, 2), command="python experiments/k_worker_routing.py") -> dict:
    return {"price_book": "book-1", "workers": ["a", "b"], "seeds": list(seeds), "n": {"train": 6, "val": 2, "test": 2},
            "best_single": {"worker": "b", "accuracy": 0.6, "usd_per_query": 1.0}, "rows": rows,
            "timings_s": {name: 1.0 for name in rows}, "command": command}


def test_update_keeps_rows_not_rerun_and_replaces_those_rerun(tmp_path):
    path = tmp_path / "k_worker_routing.json"
    path.write_text(json.dumps(result({"mf": {"acc_at_15": 0.4}, "knn": {"acc_at_15": 0.5}, "single:b": {}, "single:a": {}})))
    new = result({"knn": {"acc_at_15": 0.55}, "lexical": {"acc_at_15": 0.6}}, command="… --routers knn lexical")
    merged = kworker_readout.updated(new, path)
    assert merged["rows"] == {"knn": {"acc_at_15": 0.55}, "mf": {"acc_at_15": 0.4}, "lexical": {"acc_at_15": 0.6},
                              "single:a": {}, "single:b": {}}
    # the full run's order (single models in worker order, then the routers), not the JSON's sorted one
    assert list(merged["rows"]) == ["single:a", "single:b", "knn", "mf", "lexical"]
    assert set(merged["timings_s"]) == {"knn", "mf", "lexical", "single:a", "single:b"}
    assert merged["commands"] == ["python experiments/k_worker_routing.py", "… --routers knn lexical"]
    assert kworker_readout.updated(new, tmp_path / "absent.json") is new  # nothing earlier: the run as it is


def test_update_refuses_an_earlier_run_on_other_seeds(tmp_path):
    path = tmp_path / "k_worker_routing.json"
    path.write_text(json.dumps(result({"mf": {"acc_at_15": 0.4}}, seeds=(0,))))
    with pytest.raises(SystemExit, match="another table, split or seeds"):
        kworker_readout.updated(result({"knn": {"acc_at_15": 0.5}}), path)


def _ops(correct, paid):
    from types import SimpleNamespace

    import numpy as np

    return SimpleNamespace(correct=np.asarray(correct, dtype=float), paid=np.asarray(paid, dtype=float))


def _table(n: int = 200):
    import numpy as np

    from models.base import RoutingData

    rng = np.random.default_rng(0)
    scores = (rng.random((n, 2)) < [0.5, 0.7]).astype(float)
    return RoutingData(query_ids=[f"q{i}" for i in range(n)], queries=[f"q{i}" for i in range(n)], workers=["a", "b"],
                       scores=scores, costs=np.tile([0.1, 1.0], (n, 1)))


def test_paired_difference_of_a_router_with_itself_is_exactly_zero():
    import numpy as np

    test = _table()
    rng = np.random.default_rng(1)
    ops = _ops(rng.random((3, len(test))) < 0.6, np.tile([[0.1], [0.3], [1.0]], (1, len(test))))
    assert kworker_readout.difference_interval(ops, ops, test, best=1, fraction=0.5) == (0.0, 0.0)


def test_paired_interval_is_narrower_than_the_gap_intervals_apart():
    import numpy as np

    test = _table()
    rng = np.random.default_rng(2)
    base = rng.random(len(test)) < 0.6
    better = base.copy()
    better[np.flatnonzero(~base)[:10]] = True  # right on ten more queries, the rest the same
    paid = np.full((1, len(test)), 0.1)
    a, b = _ops(better[None, :], paid), _ops(base[None, :], paid)
    lo, hi = kworker_readout.difference_interval(a, b, test, best=1, fraction=0.15)
    assert 0 < lo <= 10 / len(test) <= hi  # every resample keeps A ahead: the shared queries cancel
    (a_lo, a_hi), (b_lo, b_hi) = (kworker_readout.gap_interval(o, test, 1, 0.15) for o in (a, b))
    assert hi - lo < (a_hi - a_lo) and a_lo - b_hi < 0  # the separate intervals overlap; the paired one does not
    assert kworker_readout.difference_interval(a, b, test, best=1, fraction=0.05) == (None, None)  # nothing within 5 %


def test_update_keeps_pairs_not_rerun(tmp_path):
    path = tmp_path / "k_worker_routing.json"
    old = {**result({"knn": {}}), "paired_differences": [{"first": "a", "second": "b", "difference_at_15": 0.1},
                                                          {"first": "c", "second": "b", "difference_at_15": 0.2}]}
    path.write_text(json.dumps(old))
    new = {**result({"knn": {}}), "paired_differences": [{"first": "a", "second": "b", "difference_at_15": 0.3}]}
    pairs = kworker_readout.updated(new, path)["paired_differences"]
    assert pairs == [{"first": "a", "second": "b", "difference_at_15": 0.3}, {"first": "c", "second": "b", "difference_at_15": 0.2}]


def test_pairs_parse_names_with_spaces_and_must_be_scored_in_the_run():
    import argparse

    assert kworker_readout.parse_pair("knn:knn [in-cluster 5-fold]") == ("knn", "knn [in-cluster 5-fold]")
    with pytest.raises(argparse.ArgumentTypeError, match="expected first:second"):
        kworker_readout.parse_pair("knn")
    parser = argparse.ArgumentParser()
    kworker_readout.check_pairs(parser, [("knn", "mf")], {"knn", "mf"})  # both scored: no error
    with pytest.raises(SystemExit):  # argparse's error exits with status 2
        kworker_readout.check_pairs(parser, [("knn", "lexical")], {"knn", "mf"})
