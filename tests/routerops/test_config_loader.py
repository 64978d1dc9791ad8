"""routerops.config.load_section, the one YAML → config loader behind params.yaml's main, `orchestra`
and `mtrouter` sections: unknown or mistyped keys at any depth fail with the file and the dotted key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from routerops.config import load_params
from routerops.errors import InputError
from stages.mtrouter import load_run as load_mtrouter_run
from stages.orchestra import load_run as load_orchestra_run

ROOT = Path(__file__).resolve().parents[2]


def params_with(tmp_path: Path, section: str, patch: dict) -> Path:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw[section] = _merge(raw.get(section) or {}, patch)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _merge(base: dict, patch: dict) -> dict:
    out = dict(base)
    for key, value in patch.items():
        nested = isinstance(value, dict) and isinstance(base.get(key) or {}, dict)
        out[key] = _merge(base.get(key) or {}, value) if nested else value
    return out


LOADERS = {"main": load_params, "orchestra": load_orchestra_run, "mtrouter": load_mtrouter_run}
CASES = [  # (loader, section, patch, key named, problem)
    ("main", "collect", {"budget_usd": "ten cents"}, "collect.budget_usd", "valid number"),
    ("main", "materialise", {"trian": 6}, "materialise.trian", "unknown key"),
    ("main", "materialise", {"families": "gcd"}, "materialise.families", "valid list"),
    ("main", "routers", {"seeds": [0, "one"]}, "routers.seeds.1", "valid integer"),
    ("orchestra", "orchestra", {"tasks": {"train": 2.5}}, "orchestra.tasks.train", "fractional part"),
    ("orchestra", "orchestra", {"teacher": {"kindd": "llm"}}, "orchestra.teacher.kindd", "unknown key"),
    ("orchestra", "orchestra", {"gate": {"n_boot": [1]}}, "orchestra.gate.n_boot", "valid integer"),
    ("mtrouter", "mtrouter", {"budget_usd": {"usd": 1}}, "mtrouter.budget_usd", "valid number"),
    ("mtrouter", "mtrouter", {"turn_limt": 6}, "mtrouter.turn_limt", "unknown key"),
]


@pytest.mark.parametrize("loader, section, patch, key, problem", CASES)
def test_a_bad_key_names_the_file_and_the_dotted_key(tmp_path, loader, section, patch, key, problem):
    path = params_with(tmp_path, section, patch)
    with pytest.raises(InputError) as raised:
        LOADERS[loader](path)
    assert raised.value.path == str(path) and raised.value.field == key
    assert problem in raised.value.problem


def test_values_take_their_field_types_and_an_empty_section_its_defaults(tmp_path):
    path = params_with(tmp_path, "collect", {"budget_usd": 1})  # an int where a float is declared
    raw = yaml.safe_load(path.read_text())
    raw["evaluate"] = None  # `evaluate:` with nothing under it
    path.write_text(yaml.safe_dump(raw))
    params = load_params(path)
    assert params.collect.budget_usd == 1.0 and isinstance(params.collect.budget_usd, float)
    assert params.evaluate == type(params.evaluate)()
    run = load_orchestra_run(params_with(tmp_path, "orchestra", {"tasks": {"train": 3}}))
    assert run.tasks.train == 3 and run.tasks.families  # unset keys keep their defaults


def test_the_shipped_configs_load():
    for path in (ROOT / "params.yaml", ROOT / "configs/paper/orchestra.yaml"):
        load_params(path)
        load_orchestra_run(path)
    load_mtrouter_run(ROOT / "params.yaml")
