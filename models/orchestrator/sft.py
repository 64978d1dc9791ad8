"""Supervised fine-tuning of the LM controller on verifier-kept teacher trajectories (paper 004 §4,
App. E): TRL's SFTTrainer with a PEFT LoRA adapter, loss on the controller's tokens only (sft_data.py).

`train_sft` is resumable: checkpoints go to out_dir every `save_steps`, and a rerun with the same
settings and data continues from the last one (a changed config or data file is refused rather than
mixed into the old run). MLflow logging stays above models/ (evaluation/sft_tracking.py) and reaches
training through `callbacks`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.orchestrator.config import OrchestraConfig, SFTSettings
from models.orchestrator.lm import base_model_folder, load_causal_lm, load_tokenizer, resolve_device
from models.orchestrator.sft_data import build_examples, file_fingerprint, read_conversations
from routerops.errors import RouteropsError

log = logging.getLogger(__name__)

RUN_FILE = "sft_run.json"  # what the checkpoints in out_dir were trained with
RESULT_FILE = "sft_result.json"
ADAPTER_DIR = "adapter"


@dataclass
class SFTResult:
    out_dir: Path
    adapter_dir: Path
    global_step: int
    resumed_from_step: int | None  # None: this call started from the base model
    loss_curve: list[dict[str, float]]  # one entry per logging step: step, loss, learning_rate, grad_norm ...
    train_seconds: float  # this call's trainer.train()
    data: dict[str, int]  # conversations, tokens and assistant (trained) tokens per epoch

    def to_json(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record.update(out_dir=str(self.out_dir), adapter_dir=str(self.adapter_dir))
        return record


def run_record(run: OrchestraConfig, data_sha256: str) -> dict[str, Any]:
    settings = {"model": dataclasses.asdict(run.model), "sft": dataclasses.asdict(run.sft)}
    return json.loads(json.dumps({"settings": settings, "data_sha256": data_sha256}))  # tuples → lists


def prepare_out_dir(out_dir: Path, record: dict[str, Any], resume: bool) -> str | None:
    """The checkpoint to resume from, or None. A rerun resumes only the same run: other settings or
    other data would silently mix two trainings under one schedule, so they are refused."""
    from transformers.trainer_utils import get_last_checkpoint

    out_dir.mkdir(parents=True, exist_ok=True)
    run_file = out_dir / RUN_FILE
    checkpoint = get_last_checkpoint(str(out_dir)) if resume else None
    if checkpoint is not None:
        previous = json.loads(run_file.read_text()) if run_file.is_file() else None
        if previous != record:
            changed = "data" if previous and previous["data_sha256"] != record["data_sha256"] else "settings"
            raise RouteropsError(f"{out_dir} holds checkpoints of another SFT run (its {changed} differ); "
                                 "rerun with resume=False to start over there, or choose another out_dir")
        log.info("resuming SFT from %s", checkpoint)
        return checkpoint
    for stale in [*out_dir.glob("checkpoint-*"), out_dir / ADAPTER_DIR]:  # a fresh start owns out_dir
        shutil.rmtree(stale, ignore_errors=True)
    run_file.write_text(json.dumps(record, indent=2) + "\n")
    return None


def holds_other_run(run: OrchestraConfig, conversations_jsonl: str | Path, out_dir: str | Path) -> bool:
    """Whether out_dir holds checkpoints of a run with other settings or data (a pipeline stage starts
    over there, resume=False; a direct call is refused rather than silently discarding them)."""
    from transformers.trainer_utils import get_last_checkpoint

    out_dir, run_file = Path(out_dir), Path(out_dir) / RUN_FILE
    if not out_dir.is_dir() or get_last_checkpoint(str(out_dir)) is None:
        return False
    previous = json.loads(run_file.read_text()) if run_file.is_file() else None
    return previous != run_record(run, file_fingerprint(Path(conversations_jsonl)))


def trainer_args(settings: SFTSettings, out_dir: Path, device: str) -> Any:
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(out_dir),
        learning_rate=settings.learning_rate, lr_scheduler_type=settings.lr_scheduler,
        warmup_steps=settings.warmup_steps, num_train_epochs=settings.epochs, max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        weight_decay=settings.weight_decay, max_grad_norm=settings.max_grad_norm,
        max_length=settings.max_seq_len, packing=settings.packing,
        logging_steps=settings.logging_steps, save_strategy="steps", save_steps=settings.save_steps,
        save_total_limit=settings.save_total_limit, seed=settings.seed,
        use_cpu=device == "cpu", bf16=settings.precision == "bf16", fp16=False,
        gradient_checkpointing=settings.gradient_checkpointing, train_sampling_strategy=settings.sampling,
        # The masks arrive pre-tokenised (sft_data.py); TRL's own assistant_only_loss needs template
        # markers SmolLM2's template lacks.
        assistant_only_loss=False, completion_only_loss=False,
        report_to="none", disable_tqdm=True, dataloader_num_workers=0)


def lora_config(settings: SFTSettings) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=settings.lora_r, lora_alpha=settings.lora_alpha, lora_dropout=settings.lora_dropout,
                      target_modules=list(settings.lora_target_modules), bias="none", task_type="CAUSAL_LM")


def loss_curve(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The per-logging-step entries of the trainer's history (the final summary has train_loss instead)."""
    return [{k: float(v) for k, v in entry.items() if isinstance(v, (int, float))}
            for entry in log_history if "loss" in entry]


