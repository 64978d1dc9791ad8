"""Error-penalised targets against hand-computed eq. 5-6 values."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from models.mtrouter.config import MTRouterConfig
from models.mtrouter.targets import (
    expected_episode_lengths, parse_errors, penalised_targets, progress_weight, turn_penalties, turn_targets,
)
from routerops.errors import InputError

CFG = MTRouterConfig(expected_episode_length=5.0)  # N = 5 → base penalty 1/N = 0.2


def test_progress_weight_is_the_papers_piecewise_linear_warmup():
    # w = w_min = 0.3 up to p0 = 0.3; linear to w_max = 1.0 at p1 = 0.7; flat after.
    # w(0.5) = 0.3 + (0.5 - 0.3) / (0.7 - 0.3) * (1.0 - 0.3) = 0.3 + 0.5 * 0.7 = 0.65
    got = progress_weight(np.array([0.0, 0.3, 0.5, 0.7, 1.0]), CFG)
    assert got == pytest.approx([0.3, 0.3, 0.65, 1.0, 1.0])


def test_hand_computed_targets_of_one_episode():
    # T_max = 10, four turns, S_final = 1.0, N = 5.
    # turn 0: low            → β 0.2, progress 1/10 = 0.1 → w 0.3
    # turn 1: none           → ρ = 0
    # turn 2: medium + high  → β = max = 1.0, progress 0.3 → w 0.3
    # turn 3: medium         → β 0.8, progress 0.4 → w = 0.3 + (0.1 / 0.4) * 0.7 = 0.475
    errors = [[{"rule": "a", "severity": "low"}], [],
              [{"rule": "b", "severity": "medium"}, {"rule": "c", "severity": "high"}],
              [{"rule": "d", "severity": "medium"}]]
    rho = turn_penalties(errors, turn_limit=10, base_penalty=1 / 5, cfg=CFG)
    # ρ_i = β · w · (1/N):  0.2·0.3·0.2 = 0.012,  0,  1.0·0.3·0.2 = 0.06,  0.8·0.475·0.2 = 0.076
    assert rho == pytest.approx([0.012, 0.0, 0.06, 0.076])
    # S̃_t = 1 − Σ_{i≥t} ρ_i:  S̃_3 = 1 − 0.076 = 0.924;  S̃_2 = 1 − 0.136 = 0.864;
    #                          S̃_1 = 0.864;  S̃_0 = 1 − 0.148 = 0.852
    assert penalised_targets(1.0, rho) == pytest.approx([0.852, 0.864, 0.864, 0.924])


def test_late_errors_cost_more_and_score_range_rescales():
    # Same medium error at turn 0 and at turn 3 of T_max = 4: progress 0.25 (w 0.3) vs 1.0 (w 1.0).
    # ρ = 0.8 · w · (1/5) · score_range 200 (ScienceWorld's [-100, 100]) → 9.6 and 32.
    cfg = CFG.replace(score_range=200.0)
    medium = [{"rule": "x", "severity": "medium"}]
    assert turn_penalties([medium, [], [], medium], 4, 1 / 5, cfg) == pytest.approx([9.6, 0.0, 0.0, 32.0])


def _tables(errors_json: list[str], score: float = 0.5) -> tuple[pd.DataFrame, pd.DataFrame]:
    episodes = pd.DataFrame([{"episode_id": "e1", "score": score, "turn_limit": 2, "suite": "s", "turns": len(errors_json)}])
    turns = pd.DataFrame({"episode_id": "e1", "turn_index": range(len(errors_json)), "errors": errors_json})
    return episodes, turns


def test_turn_targets_from_tables():
    # T_max = 2, N = 5, S_final = 0.5. turn 0 high at progress 0.5 → w 0.65 → ρ0 = 1.0·0.65·0.2 = 0.13;
    # turn 1 low at progress 1.0 → w 1.0 → ρ1 = 0.2·1.0·0.2 = 0.04.  S̃_1 = 0.46, S̃_0 = 0.5 − 0.17 = 0.33.
    episodes, turns = _tables([json.dumps([{"rule": "r", "severity": "high"}]), json.dumps([{"rule": "q", "severity": "low"}])])
    assert turn_targets(episodes, turns, CFG).tolist() == pytest.approx([0.33, 0.46])
    # Without the error penalty (Table 4 ablation) every turn's target is S_final.
    assert turn_targets(episodes, turns, CFG.replace(error_penalty=False)).tolist() == [0.5, 0.5]


def test_expected_length_defaults_to_mean_logged_length_per_suite():
    episodes = pd.DataFrame({"suite": ["a", "a", "b"], "turns": [2, 4, 7]})
    assert expected_episode_lengths(episodes, MTRouterConfig()) == {"a": 3.0, "b": 7.0}


def test_bad_errors_cell_names_the_field():
    with pytest.raises(InputError, match="severity"):
        parse_errors(json.dumps([{"rule": "r", "severity": "catastrophic"}]))
    with pytest.raises(InputError, match="JSON"):
        parse_errors("[{not json")
    episodes, turns = _tables(["[]"])
    episodes.loc[0, "turn_limit"] = 0
    with pytest.raises(InputError, match="turn_limit"):
        turn_targets(episodes, turns, CFG)
