"""Where the critique / CoRL code gets its LM controller: one factory, so the sampler behind the
`Controller` protocol (routerops/orchestra/controller.py: `respond(conversations) -> [ControllerTurn]`)
is a one-line change. Today it is the orchestrator's transformers `LMController` over the model the RL
trainer is updating (so rollouts are on-policy: the same weights, adapter included); the fast batched
KV-cached sampler of the RL issue (models/orchestrator/sampler.py) implements the same contract.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from models.orchestrator.config import GenerationSettings
from models.orchestrator.lm import LMController
from routerops.orchestra.controller import Controller


def make_controller(model: torch.nn.Module, tokenizer: Any, settings: GenerationSettings, *, temperature: float,
                    seed: int, name: str = "critique-lm") -> Controller:
    """A Controller sampling from `model` at `temperature` (0 = greedy), seeded."""
    settings = dataclasses.replace(settings, temperature=temperature, top_p=1.0, seed=seed)
    return LMController(model, tokenizer, settings, name=name)