def train_sft(run: OrchestraConfig, conversations_jsonl: str | Path, out_dir: str | Path, resume: bool = True,
              model_cache: Path | None = None, callbacks: Sequence[Any] = ()) -> SFTResult:
    """Fit a LoRA adapter on the conversations (rows {"task_id", "messages"}) and save it to
    out_dir/adapter; returns the loss curve and token counts (also written to out_dir/sft_result.json).

    model_cache: where a GGUF base model is dequantised once (None: ~/.cache/routerops/models).
    callbacks: transformers TrainerCallbacks (evaluation/sft_tracking.py logs to MLflow with one).
    """
    from trl import SFTTrainer  # optional dependency of this stage only

    settings, out_dir = run.sft, Path(out_dir)
    # Refuse a device this machine lacks before reading gigabytes of weights.
    device = resolve_device(settings.device, f"{run.source}: orchestra.sft")
    if settings.precision == "bf16" and device != "cuda":
        raise RouteropsError(f"{run.source}: orchestra.sft.precision bf16 needs a CUDA device; use fp32 on {device}")
    conversations = read_conversations(conversations_jsonl)
    folder = base_model_folder(run.model, model_cache)
    tokenizer = load_tokenizer(folder)
    examples = build_examples(tokenizer, conversations)
    checkpoint = prepare_out_dir(out_dir, run_record(run, file_fingerprint(Path(conversations_jsonl))), resume)
    model = load_causal_lm(folder, run.model.dtype, device, settings.attn_implementation)
    trainer = SFTTrainer(model=model, args=trainer_args(settings, out_dir, device),
                         train_dataset=examples.to_dataset(), processing_class=tokenizer,
                         peft_config=lora_config(settings), callbacks=list(callbacks))
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=checkpoint)
    seconds = time.perf_counter() - start
    adapter_dir = out_dir / ADAPTER_DIR
    trainer.save_model(str(adapter_dir))
    tokenizer.save_pretrained(adapter_dir)  # the adapter folder alone is enough to serve or merge
    resumed = int(Path(checkpoint).name.split("-")[-1]) if checkpoint else None
    result = SFTResult(out_dir=out_dir, adapter_dir=adapter_dir, global_step=trainer.state.global_step,
                       resumed_from_step=resumed, loss_curve=loss_curve(trainer.state.log_history),
                       train_seconds=round(seconds, 3), data=examples.token_counts(settings.max_seq_len))
    (out_dir / RESULT_FILE).write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result
