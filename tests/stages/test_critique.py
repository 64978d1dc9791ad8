"""The critique stage (pipelines/critique/dvc.yaml) end to end on the bundled RouteLLM GSM8K table at the
smallest scale (two folds, three training iterations), run as a user would: `routerops run critique`
with the scale given by `--set` (cli/run.py), params.yaml untouched."""

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
    from cli import main as cli

    section = yaml.safe_load((REPO / "params.yaml").read_text())["critique"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"critique": section}))
    for shared in ("datasets", "configs"):
        os.symlink(REPO / shared, tmp_path / shared)

    sets = ["critique.k=2", "critique.bootstrap=10", "critique.baselines=[random]", "critique.grpo.iterations=3",
            "critique.corl.iterations=3"]
    assert cli.main(["run", "critique", "--root", str(tmp_path), *(x for s in sets for x in ("--set", s))]) == 0
    assert yaml.safe_load((tmp_path / "params.yaml").read_text())["critique"] == section  # untouched
    used = yaml.safe_load((tmp_path / ".routerops/run/critique.params.yaml").read_text())["critique"]
    assert used["k"] == 2 and used["grpo"]["iterations"] == 3 and used["baselines"] == ["random"]
    paths = {"results": Layout(tmp_path).critique_dir / "results.json",
             "metrics": Layout(tmp_path).critique_dir / "metrics.json"}

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
