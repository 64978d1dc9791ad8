"""The orchestra stages in temp dirs (stages/orchestra/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
import yaml

from evaluation.baselines import TABLE_COLUMNS
from models import registry
from routerops.envs.suites import materialise_suites, read_tasks
from routerops.errors import InputError
from routerops.layout import Layout
from routerops.pricing import derive_costs, load_pool, load_price_book
from stages.orchestra import OrchestraBaselines, OrchestraRun, OrchestraTasks, baselines, load_run, tasks


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


# ---------------------------------------------------------------- stage: baselines (real llama.cpp server)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_baselines_stage_with_the_real_server_reports_test_and_ood_without_training_on_them(tmp_path, monkeypatch,
                                                                                           record_fits):
    seen = {"knn": set(), "mtrouter": set()}
    for name in seen:
        monkeypatch.setitem(registry.ROUTER_FACTORIES, name, record_fits(registry.ROUTER_FACTORIES[name], seen[name]))
    # The smallest run: two tasks per split, one router seed; the repository's pool and price book.
    run = OrchestraRun(pool=str(REPO / "configs/pools/embedded-smollm2.yaml"), price_book=str(REPO / "configs/prices/current.yaml"),
                       tasks=OrchestraTasks(families=["basic_arithmetic", "gcd"], train=1, val=1, test=1, ood=2),
                       baselines=OrchestraBaselines(routers=["knn", "logistic"], router_seeds=[0]))
    layout = Layout(tmp_path)
    task_path = tasks(run, layout)
    by_split = {s: {t.task_id for t in read_tasks(task_path) if t.split == s} for s in ("train", "val", "test", "ood")}

    table = pd.read_csv(baselines(run, layout, task_path))

    for name, ids in seen.items():  # no val, test or OOD task id reaches a router's training data
        assert ids and ids <= by_split["train"], name
    assert list(table.columns) == TABLE_COLUMNS
    pool_actions = [f"single/{w}/{p}" for w, p in load_pool(run.pool).actions()]
    episodes = pd.read_parquet(layout.orchestra_baselines.episodes)
    turns = pd.read_parquet(layout.orchestra_baselines.turns)
    book = load_price_book(run.price_book)
    for split in ("test", "ood"):
        rows = table[table.split == split]
        assert sorted(rows[rows.kind == "single"].policy) == sorted(pool_actions)
        assert list(rows.kind.drop_duplicates()) == ["single", "random", "router", "mtrouter"]
        assert set(rows[rows.kind == "router"].policy) <= {"knn", "logistic"}
        assert (rows.episodes == len(by_split[split])).all()
        assert rows.accuracy.between(0, 1).all() and (rows.usd_per_episode >= 0).all()
        # USD per episode from the real token counts under the run's price book
        mine = episodes[(episodes.split == split) & (episodes.policy == "uniform_random")]
        usd = derive_costs(turns[turns.episode_id.isin(mine.episode_id)], book).sum() / len(mine)
        assert rows.set_index("policy").loc["uniform_random", "usd_per_episode"] == pytest.approx(usd)
    # single workers ran on every split, the random router on test and OOD only, within the budget
    assert set(episodes[episodes.policy == "uniform_random"].split) == {"test", "ood"}
    assert set(episodes.split) == {"train", "val", "test", "ood"} and (episodes.cost_usd <= run.budget_usd).all()
    selection = pd.read_csv(layout.orchestra_baselines_selection)
    assert set(selection.router) == {"knn", "logistic", "mtrouter"}
    assert layout.orchestra_baselines_markdown.read_text().startswith("# Orchestra baselines")
    assert (layout.orchestra_manifests / "orchestra-baselines.json").is_file()
    journals = list((layout.orchestra_journals / "baselines").glob("*/*/journal.jsonl"))
    assert sum(len(j.read_text().splitlines()) for j in journals) == len(episodes)  # a rerun resumes from them


# ---------------------------------------------------------------- stage: teacher with an LLM (real llama.cpp server)


@pytest.mark.slow
def test_an_llm_teacher_writes_its_own_turns_through_its_endpoint_priced_as_its_worker(tmp_path):
    from routerops.orchestra.curriculum import strategy_of
    from stages.orchestra import OrchestraTeacher
    from stages.orchestra.teacher import teacher

    # The embedded pool's smol-direct stands in for the paper's strong teacher: the path is the same.
    run = OrchestraRun(pool=str(REPO / "configs/pools/embedded-smollm2.yaml"), price_book=str(REPO / "configs/prices/current.yaml"),
                       tasks=OrchestraTasks(families=["basic_arithmetic"], train=2, val=1, test=1, ood=1),
                       turn_limit=2, teacher=OrchestraTeacher(kind="llm", llm_worker="smol-direct", samples=2))
    layout = Layout(tmp_path)
    out = teacher(run, layout, tasks(run, layout))

    episodes = pd.read_parquet(out.episodes)
    turns = pd.read_parquet(out.turns)
    assert len(episodes) == 2 * 2 and set(episodes.policy) == {"smol-direct"}
    assert set(episodes.run_id.map(strategy_of)) == {"llm:smol-direct:0", "llm:smol-direct:1"}
    controller = turns[turns.actor == "controller"]
    assert len(controller) >= len(episodes) and (controller.prompt_tokens > 0).all()
    book = load_price_book(run.price_book)
    assert derive_costs(controller, book).sum() > 0  # the teacher's own turns cost what its worker's calls cost
    with pytest.raises(InputError, match="orchestra.teacher.llm_worker"):
        teacher(OrchestraRun(pool=run.pool, price_book=run.price_book, teacher=OrchestraTeacher(kind="llm", llm_worker="sympy")),
                layout, layout.orchestra_tasks)


def test_the_paper_config_is_refused_before_any_work_naming_what_is_missing(tmp_path, monkeypatch):
    import torch

    from models.orchestrator.config import DeviceUnavailable
    from routerops.errors import RouteropsError
    from stages.orchestra import check_run

    paper = REPO / "configs/paper/orchestra.yaml"
    run, layout = load_run(paper), Layout(REPO)
    with pytest.raises(InputError, match=r"configs/paper/prices.yaml.*prices.gpt-5.input_per_1m"):
        check_run(run, layout, paper)
    book = yaml.safe_load((REPO / "configs/paper/prices.yaml").read_text())
    book["prices"] = {name: {"input_per_1m": 1.0, "output_per_1m": 2.0} for name in book["prices"]}
    (tmp_path / "prices.yaml").write_text(yaml.safe_dump(book))
    filled = dataclasses.replace(run, price_book=str(tmp_path / "prices.yaml"))
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(RouteropsError, match="OPENROUTER_API_KEY"):
        check_run(filled, layout, paper)
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-test")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailable, match="orchestra.controller"):
            check_run(filled, layout, paper)
    without_controller = {**book, "prices": {k: v for k, v in book["prices"].items() if k != "orchestrator"}}
    (tmp_path / "prices.yaml").write_text(yaml.safe_dump(without_controller))
    with pytest.raises(InputError, match="prices.orchestrator"):
        check_run(filled, layout, paper)
