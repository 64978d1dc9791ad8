"""Serving a fitted MTRouter (paper 000): a task and its history in, the next worker (or STOP) out.

`ServedMTRouter` is the multi-turn `Servable` (evaluation/servable.py). Input: a DataFrame with `task`
(text), `history` (JSON list of {"action", "observation"}, possibly empty), `candidates` (JSON list
of worker names; null = the whole pool), `budget_usd` (remaining USD; null = no limit) and
`turns_left` (null = no limit). Through MLflow every column is required, nulls included: MLflow
drops columns its signature does not name, so a misspelt `budget` is caught only because
`budget_usd` is then missing; in process the last three may be left out. Any other column, a
negative or non-numeric limit, or a blank task is an InputError. A task longer than
MAX_TEXT_CHARS (evaluation/servable.py) is read from its start, an action or observation from its
end (what §3.2's truncation keeps). Output: `worker` — eq. 8 (minus λ·ĉ) over the affordable
candidates, or "STOP" when no turn is left or none is affordable — and `score:<worker>` = ŝ(h_t, a)
for every pool worker (NaN for workers not among the row's candidates). It registers as
`mtrouter-<suite>`; saving writes the router's own directory (models/mtrouter/persistence.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types.schema import ColSpec, Schema

from evaluation.servable import (BUDGET_COLUMN, MODEL_INPUT, SCORE_PREFIX, WORKER_COLUMN, cap_text, read_limits,
                                 read_texts, reject_unknown_columns, servable_json, warn_if_capped,
                                 write_servable_meta)
from evaluation.serving import MTROUTER
from evaluation.serving.single_turn import registered_name
from models.mtrouter.history import Interaction
from models.mtrouter.router import MTRouter
from routerops.errors import InputError

TASK_COLUMN, HISTORY_COLUMN, CANDIDATES_COLUMN, TURNS_LEFT_COLUMN = "task", "history", "candidates", "turns_left"
INPUT_COLUMNS = (TASK_COLUMN, HISTORY_COLUMN, CANDIDATES_COLUMN, BUDGET_COLUMN, TURNS_LEFT_COLUMN)
STOP_CHOICE = "STOP"
SOURCE = MODEL_INPUT
MODEL_NAME_PREFIX = "mtrouter-"


def _json_list(value: Any, row: int, column: str) -> list | None:
    """A JSON list cell (or an already-parsed list); None for a missing cell."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return list(value)
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return None
    try:
        parsed = json.loads(value)
    except (TypeError, json.JSONDecodeError) as exc:
        raise InputError(SOURCE, f"{column}[{row}]", f"not valid JSON: {exc}") from None
    if not isinstance(parsed, list):
        raise InputError(SOURCE, f"{column}[{row}]", f"expected a JSON list, got {type(parsed).__name__}")
    return parsed


def parse_history(value: Any, row: int = 0) -> list[Interaction]:
    """⟨u_i, o_{i+1}⟩ pairs from a JSON list of {"action": str, "observation": str} (eq. 2)."""
    pairs = []
    for i, item in enumerate(_json_list(value, row, HISTORY_COLUMN) or []):
        where = f"{HISTORY_COLUMN}[{row}][{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("action"), str):
            raise InputError(SOURCE, where, 'expected {"action": str, "observation": str}')
        if not isinstance(item.get("observation", ""), str):
            raise InputError(SOURCE, f"{where}.observation", "expected a string")
        # The newest characters, as §3.2's truncation keeps the newest tokens of a block.
        pairs.append(Interaction(cap_text(item["action"], "tail"), cap_text(item.get("observation", ""), "tail")))
    return pairs


def parse_candidates(value: Any, pool: Sequence[str], row: int = 0) -> list[str]:
    names = _json_list(value, row, CANDIDATES_COLUMN)
    if names is None:
        return list(pool)
    unknown = [n for n in names if n not in pool]
    if unknown or not names:
        problem = f"unknown worker {unknown[0]!r}" if unknown else "empty list"
        raise InputError(SOURCE, f"{CANDIDATES_COLUMN}[{row}]", f"{problem}; the router serves {list(pool)}")
    return list(dict.fromkeys(names))


