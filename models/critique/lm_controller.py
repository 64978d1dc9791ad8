"""Where the critique / CoRL code gets its LM controller: one factory, so the sampler behind the
`Controller` protocol (routerops/orchestra/controller.py: `respond(conversations) -> [ControllerTurn]`)
is a one-line change. It is the RL stage's engine (models/orchestrator/engines.py: `controller_for`,
the fast batched KV-cached sampler over a merged copy of the policy unless settings.engine says
"transformers"); the training loop re-syncs it to the trainer's weights before every step, so rollouts
stay on-policy.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from models.orchestrator.config import GenerationSettings
from models.orchestrator.engines import controller_for
from routerops.orchestra.controller import Controller


def make_controller(model: torch.nn.Module, tokenizer: Any, settings: GenerationSettings, *, temperature: float,
                    seed: int, name: str = "critique-lm") -> Controller:
    """A Controller sampling from `model` at `temperature` (0 = greedy), seeded."""
    settings = dataclasses.replace(settings, temperature=temperature, top_p=1.0, seed=seed)
    return controller_for(model, tokenizer, settings, name=name)
