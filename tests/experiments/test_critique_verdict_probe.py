"""experiments/critique_verdict_probe.py's summary of p(False) over drafts (the model pass is not run here)."""

from __future__ import annotations


import numpy as np
import pytest

def test_a_verifier_that_reads_the_answer_line(bench):
    p = np.array([0.9, 0.2, 0.1, 0.6])
    wrong = np.array([True, False, False, True])
    no_answer = np.array([True, False, False, False])
    out = bench.summarise(p, wrong, no_answer)
    assert out["p_false_on_wrong"] == pytest.approx(0.75) and out["p_false_on_right"] == pytest.approx(0.15)
    assert out["p_false_without_answer_line"] == pytest.approx(0.9)
    assert out["auc_p_false_for_wrong"] == 1.0
    assert out["greedy_reject_share"] == 0.5 and out["greedy_reject_share_right"] == 0.0
    assert out["greedy_reject_share_wrong"] == 1.0 and out["greedy_reject_share_without_answer_line"] == 1.0


def test_one_class_only_has_no_auc(bench):
    out = bench.summarise(np.array([0.3, 0.4]), np.array([False, False]), np.array([False, False]))
    assert out["auc_p_false_for_wrong"] is None and out["p_false_on_wrong"] is None
    assert out["greedy_reject_share_wrong"] is None
