"""benchmarks/k_worker_transfer.py's GSM8K protocol: RouteLLM's table split by the number of calculator
steps in GSM8K's reference solution, with prompt-only costs (no router may read the logged answer's
length), and one fit → score → APGR row on a tiny slice."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

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
