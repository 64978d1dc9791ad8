"""Procedural QA suites from reasoning-gym: the embedded default task source.

Each family (a reasoning-gym dataset) is generated with a seed fixed by (run seed, family, split),
so the same arguments always give the same tasks, and every split draws from its own seed. A
question that an earlier split already holds is skipped (small families can repeat a question), so
no question is ever in two splits. Families in `ood_families` only appear in split "ood": they are
the held-out task types of the evaluation protocol.

Task.meta keeps the reasoning-gym entry (question, answer, metadata, JSON-safe), so the verifier
can call the family's own `score_answer` on it (routerops.envs.qa).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from routerops.errors import InputError
from routerops.files import read_json_lines
from routerops.types import Task

SPLITS = ("train", "val", "test")
OOD_SPLIT = "ood"
VERIFIER = "reasoning-gym"  # Task.meta["verifier"] for these tasks
SUITE_PREFIX = "rg/"

# Chosen because SmolLM2-135M answers some of them unaided and a calculator answers many. Measured
# on 10 test tasks each with the DEFAULT_CONFIGS below (configs/pool.yaml settings, temperature 0),
# exact-score rate smol-direct / smol-cot / python tool / sympy tool: basic_arithmetic 2/2/10/10,
# chain_sum 2/3/10/10, gcd 1/2/0/0, lcm (values ≤ 12) 3/2/0/0, products 1/2/10/10, OOD
# decimal_chain_sum 0/0/10/10; gcd and lcm prompts hold no arithmetic expression, so the tools only
# help there when an LLM writes the code. (leg_counting is left out: SmolLM2 got 0/20 even with
# a single kind of animal, and no tool helps.)
# Each family generates 1000 items in well under a second.
DEFAULT_FAMILIES = ("basic_arithmetic", "chain_sum", "gcd", "lcm", "products")
DEFAULT_OOD_FAMILIES = ("decimal_chain_sum",)
# Difficulty settings within the families' ranges, easier than reasoning-gym's defaults so that
# the 135M model is sometimes right (otherwise every router learns "always call the tool").
DEFAULT_CONFIGS: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
    "gcd": {"min_value": 2, "max_value": 100},
    "lcm": {"min_value": 2, "max_value": 25},  # ≥ 25 leaves enough distinct pairs for 350 questions
    "leg_counting": {"min_animals": 1, "max_animals": 3, "min_instances": 1, "max_instances": 4},
    "products": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 3},
    "decimal_chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2,
                          "max_decimal_places": 2},
}
OVERSAMPLE = 4  # draw up to this many times the wanted count to replace questions seen in other splits
TASK_FIELDS = ("task_id", "suite", "split", "prompt", "answer", "meta")


def split_seed(seed: int, family: str, split: str) -> int:
    """A seed per (run seed, family, split): stable across Python runs (unlike hash())."""
    digest = hashlib.sha256(json.dumps([int(seed), family, split]).encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _json_safe(value: Any) -> Any:
    """reasoning-gym metadata holds tuples; JSON turns them into lists, which its scorers accept."""
    return json.loads(json.dumps(value, default=str))


def _generate(family: str, split: str, count: int, seed: int, seen: set[str],
              config: Mapping[str, Any]) -> list[Task]:
    """`count` tasks of `family` for `split`, skipping questions in `seen` (which it extends)."""
    import reasoning_gym  # imported here: importing it loads every family's module (~1 s)

    if count == 0:  # some families refuse size 0
        return []
    try:
        dataset = reasoning_gym.create_dataset(family, seed=split_seed(seed, family, split),
                                               size=count * OVERSAMPLE, **dict(config))
    except (ValueError, TypeError, AssertionError) as exc:
        raise InputError("suites", f"families.{family}", f"reasoning-gym cannot build it: {exc}") from exc
    tasks: list[Task] = []
    for index in range(len(dataset)):
        if len(tasks) == count:
            break
        entry = _json_safe(dataset[index])
        if entry["question"] in seen:
            continue
        seen.add(entry["question"])
        tasks.append(Task(
            task_id=f"{SUITE_PREFIX}{family}/{split}/{len(tasks)}", suite=SUITE_PREFIX + family, split=split,
            prompt=entry["question"], answer=str(entry["answer"]),
            meta={"verifier": VERIFIER, "rg_dataset": family, "rg_entry": entry, "rg_seed": dataset.seed},
        ))
    if len(tasks) < count:
        raise InputError("suites", f"sizes.{split}", f"family {family} has only {len(tasks)} distinct new "
                         f"questions for {split} (asked {count}); ask fewer or widen its difficulty")
    return tasks


def _check_sizes(sizes: Mapping[str, int]) -> None:
    for split in (*SPLITS, OOD_SPLIT):
        value = sizes.get(split, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError("suites", f"sizes.{split}", f"expected a non-negative integer, got {value!r}")
    unknown = set(sizes) - {*SPLITS, OOD_SPLIT}
    if unknown:
        raise InputError("suites", f"sizes.{sorted(unknown)[0]}", f"unknown split; use {(*SPLITS, OOD_SPLIT)}")


def materialise_suites(
    families: Sequence[str] = DEFAULT_FAMILIES, ood_families: Sequence[str] = DEFAULT_OOD_FAMILIES,
    sizes: Mapping[str, int] | None = None, seed: int = 0,
    configs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Task]:
    """Tasks of every in-distribution family for train/val/test and of every OOD family for "ood".

    `sizes` gives tasks per family and split (train, val, test, ood); `configs` overrides a family's
    reasoning-gym settings (DEFAULT_CONFIGS otherwise, else reasoning-gym's own defaults).
    """
    sizes = dict(sizes or {"train": 200, "val": 50, "test": 100, "ood": 100})
    _check_sizes(sizes)
    overlap = sorted(set(families) & set(ood_families))
    if overlap:
        raise InputError("suites", "ood_families", f"{overlap[0]} is also an in-distribution family")
    configs = {**DEFAULT_CONFIGS, **(configs or {})}
    tasks: list[Task] = []
    plan = [(f, s) for f in families for s in SPLITS] + [(f, OOD_SPLIT) for f in ood_families]
    seen_by_family: dict[str, set[str]] = {}
    for family, split in plan:
        seen = seen_by_family.setdefault(family, set())
        tasks += _generate(family, split, sizes.get(split, 0), seed, seen, configs.get(family, {}))
    assert_splits_disjoint(tasks)
    return tasks


def assert_splits_disjoint(tasks: Sequence[Task]) -> None:
    """No question (within a suite) appears in two splits; a leak would inflate test scores."""
    split_of: dict[tuple[str, str], str] = {}
    for task in tasks:
        key = (task.suite, task.prompt)
        other = split_of.setdefault(key, task.split)
        if other != task.split:
            raise AssertionError(f"{task.suite}: question {task.prompt[:60]!r} is in splits {other} and {task.split}")


# ---------------------------------------------------------------- JSONL files


def write_tasks(tasks: Sequence[Task], path: str | Path) -> Path:
    """One JSON object per task; written to a temp file and renamed, so a crash leaves no torn file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for task in tasks:
                fh.write(json.dumps(asdict(task), ensure_ascii=False, sort_keys=True) + "\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _task_from_record(path: Path, number: int, record: Any) -> Task:
    if not isinstance(record, dict):
        raise InputError(path, f"line {number}", "expected a JSON object")
    for key in TASK_FIELDS:
        if key not in record:
            raise InputError(path, f"line {number}: {key}", "missing")
    unknown = sorted(set(record) - set(TASK_FIELDS))
    if unknown:
        raise InputError(path, f"line {number}: {unknown[0]}", "unknown field")
    for key in TASK_FIELDS[:-1]:
        if not isinstance(record[key], str):
            raise InputError(path, f"line {number}: {key}", f"expected a string, got {record[key]!r}")
    for key in ("task_id", "suite", "split", "prompt"):
        if not record[key].strip():
            raise InputError(path, f"line {number}: {key}", "empty")
    if not isinstance(record["meta"], dict):
        raise InputError(path, f"line {number}: meta", "expected a JSON object")
    return Task(**record)


def read_tasks(path: str | Path) -> list[Task]:
    """Tasks written by `write_tasks`; errors name the file, the line and the field."""
    path = Path(path)
    tasks, ids = [], set()
    for number, record in read_json_lines(path):
        task = _task_from_record(path, number, record)
        if task.task_id in ids:
            raise InputError(path, f"line {number}: task_id", f"duplicate task id {task.task_id!r}")
        ids.add(task.task_id)
        tasks.append(task)
    return tasks
