"""The critique stage (`routerops stage critique`, pipelines/critique/dvc.yaml) end to end on the bundled
RouteLLM GSM8K table at the smallest scale: two folds, three training iterations."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_the_critique_stage_reports_every_controller_out_of_fold_beside_the_replay_routers(tmp_path):
    from routerops.layout import Layout
    from stages import run_stage

    section = yaml.safe_load((REPO / "params.yaml").read_text())["critique"]
    section.update(k=2, bootstrap=10, baselines=["random"])
    section["grpo"]["iterations"] = section["corl"]["iterations"] = 3
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"critique": section}))
    for shared in ("datasets", "configs"):
        os.symlink(REPO / shared, tmp_path / shared)

    paths = run_stage("critique", "params.yaml", tmp_path)

    result = json.loads(Path(paths["results"]).read_text())
    assert result["n_queries"] == 1307 and "cross-fit" in result["protocol"]
    summary = result["summary"]
    for name in ("with_multipliers", "without_multipliers"):
        row = summary[name]
        assert 0 <= row["greedy:strong_call_share"] <= 1 and -1 < row["apgr"] < 2
        # at evaluation a spent budget passes the request on: ρ = 0.25 of the queries at most
        assert row["greedy_budgeted:strong_calls_per_query"] <= 0.25 + 1e-9
    assert set(summary["corl"]) == {"low", "medium", "high"}
    assert "random" in {row["router"] for row in result["baselines"]}
    metrics = json.loads(Path(paths["metrics"]).read_text())
    assert "with_multipliers/apgr" in metrics and "corl/low/expert_call_ratio" in metrics
    assert (Layout(tmp_path).manifests / "critique.json").is_file()
