"""Leaderboard, per-split breakdown, plot and report files on a synthetic episodes/turns table."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from routerops import report, schema

# policy -> (USD per query, accuracy on test, accuracy on ood, workers each episode calls)
POLICIES = {
    "single:cheap": (0.001, 0.50, 0.40, ["cheap"]),
    "single:strong": (0.100, 0.80, 0.70, ["strong"]),
    "router": (0.020, 0.80, 0.60, ["cheap", "strong"]),
    "wasteful": (0.200, 0.40, 0.40, ["strong", "cheap", "strong"]),
}
N_PER_SPLIT = 50


def typed(rows: list[dict], kind: str) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=schema.empty_frame(kind).columns)
    return schema.to_table(frame, kind).to_pandas()


def make_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    episodes, turns = [], []
    for policy, (usd, acc_test, acc_ood, workers) in POLICIES.items():
        for split, acc in (("test", acc_test), ("ood", acc_ood)):
            n_correct = round(acc * N_PER_SPLIT)
            for i in range(N_PER_SPLIT):
                eid = schema.episode_id("run", f"{split}-{i}", policy, 0)
                correct = i < n_correct
                for t, worker in enumerate(workers):
                    turns.append({"episode_id": eid, "turn_index": t, "actor": policy, "worker": worker,
                                  "primitive": "answer", "subtask_id": "", "depends_on": "[]", "message": "",
                                  "response": "", "observation": "", "prompt_tokens": 50, "completion_tokens": 10, "cached_tokens": 0,
                                  "latency_s": 0.5, "cost_usd": usd / len(workers), "errors": "[]",
                                  "propensity": 1.0})
                episodes.append({"episode_id": eid, "run_id": "run", "task_id": f"{split}-{i}", "suite": "s",
                                 "split": split, "policy": policy, "policy_version": "1", "seed": 0,
                                 "budget_usd": 1.0, "turn_limit": 3, "price_book_version": "v",
                                 "final_answer": "", "score": float(correct), "success": correct,
                                 "turns": len(workers), "prompt_tokens": 50 * len(workers),
                                 "completion_tokens": 10 * len(workers), "cached_tokens": 0, "cost_usd": usd,
                                 "ended_by": "done", "error": ""})
    return typed(episodes, "episodes"), typed(turns, "turns")


@pytest.fixture(scope="module")
def tables():
    return make_tables()


@pytest.fixture(scope="module")
def board(tables):
    episodes, turns = tables
    return report.evaluate_policies(episodes, turns, single_workers=["single:cheap", "single:strong"], n_boot=500)


def test_leaderboard_has_one_row_per_policy_with_its_numbers(board):
    assert set(board.columns) >= set(report.LEADERBOARD_COLUMNS)
    assert sorted(board["policy"]) == sorted(POLICIES)
    row = board.set_index("policy").loc["router"]
    assert row["n"] == 2 * N_PER_SPLIT
    assert row["accuracy"] == pytest.approx(0.70)  # (.8 + .6) / 2
    assert row["accuracy_lo"] < 0.70 < row["accuracy_hi"]
    assert row["usd_per_query"] == pytest.approx(0.02)
    assert row["usd_total"] == pytest.approx(0.02 * 2 * N_PER_SPLIT)
    assert row["tokens_per_query"] == 120 and row["turns_per_query"] == 2
    assert row["switches_per_query"] == 1 and row["latency_s_per_query"] == pytest.approx(1.0)
    assert board.set_index("policy").loc["wasteful", "switches_per_query"] == 2


def test_leaderboard_is_sorted_and_marks_the_frontier(board):
    assert board["accuracy"].is_monotonic_decreasing
    on = set(board.loc[board["on_frontier"], "policy"])
    # router (.02, .70) and strong (.1, .75) and cheap (.001, .45) trade off; wasteful is dominated
    assert on == {"single:cheap", "router", "single:strong"}
    assert board.set_index("policy").loc["wasteful", "pareto_dist"] > 0


def test_llmrouterbench_columns_against_the_best_single_worker(board):
    b = board.set_index("policy")
    assert board.attrs["best_single"] == "single:strong"  # accuracy .75
    assert b.loc["router", "gain_any_cost"] == pytest.approx(0.70 - 0.75)
    assert np.isnan(b.loc["router", "cost_saved"])  # never reaches .75
    assert b.loc["single:strong", "cost_saved"] == pytest.approx(0.0)


def test_breakdown_by_split(tables):
    breakdown = report.breakdown_by_split(*tables, n_boot=200).set_index(["policy", "split"])
    assert breakdown.loc[("router", "test"), "accuracy"] == pytest.approx(0.8)
    assert breakdown.loc[("router", "ood"), "accuracy"] == pytest.approx(0.6)
    assert breakdown.loc[("router", "ood"), "n"] == N_PER_SPLIT


def test_evaluate_policies_without_turns_leaves_switches_empty(tables):
    episodes, _ = tables
    board = report.evaluate_policies(episodes, n_boot=100)
    assert board["switches_per_query"].isna().all() and board["gain_any_cost"].isna().all()


def test_log_x_only_when_costs_span_more_than_two_decades():
    assert report.wants_log_x(np.array([0.001, 0.2]))
    assert not report.wants_log_x(np.array([0.01, 0.2]))
    assert not report.wants_log_x(np.array([0.0, 0.2]))


def test_plot_writes_a_png(board, tmp_path):
    path = report.plot_accuracy_cost(board, tmp_path / "plot.png", title="synthetic")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_write_report_writes_every_file(board, tables, tmp_path):
    breakdown = report.breakdown_by_split(*tables, n_boot=100)
    paths = report.write_report(board, breakdown, tmp_path / "eval")
    assert {p.name for p in paths.values()} == {"leaderboard.csv", "leaderboard.md", "breakdown.csv",
                                                "metrics.json", "accuracy_cost.png"}
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == sorted(p.name for p in paths.values())
    back = pd.read_csv(paths["leaderboard"])
    assert list(back["policy"]) == list(board["policy"])
    md = paths["leaderboard_md"].read_text().splitlines()
    assert md[0].startswith("| policy |") and len(md) == 2 + len(board)
    flat = json.loads(paths["metrics"].read_text())
    assert flat["accuracy/router"] == pytest.approx(0.70)
    assert flat["accuracy/router/ood"] == pytest.approx(0.60)
    assert all(isinstance(v, float) for v in flat.values())
    assert all(set(k) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./ ") for k in flat)


def test_write_report_leaves_nothing_behind_when_it_fails(board, tables, tmp_path, monkeypatch):
    def broken_plot(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(report, "plot_accuracy_cost", broken_plot)
    with pytest.raises(RuntimeError):
        report.write_report(board, report.breakdown_by_split(*tables, n_boot=50), tmp_path / "eval")
    assert list((tmp_path / "eval").iterdir()) == []
