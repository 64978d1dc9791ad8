"""The controller engine that GenerationSettings.engine names: `fast` (models/orchestrator/sampler.py),
`llama_cpp` (models/orchestrator/llama_sampler.py, built on the fast sampler) or `transformers`
(models/orchestrator/lm.py). Apart from both samplers, so neither imports the other's chooser: the
llama.cpp sampler extends the fast one, and only this module picks between them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from models.orchestrator.config import GenerationSettings, ModelSpec
from models.orchestrator.lm import (LMController, base_gguf, base_model_folder, load_controller_model,
                                   resolve_device)
from models.orchestrator.sampler import FastSampler
from routerops.errors import InputError


def controller_for(model: torch.nn.Module, tokenizer: Any, settings: GenerationSettings, name: str = "lm",
                   version: str = "1", gguf: Path | None = None, work_dir: Path | None = None,
                   weights: str = "f32") -> Any:
    """The controller over `model` that settings.engine names. llama_cpp needs `gguf`, the file the
    model's base weights were dequantised from, and keeps its dense copy (`weights`: f32, or f16 for
    RL rollouts, RLSettings.rollout_weights) in `work_dir`."""
    if settings.engine == "llama_cpp":
        from models.orchestrator.llama_sampler import LlamaCppSampler

        if gguf is None:
            raise InputError("orchestra.controller", "engine", "llama_cpp samples from the base model's GGUF, and "
                             "this model has none (a local transformers folder): use engine fast")
        return LlamaCppSampler(model, tokenizer, settings, gguf, name=name, version=version, work_dir=work_dir,
                               weights=weights)
    cls = FastSampler if settings.engine == "fast" else LMController
    return cls(model, tokenizer, settings, name=name, version=version)


def load_controller_engine(spec: ModelSpec, settings: GenerationSettings, adapter: Path | None = None,
                           cache_root: Path | None = None, name: str | None = None,
                           version: str = "1") -> FastSampler | LMController:
    """`LMController.load`, through the engine settings.engine names."""
    device = resolve_device(settings.device, "orchestra.controller")
    model, tokenizer = load_controller_model(spec, adapter, device, cache_root)
    default = spec.name if adapter is None else f"{spec.name}+{Path(adapter).name}"
    return controller_for(model, tokenizer, settings, name=name or default, version=version,
                          gguf=base_gguf(spec), work_dir=base_model_folder(spec, cache_root).parent)
