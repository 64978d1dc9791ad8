"""`routerops run PIPELINE --set KEY=VALUE` (cli/run.py): overrides applied to a copy of the
params file, checked by the pipeline's own loader, errors naming the `--set`. The whole front door
runs end to end in tests/stages/test_critique.py (`routerops run critique --set ...`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from routerops.errors import InputError
from cli import main as cli
from cli.run import PIPELINES, apply_overrides, check_config, params_for_run

REPO = Path(__file__).resolve().parents[2]


def test_overrides_set_nested_values_as_yaml_and_leave_the_input_alone():
    params = {"orchestra": {"rl": {"max_steps": 16}}, "collect": None}
    out = apply_overrides(params, ["orchestra.rl.max_steps=4", "materialise.families=[gcd, lcm]",
                                   "collect.budget_usd=0.02", "track.experiment=my run"])
    assert out["orchestra"]["rl"]["max_steps"] == 4 and params["orchestra"]["rl"]["max_steps"] == 16
    assert out["materialise"]["families"] == ["gcd", "lcm"] and out["collect"]["budget_usd"] == 0.02
    assert out["track"]["experiment"] == "my run"


@pytest.mark.parametrize("text, field", [("orchestra.rl.max_steps", "--set"), ("=4", "--set"),
                                         ("a..b=1", "--set"), ("collect.budget_usd.usd=1", "--set collect.budget_usd.usd"),
                                         ("collect.budget_usd=[1", "--set collect.budget_usd")])
def test_a_malformed_override_is_refused_naming_it(text, field):
    with pytest.raises(InputError) as raised:
        apply_overrides({"collect": {"budget_usd": 0.01}}, [text])
    assert raised.value.field == field


@pytest.mark.parametrize("pipeline, text, field", [
    ("main", "collect.budget_usd=ten", "--set collect.budget_usd"),
    ("main", "materialise.trian=3", "--set materialise.trian"),
    ("orchestra", "orchestra.tasks.trian=3", "--set orchestra.tasks.trian"),
    ("mtrouter", "mtrouter.turn_limit=[6]", "--set mtrouter.turn_limit"),
])
def test_a_bad_key_or_value_given_by_set_is_named_before_anything_runs(tmp_path, pipeline, text, field):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    path = params_for_run(pipeline, tmp_path, "params.yaml", [text])
    assert path == tmp_path / ".routerops/run" / f"{pipeline}.params.yaml" and path.is_file()
    with pytest.raises(InputError) as raised:
        check_config(PIPELINES[pipeline], path, [text])
    assert raised.value.field == field and raised.value.path == "command line"


def test_without_overrides_the_pipeline_reads_params_yaml_itself(tmp_path):
    assert params_for_run("main", tmp_path, "params.yaml", []) == tmp_path / "params.yaml"


def test_the_command_line_refuses_an_unknown_key_in_one_line(tmp_path, capsys):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    code = cli.main(["run", "main", "--root", str(tmp_path), "--set", "materialise.trian=3"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--set materialise.trian" in err and "unknown key" in err
    assert yaml.safe_load((tmp_path / "params.yaml").read_text())["materialise"]["train"] == 120  # untouched
