"""The orchestra stages in temp dirs (stages/orchestra.py)."""

from __future__ import annotations

import pytest
import yaml

from routerops.envs.suites import materialise_suites, read_tasks
from routerops.errors import InputError
from routerops.layout import Layout
from stages.orchestra import OrchestraRun, OrchestraTasks, load_run, tasks


def test_tasks_share_the_main_pipelines_test_and_ood_tasks_whatever_the_train_size(tmp_path):
    run = OrchestraRun(tasks=OrchestraTasks(train=5, val=1, test=2, ood=2))
    path = tasks(run, Layout(tmp_path))
    mine = read_tasks(path)
    main = materialise_suites(families=run.tasks.families, ood_families=run.tasks.ood_families,
                              sizes={"train": 1, "val": 1, "test": 2, "ood": 2}, seed=run.tasks.seed)
    held_out = ("test", "ood")
    assert [t.prompt for t in mine if t.split in held_out] == [t.prompt for t in main if t.split in held_out]
    assert sum(t.split == "train" for t in mine) == 5 * len(run.tasks.families)
    assert (tmp_path / "reports/orchestra/stages/orchestra-tasks.json").is_file()


def test_unknown_keys_are_refused_with_their_path(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"orchestra": {"tasks": {"trian": 3}}}))
    with pytest.raises(InputError, match="orchestra.tasks.trian"):
        load_run(params)
    params.write_text(yaml.safe_dump({"orchestra": {"tasks": {"train": 3}, "turn_limit": 4}}))
    run = load_run(params)
    assert run.tasks.train == 3 and run.turn_limit == 4 and run.tasks.test == OrchestraTasks().test
