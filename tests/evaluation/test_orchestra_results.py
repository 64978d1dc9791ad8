"""The orchestrator's results table (evaluation/orchestra_results.py) on hand-built episodes."""

from __future__ import annotations

import pandas as pd
import pytest

from evaluation.baselines import TABLE_COLUMNS
from evaluation.orchestra_results import RESULT_COLUMNS, controller_rows, results_table


def episode(eid, split, version, success, usd, mode):
    return {"episode_id": eid, "split": split, "policy": "orchestrator", "policy_version": version,
            "success": success, "cost_usd": usd, "mode": mode, "turn_limit": 8}


def turn(eid, index, kind, actor="controller"):
    return {"episode_id": eid, "turn_index": index, "actor": actor, "primitive": kind}


@pytest.fixture
def rollouts():
    episodes = pd.DataFrame([
        episode("a", "test", "base", False, 0.001, "none"),
        episode("b", "test", "base", True, 0.002, "lazy"),
        episode("c", "test", "sft", True, 0.003, "oneshot"),
        episode("d", "test", "sft", True, 0.005, "decomp_repair"),
        episode("e", "val", "sft", False, 0.0, "none"),
    ])
    turns = pd.DataFrame([
        turn("a", 0, "malformed"),
        turn("b", 0, "malformed"), turn("b", 1, "final_answer"),
        turn("c", 0, "plan"), turn("c", 1, "answer", actor="worker"), turn("c", 2, "final_answer"),
        turn("d", 0, "plan"), turn("d", 1, "repair"), turn("d", 2, "final_answer"),
        turn("e", 0, "malformed"),
    ])
    return episodes, turns


def test_controller_rows_count_valid_turns_modes_accuracy_and_usd(rollouts):
    table = controller_rows(*rollouts, ["test"])
    assert list(table.columns) == RESULT_COLUMNS
    rows = table.set_index("policy")
    assert set(rows.index) == {"orchestrator-base", "orchestrator-sft"}  # val is not asked for
    base, sft = rows.loc["orchestrator-base"], rows.loc["orchestrator-sft"]
    assert base.valid_turn_rate == pytest.approx(1 / 3) and base.controller_turns == 3  # worker rows not counted
    assert sft.valid_turn_rate == 1.0 and sft.controller_turns == 5
    assert base.accuracy == 0.5 and sft.accuracy == 1.0
    assert base.usd_per_episode == pytest.approx(0.0015) and sft.usd_per_episode == pytest.approx(0.004)
    assert (base.mode_none, base.mode_lazy, base.mode_oneshot) == (0.5, 0.5, 0.0)
    assert (sft.mode_oneshot, sft.mode_decomp_repair, sft.mode_continuation) == (0.5, 0.5, 0.0)


def test_results_table_puts_each_splits_controller_rows_before_its_baselines(rollouts):
    baselines = pd.DataFrame([
        {"split": "ood", "policy": "uniform_random", "kind": "random", "accuracy": 0.2, "usd_per_episode": 1e-4},
        {"split": "test", "policy": "mtrouter", "kind": "mtrouter", "accuracy": 0.5, "usd_per_episode": 3e-4},
        {"split": "test", "policy": "single/python/python", "kind": "single", "accuracy": 0.5, "usd_per_episode": 2e-5},
        {"split": "val", "policy": "knn", "kind": "router", "accuracy": 0.9, "usd_per_episode": 1e-4},
    ]).reindex(columns=TABLE_COLUMNS)
    table = results_table(controller_rows(*rollouts, ["test"]), baselines, ["test", "ood"])
    assert list(zip(table.split, table.policy)) == [
        ("test", "orchestrator-base"), ("test", "orchestrator-sft"), ("test", "single/python/python"),
        ("test", "mtrouter"), ("ood", "uniform_random")]
    assert "operating_point" not in table and table[table.kind != "orchestrator"].valid_turn_rate.isna().all()


def test_success_by_pass_reads_each_task_s_second_visit_against_its_first():
    from evaluation.orchestra_results import success_by_pass

    # Two tasks cycled twice, and a fifth step that meets "x" a third time (not read).
    steps = [{"task_id": t, "success_rate": s} for t, s in
             [("x", 0.25), ("y", 0.5), ("x", 0.75), ("y", 1.0), ("x", 0.0)]]
    assert success_by_pass(steps) == {"first": 0.375, "second": 0.875, "tasks": 2}
    assert success_by_pass(steps[:2]) is None  # no task met twice


def test_the_curves_get_a_by_visit_panel_only_when_a_task_was_met_twice(tmp_path):
    from PIL import Image

    from evaluation.orchestra_results import CURVE_PANELS, plot_rl_curves

    def steps(tasks):
        return [{"task_id": t, "success_rate": 0.5, "reward/return_mean": 0.4, "kl": 0.0, "reward/usd_mean": 1e-4}
                for t in tasks]

    once = plot_rl_curves({"grpo": [steps(["a", "b", "c", "d"])]}, tmp_path / "once.png", "t")
    twice = plot_rl_curves({"grpo": [steps(["a", "b", "a", "b"])]}, tmp_path / "twice.png", "t")
    w_once, w_twice = Image.open(once).size[0], Image.open(twice).size[0]
    assert w_twice / w_once == pytest.approx((len(CURVE_PANELS) + 1) / len(CURVE_PANELS), rel=0.02)
