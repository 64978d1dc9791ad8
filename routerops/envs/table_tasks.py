"""Tasks from the queries of a logged-outcome table, with one seeded split by query.

The main pipeline's default pool replays RouteLLM's GSM8K answers (routerops/workers/replay_endpoint.py):
its tasks are the table's questions, so every worker of the pool — the replayed GPT-4-1106 and
Mixtral-8x7B, and SmolLM2 live — is asked the same question, and the verifier (math-verify, against
GSM8K's reference answer) scores what each said. The split is drawn once, by query, from a seeded
permutation: the first `test` queries are test, the next `val` val, the next `train` train, and the
rest are left out. No query is in two splits, so what is fit on train and chosen on val never saw a
test query.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from routerops.envs.jsonl_qa import VERIFIER as MATH_VERIFIER
from routerops.errors import InputError
from routerops.files import read_json_lines
from routerops.types import Task

SPLIT_ORDER = ("test", "val", "train")  # drawn in this order, so test's queries do not move when train grows


def split_by_query(query_ids: list[str], sizes: dict[str, int], seed: int, source: object = "table") -> dict[str, str]:
    """query id → split, from a permutation seeded by `seed` (the ids are sorted first, so the split
    does not depend on the table's row order)."""
    wanted = sum(sizes.get(s, 0) for s in SPLIT_ORDER)
    ids = sorted(set(query_ids))
    if wanted > len(ids):
        raise InputError(source, "materialise", f"train + val + test = {wanted} queries, but the table has {len(ids)}")
    order = np.random.default_rng(seed).permutation(len(ids))
    split, start = {}, 0
    for name in SPLIT_ORDER:
        for i in order[start:start + sizes.get(name, 0)]:
            split[ids[i]] = name
        start += sizes.get(name, 0)
    return split


def reference_answers(path: str | Path) -> dict[str, str]:
    """query id → reference answer, from a JSONL file of {"query_id", "answer"} objects."""
    path = Path(path)
    answers = {}
    for number, obj in read_json_lines(path):
        if not isinstance(obj.get("query_id"), str) or not isinstance(obj.get("answer"), str):
            raise InputError(path, f"line {number}", "expected {\"query_id\": text, \"answer\": text}")
        answers[obj["query_id"]] = obj["answer"]
    return answers


def table_tasks(frame: pd.DataFrame, answers_path: str | Path, sizes: dict[str, int], seed: int) -> list[Task]:
    """One math-verify task per query of the split (`sizes`: queries per split), in split order."""
    queries = frame.drop_duplicates("query_id").set_index("query_id")
    split = split_by_query(list(queries.index), sizes, seed, answers_path)
    answers = reference_answers(answers_path)
    missing = sorted(q for q in split if q not in answers)
    if missing:
        raise InputError(answers_path, missing[0], "no reference answer for a query of the table")
    return [Task(task_id=q, suite=str(queries.at[q, "dataset"]), split=split[q], prompt=str(queries.at[q, "query"]),
                 answer=answers[q], meta={"verifier": MATH_VERIFIER, "query_id": q})
            for name in SPLIT_ORDER for q in sorted(split) if split[q] == name]
