"""The pipeline declarations (stages/declarations.py) and the dvc.yaml files generated from them:
a committed dvc.yaml that differs from what the declarations give fails here, naming the file, the
pipeline and the stage."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from cli import main as cli
from stages import PIPELINES, STAGES, run_stage
from stages.dvc_yaml import differences, render
from stages.declarations import DVC_FILES

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_dvc_files_are_what_the_declarations_generate():
    assert differences(REPO) == [], "run `routerops dvc-yaml` and commit the dvc.yaml files"


@pytest.fixture
def copy(tmp_path) -> Path:
    for path in [*DVC_FILES, "params.yaml"]:  # the dvc files name the files params.yaml's settings name
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    return tmp_path


def edit(root: Path, path: str, change) -> None:
    data = yaml.safe_load((root / path).read_text())
    change(data["stages"])
    (root / path).write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_changed_dep_names_its_file_pipeline_and_stage(copy):
    edit(copy, "pipelines/orchestra/dvc.yaml", lambda stages: stages["orchestra-sft"]["deps"].pop())
    assert differences(copy) == ["pipelines/orchestra/dvc.yaml: stage orchestra-sft (pipeline orchestra) "
                                 "differs from its declaration"]


def test_a_price_book_edited_in_params_yaml_moves_the_dvc_deps_with_it(copy):
    """The deps on a pool or price book are the files the settings name (issue 41 item 2): editing
    params.yaml's `prices.collection` makes the collect stage stale, and regenerating tracks the new book."""
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["prices"]["collection"] = "configs/prices/current.yaml"
    (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert differences(copy) == ["dvc.yaml: stage collect (pipeline main) differs from its declaration"]
    assert cli.main(["dvc-yaml", "--root", str(copy)]) == 0
    collect = yaml.safe_load((copy / "dvc.yaml").read_text())["stages"]["collect"]
    assert "configs/prices/current.yaml" in collect["deps"] and "configs/prices/collection-2026-11.yaml" not in collect["deps"]
    assert "prices.collection" in collect["params"] and differences(copy) == []


def test_a_stage_missing_or_undeclared_is_named(copy):
    def change(stages):
        stages["old-stage"] = stages.pop("critique-lm-register")

    edit(copy, "pipelines/critique/dvc.yaml", change)
    assert sorted(differences(copy)) == [
        "pipelines/critique/dvc.yaml: stage critique-lm-register (pipeline critique-lm) is missing",
        "pipelines/critique/dvc.yaml: stage old-stage (pipeline none) is in no declaration"]


def test_the_command_checks_then_writes(copy, capsys):
    (copy / "dvc.yaml").write_text((copy / "dvc.yaml").read_text().replace("      - routerops/grid.py\n", ""))
    assert cli.main(["dvc-yaml", "--check", "--root", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "dvc.yaml: stage grid (pipeline main) differs from its declaration" in err and len(err.splitlines()) == 1
    assert cli.main(["dvc-yaml", "--root", str(copy)]) == 0
    assert "wrote " in capsys.readouterr().out and (copy / "dvc.yaml").read_text() == render("dvc.yaml")
    assert cli.main(["dvc-yaml", "--check", "--root", str(copy)]) == 0


def test_generated_stages_run_their_own_name_from_the_repository_root():
    for path in DVC_FILES:
        stages = yaml.safe_load(render(path))["stages"]
        depth = len(Path(path).parts) - 1
        for name, stage in stages.items():
            assert stage["cmd"] == f"routerops stage {name}"
            assert stage.get("wdir") == ("/".join([".."] * depth) or None), (path, name)


def test_every_pipeline_lists_declared_stages_and_every_stage_is_in_a_pipeline():
    listed = {s for p in PIPELINES.values() for s in p.stages}
    assert listed == set(STAGES)
    for name, pipeline in PIPELINES.items():
        assert len(set(pipeline.stages)) == len(pipeline.stages), name
        assert not pipeline.dvc_file or pipeline.dvc_file in DVC_FILES, name
        assert all(STAGES[s].dvc for s in pipeline.stages) or not pipeline.dvc_file, name


def test_a_stage_that_needs_its_flow_is_refused_standalone_and_not_a_command():
    with pytest.raises(ValueError, match="routerops run retrain"):
        run_stage("retrain-retire")
    choices = next(a for a in cli.build_parser()._subparsers._group_actions[0].choices["stage"]._actions
                   if a.dest == "name").choices
    assert "retrain-retire" not in choices and "retrain-in-force" in choices and "orchestra-sft" in choices
