"""The `critique_lm` section: CPU defaults in params.yaml, the paper's scale in configs/paper/critique.yaml
(refused on a machine without CUDA, naming what is missing), unknown keys refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from evaluation.critique_lm import fixed_split, run_critique_lm
from models.critique.lm_config import critique_lm_config, load_critique_lm_config
from models.orchestrator.config import DeviceUnavailable
from routerops.errors import InputError

REPO = Path(__file__).resolve().parents[3]


def test_params_yaml_holds_the_cpu_cut_and_the_paper_config_the_full_templates():
    cpu = load_critique_lm_config(REPO / "params.yaml")
    paper = load_critique_lm_config(REPO / "configs" / "paper" / "critique.yaml")
    assert (cpu.prompts.template, cpu.rl.device, cpu.tree.group, cpu.tree.horizon) == ("short", "cpu", 4, 3)
    assert cpu.rewards.xi == (0.25, 0.125, 0.0) and cpu.rewards.stop_routing == "zero"
    assert not cpu.rewards.verify_strongest
    assert (paper.prompts.template, paper.prompts.draft_tail_tokens, paper.generation.max_new_tokens) == ("full", 0, 2048)
    assert (paper.tree.queries_per_step, paper.tree.steps, paper.rl.learning_rate) == (128, 400, 1e-6)  # Table 9
    assert paper.rl.device == "cuda" and paper.model.dtype == "bfloat16"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the paper config would run")
def test_the_paper_config_refuses_a_machine_without_cuda(tmp_path):
    paper = load_critique_lm_config(REPO / "configs" / "paper" / "critique.yaml")
    with pytest.raises(DeviceUnavailable, match="configs/paper/critique.yaml asks for device 'cuda'.*no CUDA device"):
        run_critique_lm(paper, REPO, tmp_path)


def test_unknown_keys_and_bad_values_are_refused():
    with pytest.raises(InputError, match="critique_lm.tree.grup"):
        critique_lm_config({"tree": {"grup": 4}})
    with pytest.raises(InputError, match="template"):
        critique_lm_config({"prompts": {"template": "long"}})
    with pytest.raises(InputError, match="horizon"):
        critique_lm_config({"tree": {"horizon": 1}})
    assert critique_lm_config({"tree": {"group": 2}}).tree.steps == critique_lm_config({}).tree.steps


def test_the_split_is_fixed_disjoint_and_covers_every_query():
    a, b = fixed_split(100, 0), fixed_split(100, 0)
    assert all((a[k] == b[k]).all() for k in a)
    everything = np.concatenate([a["train"], a["val"], a["test"]])
    assert sorted(everything.tolist()) == list(range(100)) and len(a["test"]) == 20
    assert not (set(fixed_split(100, 1)["test"]) == set(a["test"]))




def test_corl_keeps_its_own_small_warm_up_while_the_critique_warm_up_teaches_the_verdict():
    from evaluation.critique_lm import corl_warmup_rows

    cpu = load_critique_lm_config(REPO / "params.yaml")
    split = fixed_split(1307, 0)
    assert (cpu.tree.warmup_queries, cpu.sft.max_steps) == (200, 100)
    assert (cpu.corl.warmup_queries, cpu.corl.warmup_steps) == (24, 12)
    assert corl_warmup_rows(cpu, split).tolist() == split["train"][:24].tolist()
    inherit = critique_lm_config({"tree": {"warmup_queries": 5}})  # -1: CoRL uses the critique's rows
    assert len(corl_warmup_rows(inherit, split)) == 5
    paper = load_critique_lm_config(REPO / "configs" / "paper" / "critique.yaml")
    assert len(corl_warmup_rows(paper, split)) == 0  # the papers: no warm-up
    with pytest.raises(InputError, match="warmup_queries"):
        critique_lm_config({"corl": {"warmup_queries": -2}})
