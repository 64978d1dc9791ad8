"""experiments/k_worker_transfer.py's GSM8K protocol: RouteLLM's table split by the number of calculator
steps in GSM8K's reference solution, with prompt-only costs (no router may read the logged answer's
length), and one fit → score → APGR row on a tiny slice."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments"))

import k_worker_transfer as kt  # noqa: E402

SHARED_DATA = REPO.parent / "shared" / "data"  # as tests/conftest.py


@pytest.fixture(scope="module")
def gsm8k():
    if not SHARED_DATA.is_dir():  # conftest's shared_data fixture is per test; this loads once a module
        pytest.skip("../shared/data is absent (only CI and developers have it)")
    return SHARED_DATA, *kt.load_routellm_gsm8k(SHARED_DATA)


def test_gsm8k_table_is_split_by_solution_steps(gsm8k):
    shared, data, steps = gsm8k
    assert len(data) == 1307 and data.workers and len(data.workers) == 2  # RouteLLM's kept prompts
    lines = (shared / "gsm8k" / "test.jsonl").read_text(encoding="utf-8").splitlines()
    for i in (0, 100, len(data) - 1):  # query_id gsm8k/test/<line> names the reference solution
        row = json.loads(lines[int(data.query_ids[i].rsplit("/", 1)[1])])
        assert data.queries[i].strip() == row["question"].strip()
        assert steps[i] == row["answer"].count("<<")
    easy = steps <= kt.GSM8K_MAX_EASY_STEPS
    assert easy.sum() == 797 and (~easy).sum() == 510
    assert data.responses is None  # routers see prompts only


def test_gsm8k_costs_are_the_prompts_alone(gsm8k):
    _, data, _ = gsm8k
    # prompt-only pricing: both workers' costs are one price ratio apart on every query (the
    # completions, whose length differs per model and per answer, are not priced in)
    ratio = data.costs[:, 0] / data.costs[:, 1]
    assert np.allclose(ratio, ratio[0])


def test_one_transfer_row_scores_apgr_with_an_interval(gsm8k):
    _, data, steps = gsm8k
    easy = np.flatnonzero(steps <= kt.GSM8K_MAX_EASY_STEPS)[:300]
    hard = np.flatnonzero(steps > kt.GSM8K_MAX_EASY_STEPS)[:200]
    train, scored = data.subset(easy), data.subset(hard)
    quality = kt.fitted("logistic", train, scored).predict_quality(scored)
    row = kt._apgr_row("easy→hard", "logistic", len(train), scored, quality)
    assert 0.0 < row["apgr"] < 1.0 and row["apgr_lo"] <= row["apgr"] <= row["apgr_hi"]


def _easy_hard_slices(data, steps):
    easy = np.flatnonzero(steps <= kt.GSM8K_MAX_EASY_STEPS)[:300]
    hard = np.flatnonzero(steps > kt.GSM8K_MAX_EASY_STEPS)[:200]
    return data.subset(easy), data.subset(hard)


def test_an_ensemble_is_its_members_mean_and_each_member_is_fitted_once(gsm8k):
    from models.registry import ENSEMBLES, make_router

    _, data, steps = gsm8k
    train, scored = _easy_hard_slices(data, steps)
    memo: dict = {}
    quality = kt.quality_of("lexical_ensemble", train, scored, scored, memo)
    assert set(memo) == {"lexical_ensemble", *ENSEMBLES["lexical_ensemble"]}  # members memoised for reuse
    direct = make_router("lexical_ensemble", 0).fit(train).predict_quality(scored)  # EnsembleRouter itself
    np.testing.assert_allclose(quality, direct)
    assert kt.quality_of("lexical", train, scored, scored, memo) is memo["lexical"]  # not refitted


def test_lexical_vocabularies_come_from_the_training_part_only(gsm8k):
    from models.baselines.linear import word_ngrams

    _, data, steps = gsm8k
    train, scored = _easy_hard_slices(data, steps)
    featurizer = kt.fitted("lexical", train, scored).featurizer
    seen = set().union(*(word_ngrams(q) for q in train.queries))
    assert set(featurizer.word_.vocabulary_) <= seen
    unseen = set().union(*(word_ngrams(q) for q in scored.queries)) - seen
    assert unseen and not unseen & set(featurizer.word_.vocabulary_)  # target-only words stay out


def test_update_keeps_the_rows_of_routers_not_rerun(tmp_path):
    out = tmp_path / "transfer.json"
    old = [{"router": "knn", "apgr": 0.7}, {"router": "random", "apgr": 0.5}]
    out.write_text(json.dumps({"sample_fraction": 0.1, "rows": old}), encoding="utf-8")
    rows = kt.merged_rows(out, [{"router": "random", "apgr": 0.49}, {"router": "lexical", "apgr": 0.66}], 0.1)
    assert rows == [{"router": "knn", "apgr": 0.7}, {"router": "random", "apgr": 0.49}, {"router": "lexical", "apgr": 0.66}]
    with pytest.raises(ValueError, match="--sample"):
        kt.merged_rows(out, rows, 0.2)
    with pytest.raises(FileNotFoundError, match="--update"):
        kt.merged_rows(tmp_path / "absent.json", rows, 0.1)


def test_the_mean_interval_resamples_each_held_out_part_on_its_own():
    rng = np.random.default_rng(0)
    by_part = {"c0": rng.normal(0.6, 0.05, 1000), "c1": rng.normal(0.8, 0.05, 1000)}
    by_part["c1"][3] = np.nan  # APGR undefined on one replicate: that replicate is dropped
    lo, hi = kt.mean_interval(by_part, ["c0", "c1"])
    assert lo < 0.7 < hi
    # independent parts average out: the mean's interval is narrower than either part's
    assert hi - lo < min(np.subtract(*kt.percentile_interval(v)[::-1]) for v in by_part.values())
    assert kt.mean_interval(by_part, ["c0", "c1", "c2"]) is None  # a part never scored: no interval


def _two_worker_table(n: int = 400, seed: int = 0):
    """A synthetic two-worker table: the strong worker right on 80 % of queries, the weak on 55 %, and a
    router's quality signal that tracks which one is right, plus a second router reading the same
    signal with a little noise of its own (two routers that share most of their per-query errors)."""
    from models.base import RoutingData

    rng = np.random.default_rng(seed)
    weak, strong = rng.random(n) < 0.55, rng.random(n) < 0.8
    data = RoutingData(query_ids=[f"q{i}" for i in range(n)], queries=[f"query {i}" for i in range(n)],
                       workers=["weak", "strong"], scores=np.c_[weak, strong].astype(float),
                       costs=np.tile([0.1, 0.9], (n, 1)))
    signal = (strong.astype(float) - weak) + rng.normal(0, 0.8, n)
    quality = np.c_[np.zeros(n), signal]
    other = np.c_[np.zeros(n), signal + rng.normal(0, 0.3, n)]
    return data, quality, other


def test_a_router_paired_with_itself_differs_by_exactly_zero():
    data, quality, _ = _two_worker_table()
    diffs = kt.paired_resamples(quality, quality.copy(), data)
    assert diffs.shape == (1000,) and np.all(diffs[~np.isnan(diffs)] == 0.0)
    assert kt.percentile_interval(diffs) == (0.0, 0.0)


def test_the_paired_difference_reads_both_routers_on_the_same_resamples():
    from evaluation.replay import resample_counts

    data, quality, other = _two_worker_table()
    diffs = kt.paired_resamples(quality, other, data, n_boot=200)
    counts = resample_counts(len(data), 200, 0)  # seed 0: the draws each router's own interval reads
    np.testing.assert_array_equal(diffs, kt.apgr_resamples(quality, data, counts=counts)
                                  - kt.apgr_resamples(other, data, counts=counts))
    np.testing.assert_array_equal(kt.apgr_resamples(quality, data, 200), kt.apgr_resamples(quality, data, counts=counts))
    # unpaired (each router on its own draws): the shared per-query luck no longer cancels
    unpaired = kt.apgr_resamples(quality, data, counts=counts) - \
        kt.apgr_resamples(other, data, counts=resample_counts(len(data), 200, 1))
    assert np.nanstd(diffs) < np.nanstd(unpaired) / 2


def test_the_paired_interval_is_narrower_than_the_separate_intervals_allow():
    data, quality, other = _two_worker_table()
    lo, hi = kt.percentile_interval(kt.paired_resamples(quality, other, data))
    (lo_a, hi_a), (lo_b, hi_b) = kt.apgr_interval(quality, data), kt.apgr_interval(other, data)
    point = kt.two_worker_metrics(quality, data)["apgr"] - kt.two_worker_metrics(other, data)["apgr"]
    assert lo <= point <= hi
    assert hi - lo < (hi_a - lo_b) - (lo_a - hi_b)  # narrower than the difference of the separate intervals


def test_paired_rows_give_each_part_and_the_stratified_mean():
    parts = ["c0", "c1"]
    tables = {p: _two_worker_table(300, seed) for p, seed in zip(parts, (1, 2))}
    scored = {p: t[0] for p, t in tables.items()}
    quality = {**{("a", p): t[1] for p, t in tables.items()}, **{("b", p): t[2] for p, t in tables.items()}}
    rows = kt.paired_rows([("a", "b"), ("a", "a")], quality, scored, parts)
    assert [(r["first"], r["second"], r["held_out"]) for r in rows] == \
        [("a", "b", "c0"), ("a", "b", "c1"), ("a", "b", "mean"), ("a", "a", "c0"), ("a", "a", "c1"), ("a", "a", "mean")]
    by_part = {r["held_out"]: r for r in rows[:3]}
    assert by_part["mean"]["apgr_difference"] == pytest.approx((by_part["c0"]["apgr_difference"]
                                                               + by_part["c1"]["apgr_difference"]) / 2)
    assert all(r["lo"] <= r["apgr_difference"] <= r["hi"] for r in rows[:3])
    assert all(r["apgr_difference"] == r["lo"] == r["hi"] == 0.0 for r in rows[3:])
    assert "a − b" in kt.difference_table(rows)