class ServedMTRouter:
    """What `mlflow.pyfunc.load_model` returns the predictions of: one routing decision per row."""

    served_as = MTROUTER
    family = "mtrouter"

    def __init__(self, router: MTRouter, suite: str = "scienceworld"):
        self.router = router
        self.suite = suite
        self.workers = list(router.pool.names)

    def decide(self, task: str, history: Sequence[Interaction], candidates: Sequence[str], budget_usd: float,
               turns_left: float) -> tuple[str, np.ndarray]:
        """(worker or STOP, ŝ of every candidate) for one history."""
        router = self.router
        scores = router.score(router.features_of(task, history), candidates)
        affordable = [i for i, w in enumerate(candidates) if router.expected_cost.get(w, 0.0) <= budget_usd]
        if turns_left <= 0 or not affordable:
            return STOP_CHOICE, scores
        best = router.best_index([candidates[i] for i in affordable], scores[affordable])
        return candidates[affordable[best]], scores

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        frame = self._frame(model_input)
        budgets, turns_left = read_limits(frame, BUDGET_COLUMN), read_limits(frame, TURNS_LEFT_COLUMN)
        tasks = read_texts(frame, TASK_COLUMN)
        warn_if_capped(tasks, TASK_COLUMN)
        choices, table = [], np.full((len(frame), len(self.workers)), np.nan)
        for i, task in enumerate(tasks):
            task = cap_text(task)
            candidates = parse_candidates(frame[CANDIDATES_COLUMN].iloc[i] if CANDIDATES_COLUMN in frame else None,
                                          self.workers, i)
            choice, scores = self.decide(task, parse_history(frame[HISTORY_COLUMN].iloc[i], i), candidates,
                                         budgets[i], turns_left[i])
            choices.append(choice)
            table[i, [self.workers.index(w) for w in candidates]] = scores
        out = pd.DataFrame({WORKER_COLUMN: pd.Series(choices, dtype=object)})
        for j, worker in enumerate(self.workers):
            out[f"{SCORE_PREFIX}{worker}"] = table[:, j]
        return out

    @staticmethod
    def _frame(model_input: Any) -> pd.DataFrame:
        if isinstance(model_input, dict):
            model_input = pd.DataFrame(model_input)
        if not isinstance(model_input, pd.DataFrame):
            raise InputError(SOURCE, TASK_COLUMN, f"expected a DataFrame, got {type(model_input).__name__}")
        for column in (TASK_COLUMN, HISTORY_COLUMN):
            if column not in model_input.columns:
                raise InputError(SOURCE, column, f"missing column; expected {TASK_COLUMN}, {HISTORY_COLUMN} and "
                                 f"optionally {CANDIDATES_COLUMN}, {BUDGET_COLUMN}, {TURNS_LEFT_COLUMN}")
        reject_unknown_columns(model_input, INPUT_COLUMNS)
        return model_input.reset_index(drop=True)

    def get_raw_model(self) -> MTRouter:
        return self.router

    # ---- the Servable contract (evaluation/servable.py)
    def registered_name(self) -> str:
        return registered_name(self.suite, MODEL_NAME_PREFIX)

    def save(self, directory: str | Path) -> Path:
        directory = self.router.save(directory)
        return write_servable_meta(self, directory, suite=self.suite)

    @classmethod
    def load(cls, directory: str | Path) -> "ServedMTRouter":
        return cls(MTRouter.load(directory), servable_json(directory).get("suite", "scienceworld"))

    def signature(self) -> ModelSignature:
        # Every column required (null = the default): MLflow silently drops columns it does not know,
        # so a misspelt `budget` is caught only because budget_usd is then missing.
        inputs = Schema([ColSpec("string", TASK_COLUMN), ColSpec("string", HISTORY_COLUMN),
                         ColSpec("string", CANDIDATES_COLUMN), ColSpec("double", BUDGET_COLUMN),
                         ColSpec("double", TURNS_LEFT_COLUMN)])
        outputs = Schema([ColSpec("string", WORKER_COLUMN)]
                         + [ColSpec("double", f"{SCORE_PREFIX}{w}") for w in self.workers])
        return ModelSignature(inputs=inputs, outputs=outputs)

    def input_example(self) -> pd.DataFrame:
        """One turn-2 decision: the task, one ⟨action, observation⟩ pair, every worker offered."""
        history = [{"action": "look around", "observation": "This room is called the kitchen. You see a stove."}]
        return pd.DataFrame({TASK_COLUMN: ["Your task is to boil water. First, focus on the substance."],
                             HISTORY_COLUMN: [json.dumps(history)], CANDIDATES_COLUMN: [json.dumps(self.workers)],
                             BUDGET_COLUMN: [0.05], TURNS_LEFT_COLUMN: [5.0]})

    def tags(self) -> dict[str, str]:
        router = self.router
        return {"router_family": self.family, "suite": self.suite,
                "price_book_version": router.price_book.version if router.price_book is not None else "none",
                "pool": router.pool.name, "workers": ",".join(self.workers),
                "encoder_kind": router.cfg.encoder_kind, "encoder_id": router.encoder.text_encoder.encoder_id,
                "estimator_seed": str(router.cfg.seed)}

    def params(self) -> dict[str, Any]:
        return {**{f"estimator.{k}": v for k, v in dataclasses.asdict(self.router.cfg).items()},
                **{f"expected_cost_usd.{w}": c for w, c in self.router.expected_cost.items()}}

    def needs_encoder(self) -> bool:
        return self.router.cfg.encoder_kind != "hashing"
