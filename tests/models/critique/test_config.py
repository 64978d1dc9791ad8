"""The `critique` section: params.yaml and the paper config load; unknown keys and bad values are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models.critique.config import critique_config, load_critique_config
from models.critique.env import by_rank
from routerops.errors import InputError

REPO = Path(__file__).resolve().parents[3]


def test_params_and_paper_configs_load():
    cfg = load_critique_config(REPO / "params.yaml")
    assert cfg.grpo.horizon == 3 and cfg.grpo.group == 4 and cfg.grpo.xi == (0.25, 0.125, 0.0)
    paper = load_critique_config(REPO / "configs" / "paper" / "critique.yaml")
    assert paper.corl.budgets == (0.001, 0.006, 1000.0) and paper.grpo.multiplier_lr == 0.0


@pytest.mark.parametrize("raw, field", [
    ({"grpo": {"horizonn": 3}}, "critique.grpo.horizonn"),
    ({"grpo": {"group": 1}}, "critique.grpo.group"),
    ({"grpo": {"xi": [0.25, 0.0], "rho": [0.25, 0.5, 1.0]}}, "critique.grpo.rho"),
    ({"grpo": {"rho": [0.25, 1.5, 1.0]}}, "critique.grpo.rho"),
    ({"corl": {"budgets": [0.02, 0.001, 1000]}}, "critique.corl.budgets"),
    ({"policy": {"lr": "fast"}}, "critique.policy.lr"),
    ({"k": 1}, "critique.k"),
])
def test_bad_settings_are_refused(raw, field):
    with pytest.raises(InputError) as err:
        critique_config(raw)
    assert err.value.field == field


def test_multipliers_by_strength_rank():
    assert by_rank((0.25, 0.125, 0.0), 2) == pytest.approx(np.array([0.25, 0.0]))
    assert by_rank((0.25, 0.125, 0.0), 3) == pytest.approx(np.array([0.25, 0.125, 0.0]))
    with pytest.raises(InputError):
        by_rank((0.25, 0.0), 3)
