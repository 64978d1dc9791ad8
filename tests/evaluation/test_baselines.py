"""The baseline rows of the orchestra table (evaluation/baselines.py) on tiny in-memory episodes: the
learned routers fit on train alone, their operating point and the best single-turn router are chosen
on val alone, and test and OOD are reported apart. The real-server run is in tests/stages/test_orchestra.py."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from evaluation import baselines as bl
from models import registry
from models.base import RoutingData
from models.mtrouter.config import MTRouterConfig
from models.mtrouter.history import HashingTextEncoder
from models.mtrouter.router import MTRouterRouter
from routerops.errors import InputError
from routerops.grid import logged_outcomes_from_trajectories
from routerops.pricing import Pool, Price, PriceBook, WorkerSpec
from routerops.types import Task

SIZES = {"train": 16, "val": 6, "test": 6, "ood": 4}
TOKENS = {"cheap": (20, 10), "dear": (20, 60)}


@pytest.fixture
def pool() -> Pool:
    def spec(name: str) -> WorkerSpec:
        return WorkerSpec(name=name, kind="llm", primitives=("answer",), generation={"max_tokens": 64},
                          attributes={"params_b": 1.0 if name == "cheap" else 70.0})

    return Pool("toy", (spec("cheap"), spec("dear")))


@pytest.fixture
def book() -> PriceBook:
    return PriceBook("toy-1", dt.date(2026, 1, 1), {"cheap": Price(0.1, 0.4), "dear": Price(5.0, 15.0)})


def toy_world(book: PriceBook) -> tuple[list[Task], pd.DataFrame]:
    """Arithmetic: both workers right; capitals: only the dear one. Ids carry their split; OOD
    tasks are all capitals, so a router that learned the split of the work routes them dear."""
    tasks, rows, i = [], [], 0
    for split, n in SIZES.items():
        for _ in range(n):
            arithmetic = split != "ood" and i % 2 == 0
            prompt = f"What is {i} plus {3 * i}?" if arithmetic else f"Name the capital of country number {i}."
            tasks.append(Task(task_id=f"{split}/{i}", suite="toy", split=split, prompt=prompt, answer="x"))
            for worker in ("cheap", "dear"):
                right = arithmetic or worker == "dear"
                prompt_tokens, completion_tokens = TOKENS[worker]
                rows.append({"task_id": f"{split}/{i}", "split": split, "policy": f"single/{worker}/answer",
                             "score": float(right), "success": right, "final_answer": "x",
                             "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                             "cost_usd": book.cost(worker, prompt_tokens, completion_tokens)})
            if split in bl.SCORED_SPLITS:
                rows.append({**rows[-1 - (i % 2)], "policy": "uniform_random"})
            i += 1
    return tasks, pd.DataFrame(rows)


def tiny_mtrouter(seed: int) -> MTRouterRouter:
    """MTRouter with the hashing encoder and small widths, so it trains in a second."""
    cfg = MTRouterConfig(encoder_kind="hashing", hashing_dim=64, hidden_dims=(32,), attr_embed_dim=8, residual_dim=4,
                         model_embed_dim=8, max_epochs=30, patience=30, dropout=0.0, disk_cache=False,
                         surface_features=False)
    return MTRouterRouter(cfg, seed=seed)


@pytest.mark.slow
def test_learned_routers_fit_on_train_alone_and_test_and_ood_are_reported_apart(pool, book, monkeypatch,
                                                                               record_fits):
    seen = {"knn": set(), "mtrouter": set()}
    monkeypatch.setitem(registry.ROUTER_FACTORIES, "knn", record_fits(registry.ROUTER_FACTORIES["knn"], seen["knn"]))
    monkeypatch.setitem(registry.ROUTER_FACTORIES, "mtrouter", record_fits(tiny_mtrouter, seen["mtrouter"]))
    tasks, episodes = toy_world(book)
    grid = logged_outcomes_from_trajectories(episodes, tasks)

    # word-hashing query vectors: the arithmetic and capitals prompts share few words, as MiniLM's would
    table, selection = bl.baseline_table(episodes, grid, book, pool, ["knn", "logistic"], [0, 1],
                                         HashingTextEncoder(dim=64))

    train_ids = {t.task_id for t in tasks if t.split == "train"}
    assert seen["knn"] and seen["knn"] <= train_ids  # no val, test or OOD task reaches the training data
    assert seen["mtrouter"] and seen["mtrouter"] <= train_ids
    assert list(table.columns) == bl.TABLE_COLUMNS
    assert list(table.split.unique()) == ["test", "ood"]
    for split in ("test", "ood"):
        rows = table[table.split == split].set_index("policy")
        assert list(rows.kind) == ["single", "single", "random", "router", "mtrouter"]
        assert (rows.episodes == SIZES[split]).all()
        assert rows.loc["single/dear/answer", "accuracy"] == 1.0
        assert rows.loc["single/cheap/answer", "accuracy"] == (0.5 if split == "test" else 0.0)
        # the router learned the split of the work: as right as the dear worker, at less than its cost
        assert rows.loc["knn", "accuracy"] == 1.0
        assert rows.loc["knn", "usd_per_episode"] <= rows.loc["single/dear/answer", "usd_per_episode"]
        assert rows.protocol.str.contains(f"on {split}").all()
    assert table[table.kind == "router"].protocol.str.contains("chosen on val among knn, logistic").all()
    assert set(selection.router) == {"knn", "logistic", "mtrouter"} and len(selection) == 6
    assert selection[selection.reported].router.nunique() == 2


def test_operating_point_is_the_most_accurate_on_val_then_the_cheapest():
    # 4 val tasks, workers (cheap, dear): the dear one is always right, the cheap one on tasks 0 and 1
    success = np.array([[1, 1], [1, 1], [0, 1], [0, 1]], dtype=float)
    usd = np.array([[1.0, 10.0]] * 4)
    val = bl.GridSplit(RoutingData(["a", "b", "c", "d"], ["a", "b", "c", "d"], ["cheap", "dear"], success, usd),
                       success, usd)
    quality = np.array([[0.9, 0.95], [0.8, 0.9], [0.2, 0.9], [0.1, 0.8]])
    router, expected = registry.make_router("knn"), np.array([1.0, 10.0])
    point = bl.choose_operating_point(router, quality, val, expected)
    # λ = 0 sends all four dear (accuracy 1, $10); the chosen λ keeps accuracy 1 and sends 0 and 1 cheap
    assert point.accuracy == 1.0 and point.usd == pytest.approx(5.5)
    assert np.array_equal(bl.decide(router, quality, expected, point.knob), [0, 0, 1, 1])


def test_the_best_single_turn_router_is_chosen_on_val_alone():
    def result(name, val, test):
        return bl.LearnedResult(name, 0, 0.0, {"val": val, "test": test, "ood": test})

    learned = {"a": [result("a", (0.8, 2.0), (0.1, 9.0))], "b": [result("b", (0.7, 1.0), (1.0, 0.1))],
               "c": [result("c", (0.8, 1.0), (0.0, 9.0))], "d": [result("d", (0.8, 1.0), (1.0, 0.0))]}
    assert bl.choose_best_single_turn(learned, ["a", "b", "c", "d"]) == "c"  # val accuracy, then USD, then order
    assert bl.choose_best_single_turn(learned, ["d", "c"]) == "d"


def test_router_names_pool_and_splits_are_checked_before_any_call(pool):
    for names, message in (([], "at least one"), (["oracle"], "upper bound"), (["cascade"], "several workers"),
                           (["mtrouter"], "own row"), (["knn", "nope"], "unknown router")):
        with pytest.raises(InputError, match=message):
            bl.check_router_names(names)
    bl.check_router_names(["knn", "logistic", "mf", "mlp"])
    two = Pool("two", (WorkerSpec(name="w", kind="llm", primitives=("answer", "verify")),))
    with pytest.raises(InputError, match="workers\\[0\\].primitives"):
        bl.check_one_flat_primitive(two, "pool.yaml")
    tasks = [Task(task_id=s, suite="toy", split=s, prompt=s, answer="x") for s in ("train", "val", "test")]
    with pytest.raises(InputError, match="no 'ood' task"):
        bl.check_splits(tasks, "tasks.jsonl")


def test_random_router_runs_on_test_and_ood_over_every_flat_action(pool):
    tasks = [Task(task_id=s, suite="toy", split=s, prompt=s, answer="x") for s in bl.ALL_SPLITS]
    plan = {split: [p.name for p in policies] for split, _, policies in bl.baseline_collection_plan(pool, tasks, 3)}
    singles = ["single/cheap/answer", "single/dear/answer"]
    assert plan == {"train": singles, "val": singles, "test": [*singles, "uniform_random"],
                    "ood": [*singles, "uniform_random"]}
    assert bl.random_router(3).primitives is None  # tools too: the action space of the singles and routers
