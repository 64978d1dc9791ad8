"""reasoning-gym suites: deterministic, disjoint splits, OOD families held out; JSONL task files."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest

from routerops.envs.qa import score_answer
from routerops.envs.suites import (
    DEFAULT_FAMILIES,
    DEFAULT_OOD_FAMILIES,
    assert_splits_disjoint,
    materialise_suites,
    read_tasks,
    split_seed,
    write_tasks,
)
from routerops.errors import InputError

SIZES = {"train": 30, "val": 10, "test": 15, "ood": 12}


@pytest.fixture(scope="module")
def tasks():
    return materialise_suites(["basic_arithmetic", "leg_counting", "gcd"], ["chain_sum"], SIZES, seed=7)


def test_same_seed_gives_the_same_tasks_and_another_seed_other_tasks(tasks):
    again = materialise_suites(["basic_arithmetic", "leg_counting", "gcd"], ["chain_sum"], SIZES, seed=7)
    assert again == tasks
    other = materialise_suites(["basic_arithmetic", "leg_counting", "gcd"], ["chain_sum"], SIZES, seed=8)
    assert {t.prompt for t in other} != {t.prompt for t in tasks}


def test_sizes_per_family_and_split(tasks):
    counts = Counter((t.suite, t.split) for t in tasks)
    for family in ("basic_arithmetic", "leg_counting", "gcd"):
        for split in ("train", "val", "test"):
            assert counts[(f"rg/{family}", split)] == SIZES[split]
    assert counts[("rg/chain_sum", "ood")] == SIZES["ood"]
    assert len({t.task_id for t in tasks}) == len(tasks)


def test_splits_never_share_a_question(tasks):
    by_split: dict[str, set[tuple[str, str]]] = {}
    for t in tasks:
        by_split.setdefault(t.split, set()).add((t.suite, t.prompt))
    splits = list(by_split)
    for i, a in enumerate(splits):
        for b in splits[i + 1:]:
            assert not by_split[a] & by_split[b], (a, b)
    # Tiny families repeat questions: the generator must skip repeats rather than leak them.
    small = materialise_suites(["gcd"], [], {"train": 40, "val": 40, "test": 40},
                               configs={"gcd": {"min_value": 2, "max_value": 20}})
    assert len({t.prompt for t in small}) == 120


def test_ood_family_appears_only_in_the_ood_split(tasks):
    assert {t.split for t in tasks if t.suite == "rg/chain_sum"} == {"ood"}
    assert {t.suite for t in tasks if t.split == "ood"} == {"rg/chain_sum"}


def test_split_seeds_differ_per_split_and_are_stable():
    seeds = {split_seed(0, "gcd", s) for s in ("train", "val", "test", "ood")}
    assert len(seeds) == 4
    assert split_seed(0, "gcd", "train") == split_seed(0, "gcd", "train")


def test_meta_keeps_the_entry_and_reasoning_gym_scores_the_reference_answer(tasks):
    for task in tasks[::5]:
        json.dumps(task.meta)  # JSON-serialisable
        assert task.meta["rg_entry"]["answer"] == task.answer
        assert score_answer(task, task.answer) == 1.0
        assert score_answer(task, "not a number") < 1.0


def test_default_families_generate(tmp_path):
    small = materialise_suites(sizes={"train": 3, "val": 2, "test": 2, "ood": 2}, seed=0)
    assert {t.suite for t in small} == {f"rg/{f}" for f in (*DEFAULT_FAMILIES, *DEFAULT_OOD_FAMILIES)}


def test_a_zero_size_split_is_empty():
    only_test = materialise_suites(["chain_sum"], ["gcd"], {"train": 0, "test": 3})
    assert [t.split for t in only_test] == ["test"] * 3


def test_bad_arguments_are_input_errors():
    with pytest.raises(InputError) as err:
        materialise_suites(["gcd"], ["gcd"], SIZES)
    assert err.value.field == "ood_families"
    with pytest.raises(InputError) as err:
        materialise_suites(["no_such_family"], [], SIZES)
    assert err.value.field == "families.no_such_family"
    with pytest.raises(InputError) as err:
        materialise_suites(["gcd"], [], {"train": -1})
    assert err.value.field == "sizes.train"
    with pytest.raises(InputError) as err:
        materialise_suites(["gcd"], [], {"training": 3})
    assert err.value.field == "sizes.training"


def test_leak_check_catches_a_question_in_two_splits(tasks):
    leaked = [*tasks, replace(tasks[0], task_id="leak", split="test")]
    with pytest.raises(AssertionError, match="splits"):
        assert_splits_disjoint(leaked)


# ---------------------------------------------------------------- JSONL files


def test_write_then_read_round_trips(tasks, tmp_path):
    path = write_tasks(tasks, tmp_path / "sub" / "tasks.jsonl")
    assert read_tasks(path) == tasks
    assert [p.name for p in path.parent.iterdir()] == ["tasks.jsonl"]  # no temp file left behind


def test_read_reports_file_line_and_field(tasks, tmp_path):
    path = write_tasks(tasks[:3], tmp_path / "tasks.jsonl")
    lines = path.read_text().splitlines()

    def broken(line_2: str) -> InputError:
        path.write_text("\n".join([lines[0], line_2, lines[2]]) + "\n")
        with pytest.raises(InputError) as err:
            read_tasks(path)
        assert err.value.path == str(path)
        return err.value

    record = json.loads(lines[1])
    assert broken("{not json").field == "line 2"
    assert broken(json.dumps({k: v for k, v in record.items() if k != "answer"})).field == "line 2: answer"
    assert broken(json.dumps({**record, "prompt": 3})).field == "line 2: prompt"
    assert broken(json.dumps({**record, "meta": []})).field == "line 2: meta"
    assert broken(json.dumps({**record, "extra": 1})).field == "line 2: extra"
    assert broken(lines[0]).field == "line 2: task_id"  # duplicate id
    with pytest.raises(InputError) as err:
        read_tasks(tmp_path / "missing.jsonl")
    assert err.value.field == "<file>"


def test_a_failed_write_keeps_the_old_file(tasks, tmp_path):
    path = write_tasks(tasks[:2], tmp_path / "tasks.jsonl")
    before = path.read_bytes()
    with pytest.raises(TypeError):
        write_tasks([tasks[0], replace(tasks[1], meta={"bad": object()})], path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["tasks.jsonl"]
