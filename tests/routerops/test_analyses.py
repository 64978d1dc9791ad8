"""The §4.3 analyses on a hand-built trajectory table whose answers are worked out by hand.

Policy A, three episodes (E = a turn with an error; cost in USD):
    a1 (success): x look 1.0 | x look 2.0 E | y go 1.0 | x go 0.5
    a2 (success): y go 2.0 E | y go 2.0 E | y look 1.0
    a3 (failure): x look 1.0 E | y go 1.0 E | y go 1.0
Policy B, one episode:
    b1 (failure): x look 1.0
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from routerops import analyses, schema
from routerops.errors import InputError

E = [{"rule": "no_known_action", "severity": "high"}]
EPISODES = {  # episode: (policy, success, [(worker, response, cost, errors)])
    "a1": ("A", True, [("x", "look", 1.0, []), ("x", "look", 2.0, E), ("y", "go", 1.0, []), ("x", "go", 0.5, [])]),
    "a2": ("A", True, [("y", "go", 2.0, E), ("y", "go", 2.0, E), ("y", "look", 1.0, [])]),
    "a3": ("A", False, [("x", "look", 1.0, E), ("y", "go", 1.0, E), ("y", "go", 1.0, [])]),
    "b1": ("B", False, [("x", "look", 1.0, [])]),
}


def _tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    episodes, turns = [], []
    for eid, (policy, success, rows) in EPISODES.items():
        episodes.append({
            "episode_id": eid, "run_id": "r", "task_id": f"t-{eid}", "suite": "s", "split": "test",
            "policy": policy, "policy_version": "1", "seed": 0, "budget_usd": 10.0, "turn_limit": 10,
            "price_book_version": "v", "final_answer": "", "score": float(success), "success": success,
            "turns": len(rows), "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0,
            "cost_usd": sum(r[2] for r in rows), "ended_by": "done", "error": "",
        })
        for i, (worker, response, cost, errors) in enumerate(rows):
            turns.append({
                "episode_id": eid, "turn_index": i, "actor": policy, "worker": worker, "primitive": "answer",
                "subtask_id": "", "depends_on": "[]", "message": "", "response": response, "observation": "",
                "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "latency_s": 0.0,
                "cost_usd": cost, "errors": json.dumps(errors), "propensity": 0.5,
            })
    return pd.DataFrame(episodes), pd.DataFrame(turns)


@pytest.fixture
def tables(tmp_path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tables as the pipeline stores them: through the Parquet schema and back, turns shuffled."""
    episodes, turns = _tables()
    schema.write_table(episodes, tmp_path / "episodes.parquet", "episodes")
    schema.write_table(turns.sample(frac=1.0, random_state=3), tmp_path / "turns.parquet", "turns")
    return schema.read_table(tmp_path / "episodes.parquet", "episodes"), schema.read_table(tmp_path / "turns.parquet", "turns")


def _records(frame: pd.DataFrame, keys: list[str], value: str) -> dict:
    return {tuple(row[k] for k in keys): row[value] for _, row in frame.iterrows()}


def test_cost_vs_switches_over_successful_episodes(tables):
    curve = analyses.cost_vs_switches(*tables)
    # a1 spends 3.0 before its first switch, 4.0 before its second, 4.5 in all; a2 never switches (5.0).
    assert _records(curve, ["policy", "switches"], "mean_cum_cost_usd") == {("A", 0): 4.0, ("A", 1): 4.0, ("A", 2): 4.5}
    assert _records(curve, ["policy", "switches"], "episodes") == {("A", 0): 2, ("A", 1): 1, ("A", 2): 1}


def test_switch_summary(tables):
    summary = analyses.switch_summary(*tables).set_index("policy")
    assert summary.loc["A", ["episodes", "successful"]].tolist() == [3, 2]
    assert summary.loc["A", "mean_switches_success"] == 1.0
    assert summary.loc["A", "mean_turns_success"] == 3.5
    assert summary.loc["A", "mean_cost_usd_success"] == 4.75
    assert summary.loc["B", "successful"] == 0 and math.isnan(summary.loc["B", "mean_switches_success"])


def test_error_switch_recovery(tables):
    table = analyses.error_switch_recovery(*tables).set_index("policy")
    # Error turns with a next turn: a1t1 (switch, recovers), a2t0 (stay, no), a2t1 (stay, recovers),
    # a3t0 (switch, no), a3t1 (stay, recovers).
    a = table.loc["A"]
    assert a["error_turns"] == 5
    assert a["p_switch_given_error"] == pytest.approx(0.4)
    assert a["p_stay_given_error"] == pytest.approx(0.6)
    assert a["p_recovery_given_error"] == pytest.approx(0.6)
    assert a["p_recovery_after_switch"] == pytest.approx(0.5)
    assert a["p_recovery_after_stay"] == pytest.approx(2 / 3)
    assert table.loc["B", "error_turns"] == 0 and math.isnan(table.loc["B", "p_switch_given_error"])


