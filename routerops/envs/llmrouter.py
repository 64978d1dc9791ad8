"""LLMRouter's nine-model table (ulab-uiuc/LLMRouter, `dcrouter_preprocessed`) as logged outcomes.

The source is a JSON list of `{question, scores, cluster_id}`: `scores` maps each model to a score
in [0, 1] (a dict, or its Python repr as a string); > 0.5 counts as correct (the data README's
rule, which reproduces its per-model accuracies). `llm_candidates.json` gives each model's price per
1M input / output tokens; `price_book_from_candidates` turns it into a price book.

No token counts were logged, so they are ESTIMATES: prompt tokens of the question under SmolLM2's
BPE (`count_tokens`), completion tokens a constant (`completion_tokens`, default 0). On this table
every model's input and output prices are equal, so on any one query the workers' costs stand in
the ratio of their prices whatever the completion length: "≤ 15 % of the best model's cost" means
the same mix of workers under either assumption; only how queries weigh in the mean moves.

The table gets a seeded `split` column (by query: train / val / test), so `routerops replay
--split-column split` fits on train and scores the rest, and `dataset` = `dcrouter/c<cluster_id>`
keeps LLMRouter's query cluster for cross-cluster protocols.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from routerops.envs.jsonl_qa import refuse_duplicates
from routerops.envs.replay import smollm2_token_counter, validate_logged_outcomes
from routerops.errors import InputError
from routerops.files import read_text
from routerops.schema import write_text_atomic

CORRECT_ABOVE = 0.5  # data README: "> 0.5 = correct"
SPLITS = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)
SOURCE = "ulab-uiuc/LLMRouter dcrouter_preprocessed (train split)"


def _read_json(path: Path):
    if not path.is_file():
        raise InputError(path, "<file>", "file not found")
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise InputError(path, "<file>", f"not JSON: {exc}") from exc


def _scores(path: Path, i: int, raw) -> dict[str, float]:
    if isinstance(raw, str):  # some releases store the dict's Python repr
        try:
            raw = ast.literal_eval(raw)
        except (ValueError, SyntaxError) as exc:
            raise InputError(path, f"[{i}].scores", f"not a mapping model -> score: {raw[:60]!r}") from exc
    if not isinstance(raw, dict) or not raw:
        raise InputError(path, f"[{i}].scores", "expected a non-empty mapping model -> score")
    out = {}
    for model, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise InputError(path, f"[{i}].scores.{model}", f"{value!r} is not a number in [0, 1]")
        out[str(model)] = float(value)
    return out


def assign_splits(n: int, seed: int = 0, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> np.ndarray:
    """A seeded split label per query: a permutation cut at the cumulative fractions."""
    if len(fractions) != len(SPLITS) or min(fractions) < 0 or not np.isclose(sum(fractions), 1.0):
        raise InputError("split fractions", "fractions", f"need {len(SPLITS)} non-negative fractions summing to 1, "
                         f"got {list(fractions)}")
    order = np.random.default_rng(seed).permutation(n)
    cuts = np.round(np.cumsum(fractions)[:-1] * n).astype(int)
    labels = np.empty(n, dtype=object)
    for name, rows in zip(SPLITS, np.split(order, cuts)):
        labels[rows] = name
    return labels


def import_llmrouter(json_path: str | Path, split_seed: int = 0, fractions: Sequence[float] = DEFAULT_FRACTIONS,
                     completion_tokens: int = 0, count_tokens: Callable[[str], int] | None = None,
                     binarize: bool = True) -> pd.DataFrame:
    """The nine-model JSON → a logged-outcome table (docs/replay_format.md) with a `split` column.

    score: 1.0 if the logged score > 0.5 else 0.0 (`binarize`; the logged value stays in
    `raw_score`). Query ids are `dcrouter/<row>`; workers are the models in the first row's order.
    """
    path = Path(json_path)
    records = _read_json(path)
    if not isinstance(records, list) or not records:
        raise InputError(path, "<file>", "expected a non-empty JSON list of {question, scores, cluster_id}")
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("question"), str):
            raise InputError(path, f"[{i}].question", "missing or not text")
    refuse_duplicates(path, "question", [r["question"] for r in records], list(range(len(records))), "record")
    count = count_tokens or smollm2_token_counter()
    labels = assign_splits(len(records), split_seed, fractions)
    rows = []
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("question"), str):
            raise InputError(path, f"[{i}].question", "missing or not text")
        scores = _scores(path, i, record.get("scores"))
        cluster = record.get("cluster_id", "na")
        prompt = count(record["question"])
        for model, value in scores.items():
            rows.append({"dataset": f"dcrouter/c{cluster}", "query_id": f"dcrouter/{i}", "query": record["question"],
                         "worker": model, "score": float(value > CORRECT_ABOVE) if binarize else value,
                         "raw_score": value, "prompt_tokens": prompt, "completion_tokens": int(completion_tokens),
                         "split": labels[i]})
    frame = validate_logged_outcomes(pd.DataFrame(rows), source=path)
    frame.attrs.update({
        "source": SOURCE,
        "token_counts": "prompt: SmolLM2-135M BPE of the question (estimate); completion: constant "
                        f"{int(completion_tokens)}; LLMRouter logged none",
        "score_rule": f"> {CORRECT_ABOVE} = correct" if binarize else "logged score",
        "split_seed": int(split_seed), "split_fractions": json.dumps(list(map(float, fractions))),
    })
    return frame


def price_book_from_candidates(candidates_path: str | Path, version: str = "llmrouter-candidates",
                               effective_date: str = "2025-01-01") -> dict:
    """llm_candidates.json → a price book mapping (routerops.pricing's YAML schema): USD per 1M
    input / output tokens; cached input at the input price; no per-call fee."""
    path = Path(candidates_path)
    data = _read_json(path)
    if not isinstance(data, dict) or not data:
        raise InputError(path, "<file>", "expected a mapping model -> {input_price, output_price, ...}")
    prices = {}
    for model, spec in data.items():
        for key in ("input_price", "output_price"):
            value = spec.get(key) if isinstance(spec, dict) else None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InputError(path, f"{model}.{key}", f"expected a price ≥ 0, got {value!r}")
        prices[str(model)] = {"input_per_1m": float(spec["input_price"]), "output_per_1m": float(spec["output_price"]),
                              "cached_input_per_1m": float(spec["input_price"]), "per_call": 0.0}
    dt.date.fromisoformat(effective_date)
    return {"version": version, "effective_date": effective_date, "currency": "USD", "prices": prices}


def write_price_book(book: dict, path: str | Path) -> Path:
    header = "# Prices of LLMRouter's candidate models (llm_candidates.json), written by import-llmrouter.\n"
    return write_text_atomic(header + yaml.safe_dump(book, sort_keys=False), path)
