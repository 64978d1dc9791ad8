"""A real LoRA SFT run on SmolLM2-135M-Instruct over a handful of controller conversations: interrupted
and resumed, its loss on those conversations falls, and its adapter loads back and merges."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from models.orchestrator.config import DeviceUnavailable, GenerationSettings, OrchestraConfig, SFTSettings
from models.orchestrator.lm import LMController, load_causal_lm, load_controller_model, merge_adapter
from models.orchestrator.sft import RESULT_FILE, train_sft
from models.orchestrator.sft_data import tokenize_conversation
from routerops.errors import RouteropsError

REPO = Path(__file__).resolve().parents[3]
MAX_LEN = 128  # cuts the one long conversation; each step is then ~2 × 110 tokens
CONFIG = OrchestraConfig(sft=SFTSettings(learning_rate=3e-3, warmup_steps=0, max_steps=6, batch_size=2,
                                         max_seq_len=MAX_LEN, lora_dropout=0.0, save_steps=3, logging_steps=1))


class StopAfter(TrainerCallback):
    """Ends training after `step` optimiser steps, as a killed job would after its last checkpoint."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


@pytest.fixture(scope="module")
def runs(tmp_path_factory, conversations_file, smollm2_folder):
    """(interrupted run, the rerun that resumes it, their out_dir)."""
    out_dir = tmp_path_factory.mktemp("sft-run")
    first = train_sft(CONFIG, conversations_file, out_dir, callbacks=[StopAfter(3)])
    second = train_sft(CONFIG, conversations_file, out_dir)
    return first, second, out_dir


def assistant_loss(model, tokenizer, conversations) -> float:
    """Mean per-conversation loss on the assistant tokens of the training conversations, as trained."""
    losses = []
    for messages in conversations:
        tokenized = tokenize_conversation(tokenizer, messages)
        ids, mask = tokenized.input_ids[:MAX_LEN], tokenized.assistant_masks[:MAX_LEN]
        labels = [t if m else -100 for t, m in zip(ids, mask)]
        with torch.no_grad():
            losses.append(model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss.item())
    return sum(losses) / len(losses)


@pytest.mark.slow
def test_an_interrupted_run_resumes_from_its_last_checkpoint(runs, tokenizer, conversations):
    first, second, out_dir = runs
    assert (first.global_step, first.resumed_from_step) == (3, None)
    assert (second.global_step, second.resumed_from_step) == (6, 3)
    # The resumed run carries the whole curve: the checkpoint's first three steps, then its own.
    assert [e["step"] for e in second.loss_curve] == [1, 2, 3, 4, 5, 6]
    assert second.loss_curve[:3] == first.loss_curve
    assert all(math.isfinite(e["loss"]) for e in second.loss_curve)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in second.adapter_dir.iterdir()}
    assert json.loads((out_dir / RESULT_FILE).read_text())["global_step"] == 6
    trained_tokens = sum(sum(tokenize_conversation(tokenizer, m).assistant_masks[:MAX_LEN]) for m in conversations)
    assert second.data["assistant_tokens"] == trained_tokens


@pytest.mark.slow
def test_training_lowers_the_loss_on_its_conversations_and_the_adapter_round_trips(runs, smollm2_folder, conversations,
                                                                                   tmp_path):
    _, trained, _ = runs
    base = load_causal_lm(smollm2_folder, "float32", "cpu").eval()
    adapted, tokenizer = load_controller_model(CONFIG.model, trained.adapter_dir)
    before, after = assistant_loss(base, tokenizer, conversations), assistant_loss(adapted, tokenizer, conversations)
    assert math.isfinite(after) and after < 0.7 * before
    # Merged into plain weights (what vLLM serves), the model computes what base + adapter computes.
    merged = load_causal_lm(merge_adapter(CONFIG.model, trained.adapter_dir, tmp_path / "merged"), "float32", "cpu")
    ids = torch.tensor([tokenize_conversation(tokenizer, conversations[1]).input_ids[:MAX_LEN]])
    with torch.no_grad():
        reference, served, untrained = adapted(input_ids=ids).logits, merged(input_ids=ids).logits, base(input_ids=ids).logits
    assert torch.allclose(served, reference, atol=1e-3)
    assert not torch.allclose(untrained, reference, atol=1e-1)
    # The controller serves the adapter: named after it, answering the contract.
    controller = LMController.load(CONFIG.model, GenerationSettings(max_new_tokens=4), adapter=trained.adapter_dir)
    assert controller.name == f"{CONFIG.model.name}+adapter"
    assert len(controller.respond([conversations[0][:2]])[0].token_ids) >= 1


@pytest.mark.slow  # needs the trained run's checkpoints
def test_a_different_run_is_not_resumed_into_the_same_folder(runs, conversations_file, tmp_path):
    _, _, out_dir = runs
    other = dataclasses.replace(CONFIG, sft=dataclasses.replace(CONFIG.sft, learning_rate=1e-4))
    with pytest.raises(RouteropsError, match="another SFT run .its settings differ"):
        train_sft(other, conversations_file, out_dir)
    more = tmp_path / "more.jsonl"
    more.write_text(conversations_file.read_text() * 2)
    with pytest.raises(RouteropsError, match="another SFT run .its data differ"):
        train_sft(CONFIG, more, out_dir)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the paper config would run")
def test_the_paper_config_is_refused_on_a_machine_without_cuda(conversations_file, tmp_path):
    from stages.orchestra.config import lm_config, load_run

    paper = lm_config(load_run(REPO / "configs/paper/orchestra.yaml"), REPO / "configs/paper/orchestra.yaml")
    assert (paper.sft.learning_rate, paper.sft.lr_scheduler, paper.sft.warmup_steps, paper.sft.epochs) == (2e-5, "cosine", 100, 2.0)
    with pytest.raises(DeviceUnavailable, match="configs/paper/orchestra.yaml.*no CUDA device"):
        train_sft(paper, conversations_file, tmp_path / "paper")
    cpu_bf16 = dataclasses.replace(CONFIG, sft=dataclasses.replace(CONFIG.sft, precision="bf16"))
    with pytest.raises(RouteropsError, match="bf16 needs a CUDA device"):
        train_sft(cpu_bf16, conversations_file, tmp_path / "bf16")
    assert not (tmp_path / "paper").exists()  # refused before anything was written
