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
