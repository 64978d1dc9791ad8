"""evaluation/draft_signal.py: the visible features of a draft that experiments/critique_draft_signal.py scores
(the AUCs themselves are not asserted)."""

from __future__ import annotations

import pytest

from evaluation import draft_signal


def test_arithmetic_reads_numbers_and_operators_only():
    assert draft_signal.arithmetic("36*68/12") == pytest.approx(204.0)
    assert draft_signal.arithmetic("2^3-1,000") == pytest.approx(-992.0)
    for bad in ("__import__('os')", "1/0", "x+1", "(1"):
        with pytest.raises(ValueError):
            draft_signal.arithmetic(bad)


def test_the_last_annotation_decides():
    assert not draft_signal.wrong_last_annotation("3*12 = <<3*12=36>>36\n#### 36")
    assert draft_signal.wrong_last_annotation("3*12 = <<3*12=36>>36, then <<36+4=41>>41")
    assert draft_signal.wrong_last_annotation("<<3*12=36>>36 and <<36 dozens=3>>")  # unreadable counts as wrong
    assert not draft_signal.wrong_last_annotation("no annotations here")


def test_a_draft_cut_before_its_answer_line_is_seen():
    full = draft_signal.visible_features("She sells 9 eggs: 9 * $2 = $<<9*2=18>>18.\n#### 18")
    cut = draft_signal.visible_features("Toula bought 3 x 12 = <<3*12=36>>36 donuts, which costs 36 * 68/12 = $<<36*68/1")
    assert full["no_answer_line"] == 0.0 and cut["no_answer_line"] == 1.0
    assert full["wrong_last_annotation"] == 0.0 and full["words_per_100"] == pytest.approx(0.11)