def test_usage_by_phase_thirds(tables):
    usage = analyses.usage_by_phase(*tables)
    shares = _records(usage, ["policy", "phase", "worker"], "share")
    assert shares == pytest.approx({
        ("A", "early", "x"): 0.75, ("A", "early", "y"): 0.25, ("A", "mid", "y"): 1.0,
        ("A", "late", "x"): 1 / 3, ("A", "late", "y"): 2 / 3, ("B", "early", "x"): 1.0,
    })
    assert _records(usage, ["policy", "phase", "worker"], "turns")[("A", "early", "x")] == 3


def test_usage_by_turn(tables):
    usage = analyses.usage_by_turn(*tables)
    shares = _records(usage[usage["policy"] == "A"], ["turn", "worker"], "share")
    assert shares == pytest.approx({(0, "x"): 2 / 3, (0, "y"): 1 / 3, (1, "x"): 1 / 3, (1, "y"): 2 / 3,
                                    (2, "y"): 1.0, (3, "x"): 1.0})


def test_action_lift_per_action_type(tables):
    lift = analyses.action_lift(*tables, action_of=lambda response: response)
    a = lift[lift["policy"] == "A"]
    # P(x) = 4/10, P(y) = 6/10; look: x 3 of 4, go: x 1 of 6.
    assert _records(a, ["action", "worker"], "lift") == pytest.approx({
        ("look", "x"): 0.75 / 0.4, ("look", "y"): 0.25 / 0.6, ("go", "x"): (1 / 6) / 0.4, ("go", "y"): (5 / 6) / 0.6,
    })
    # Success: look turns 3/4 succeed (x 2/3, y 1/1); go turns 4/6 (x 1/1, y 3/5).
    assert _records(a, ["action", "worker"], "success_lift") == pytest.approx({
        ("look", "x"): (2 / 3) / 0.75, ("look", "y"): 1 / 0.75, ("go", "x"): 1.5, ("go", "y"): 0.9,
    })
    assert _records(a, ["action", "worker"], "turns") == {("look", "x"): 3, ("look", "y"): 1, ("go", "x"): 1, ("go", "y"): 5}


def test_action_lift_defaults_to_primitive(tables):
    lift = analyses.action_lift(*tables)
    assert set(lift["action"]) == {"answer"}
    assert lift["lift"].tolist() == pytest.approx([1.0, 1.0, 1.0])  # one action: no specialisation


def test_orphan_turns_are_an_input_error(tables):
    episodes, turns = tables
    with pytest.raises(InputError, match="episode_id"):
        analyses.cost_vs_switches(episodes[episodes["episode_id"] != "a2"], turns)


def test_bad_errors_json_names_the_field(tables):
    episodes, turns = tables
    turns = turns.copy()
    turns.loc[0, "errors"] = "{not json"
    with pytest.raises(InputError, match="errors"):
        analyses.error_switch_recovery(episodes, turns)


def test_missing_column_names_it(tables):
    episodes, turns = tables
    with pytest.raises(InputError, match="cost_usd"):
        analyses.switch_summary(episodes, turns.drop(columns=["cost_usd"]))


def test_plots_write_png_files(tables, tmp_path):
    lift = analyses.action_lift(*tables, action_of=lambda response: response)
    paths = [
        analyses.plot_cost_vs_switches(analyses.cost_vs_switches(*tables), tmp_path / "switches.png"),
        analyses.plot_error_switch_recovery(analyses.error_switch_recovery(*tables), tmp_path / "recovery.png"),
        analyses.plot_usage(analyses.usage_by_phase(*tables), tmp_path / "phase.png"),
        analyses.plot_usage(analyses.usage_by_turn(*tables), tmp_path / "turn.png"),
        analyses.plot_action_lift(lift, tmp_path / "lift.png"),
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_empty_tables_give_empty_frames(tmp_path):
    episodes, turns = schema.empty_frame("episodes"), schema.empty_frame("turns")
    assert analyses.cost_vs_switches(episodes, turns).empty
    assert analyses.error_switch_recovery(episodes, turns).empty
    assert analyses.usage_by_phase(episodes, turns).empty
    assert analyses.action_lift(episodes, turns).empty
    assert analyses.plot_cost_vs_switches(analyses.cost_vs_switches(episodes, turns), tmp_path / "e.png").exists()
