"""Training the LM critique / CoRL controller with the orchestrator's RL core.

1. Optional format warm-up (SFT, models/orchestrator/sft.py: TRL SFTTrainer + PEFT LoRA, loss on the
   controller's tokens): templated targets built from the *training* rows' logged outcomes only.
   Critique: turn 1 routes to the weakest agent whose draft is right (the strongest when none is);
   Template II's verdict is the draft's logged correctness, False routing to the next stronger agent.
   CoRL: `corl.warmup_choice` "balanced" (default) = each (row, mode) prompt once with each choice, the
   two kept in one SFT batch (`paired_batches`), so the warm-up teaches the format and no ordering of the
   modes; "outcome" = per mode, the choice that earns r_p·1(cost ≤ B) (self on a tie). CoRL's
   <thinking> restates the budget mode (`corl_thinking`); critique's <thinking>/<checking> texts are
   short fixed phrases (the draft's final line for <checking>). RL then has to move the decisions.
2. RL: `RLTrainer.step` (LoRA, clipped ratio, k3 KL to the frozen warm-up adapter or the base model) on
   `RolloutBatch.from_conversations` built from the controller's own conversations, one assistant
   turn each. Rollouts are Algorithm 1's tree (lm_env.rollout_tree), advantages eq. 14–16
   (tree_advantages.tree_backward_pass), weighted per query by Alg. 1 line 29's 1/|B_T| (a tree with
   no prefix alive at T counts 1), normalised to mean weight 1. Nodes whose advantage is 0 (every
   sibling earned the same) carry no policy gradient and are left out of the update (their KL term
   alone would cost a forward and backward pass each). With `tree.accumulate` (default) a step's
   minibatches make one AdamW update (RLTrainer.step_accumulated), not one each.
   CoRL: each step's queries in all three budget modes (`corl.paired_modes`), at `corl.learning_rate`,
   each mode given the same share of the step's advantage mass (`corl.balance_modes`, `mode_balance`),
   then each (query, choice)'s advantages centred across the modes (`corl.mode_contrast`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.critique.corl_budgets import state_budgets
from models.critique.lm_config import CritiqueLMConfig
from models.critique.lm_controller import make_controller
from models.critique.lm_env import MODES, OutcomeTable, TreeNode, corl_rollout, rollout_tree, turn_messages
from models.critique.lm_prompts import SELF, corl_messages, routing_target, verification_target
from models.critique.tree_advantages import tree_backward_pass
from models.orchestrator.config import OrchestraConfig
from models.orchestrator.rl import RLTrainer, RolloutBatch
from routerops.errors import InputError

log = logging.getLogger(__name__)
THINKING = "A word problem."  # short: every target token is paid for on two CPU cores


def corl_thinking(mode: str) -> str:
    """CoRL's warm-up <thinking> text: the budget mode restated (ours). The controller writes it, so the
    choice token that follows has the mode word a few tokens back instead of only in the system prompt
    far before it; with "A word problem." the three modes' choices moved together in every run of issue
    24 (low mode's "self" push carried the medium and high modes with it)."""
    return f"The budget is {mode}."


def final_line(draft: str, words: int) -> str:
    """The draft's last non-empty line, at most `words` words (0: no cap): what <checking> looks at."""
    lines = [ln.strip() for ln in draft.strip().splitlines() if ln.strip()]
    text = re.sub(r"[<>]", "", lines[-1] if lines else "")
    parts = text.split()
    return " ".join(parts[-words:]) if words and len(parts) > words else text


def warmup_rows(cfg: CritiqueLMConfig, table: OutcomeTable, rows: Sequence[int], tokenizer: Any = None,
                corl: bool = False) -> list[dict]:
    """SFT rows {"task_id", "messages"} from the training rows' outcomes (module docstring)."""
    out = []
    strongest = table.strongest
    drawn = state_budgets(cfg.corl, table, rows, np.tile(np.arange(len(MODES)), len(rows)),
                          np.random.default_rng(0)).reshape(len(rows), len(MODES)) if corl else None
    for i, q in enumerate(rows):
        q = int(q)
        right = table.correct[q]
        if corl:
            expert = table.agents[strongest]
            for m, budget in enumerate(drawn[i]):
                if cfg.corl.warmup_choice == "balanced":  # format and a flat prior only (CorlLMSettings)
                    choices = [SELF, expert]
                else:
                    reward = [right[0] * (table.costs[q, 0] <= budget), right[strongest] * (table.costs[q, strongest] <= budget)]
                    choices = [expert if reward[1] > reward[0] else SELF]
                prompt = corl_messages(table.questions[q], expert, MODES[m], table.template)
                out.extend({"task_id": f"{q}:{MODES[m]}", "messages": prompt + [{"role": "assistant", "content":
                            routing_target(corl_thinking(MODES[m]), choice)}]} for choice in choices)
            continue
        first = next((k for k in range(len(table.agents)) if right[k]), strongest)
        out.append({"task_id": f"{q}:1", "messages": turn_messages(table, q, -1, cfg.prompts.draft_tail_tokens, tokenizer)
                    + [{"role": "assistant", "content": routing_target(THINKING, table.agents[first])}]})
        for author in range(strongest if not cfg.rewards.verify_strongest else strongest + 1):
            verdict = bool(right[author])
            nxt = None if verdict or author == strongest else table.agents[author + 1]
            target = fitted_verification(final_line(table.drafts[q][author], cfg.prompts.max_checking_words),
                                         verdict, nxt, tokenizer, cfg.generation.max_new_tokens - TARGET_SLACK, cfg.source)
            out.append({"task_id": f"{q}:v{author}", "messages": turn_messages(
                table, q, author, cfg.prompts.draft_tail_tokens, tokenizer)
                + [{"role": "assistant", "content": target}]})
    return out


# A warm-up target leaves this many of generation.max_new_tokens unused, so a sampled turn that writes a
# few more tokens than its target (temperature > 0) is not cut into a malformed one.
TARGET_SLACK = 8


def fitted_verification(line: str, verdict: bool, nxt: str | None, tokenizer: Any, limit: int,
                        source: str = "params.yaml") -> str:
    """Template II's target "<checking>Final: LINE</checking><verdict>…" with LINE's leading words
    dropped until the whole target is at most `limit` tokens (no tokenizer: no cut).

    Why: a False target carries "<model>NAME</model>" (gpt-4-1106-preview alone is ~14 SmolLM2 tokens,
    each digit of the final line one more). At the CPU cap of 48 new tokens one False target in ten
    did not fit (mean 44 tokens, True targets 22; measured on 200 training rows), so the warm-up taught
    the reject action in a form the sampler cuts, a cut turn is malformed, and a malformed verdict acts as
    accept minus the penalty: RL was shown a rejection that cost −0.5 and learned to always accept."""
    words = line.split()
    while True:
        target = verification_target(f"Final: {' '.join(words)}".rstrip(), verdict, nxt)
        if tokenizer is None or len(tokenizer(target, add_special_tokens=False)["input_ids"]) <= limit:
            return target
        if not words:
            raise InputError(source, "critique_lm.generation.max_new_tokens",
                             f"{limit + TARGET_SLACK} new tokens cannot hold a verdict target "
                             f"({verification_target('Final:', verdict, nxt)!r}) and {TARGET_SLACK} tokens of slack")
        words = words[1:]


def warmup(cfg: CritiqueLMConfig, table: OutcomeTable, rows: Sequence[int], out_dir: Path, seed: int,
           model_cache: Path | None = None, corl: bool = False) -> Path:
    """Train the format warm-up adapter; returns its folder."""
    from models.orchestrator.sft import train_sft
    from models.orchestrator.lm import load_tokenizer, base_model_folder

    tokenizer = load_tokenizer(base_model_folder(cfg.model, model_cache))
    data = warmup_rows(cfg, table, rows, tokenizer, corl)
    sft = dataclasses.replace(cfg.sft, seed=seed)
    if corl and cfg.corl.warmup_steps:
        sft = dataclasses.replace(sft, max_steps=cfg.corl.warmup_steps)
    if corl and cfg.corl.warmup_choice == "balanced":
        data, sft = paired_batches(data, sft, seed, cfg.source)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "warmup.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    run = OrchestraConfig(model=cfg.model, sft=sft, source=cfg.source)
    done = finished_warmup(out_dir / "sft", run, path)
    if done is not None:
        log.info("warm-up adapter reused: %s (same settings and data)", done)
        return done
    return train_sft(run, path, out_dir / "sft", resume=False, model_cache=model_cache).adapter_dir


def finished_warmup(folder: Path, run: OrchestraConfig, data: Path) -> Path | None:
    """The adapter of a finished SFT run in `folder` made with the same model, SFT settings and data
    (its sft_run.json), else None. Why: the arena's units are killed and resumed (a changed RL setting
    redoes the unit), and on two shared cores the warm-up alone took 13+ min of such a unit."""
    from models.orchestrator.sft import ADAPTER_DIR, RESULT_FILE, RUN_FILE, file_fingerprint, run_record

    record, adapter = folder / RUN_FILE, folder / ADAPTER_DIR
    if not ((folder / RESULT_FILE).is_file() and (adapter / "adapter_config.json").is_file() and record.is_file()):
        return None
    try:
        same = json.loads(record.read_text()) == run_record(run, file_fingerprint(data))
    except (OSError, json.JSONDecodeError):
        return None
    return adapter if same else None


def paired_batches(data: list[dict], sft: Any, seed: int, source: str) -> tuple[list[dict], Any]:
    """The balanced CoRL warm-up's rows in seeded order of their (query, mode) pairs, each pair kept
    together, and SFT settings that read them in that order: every batch then holds both choices of
    each of its prompts.

    Why: the two targets of a prompt differ only from the choice token on, so within one batch the
    token-mean loss pulls that token's "self" and expert probabilities to an even split, step by step.
    With the rows shuffled one by one the pair lands in different batches, each SFT step pushes the
    choice towards whichever target its batch happened to draw, and the prior after the warm-up is the
    last batches' accident: greedy high-mode expert share 0.62 / 0.92 / 0.03 on seeds 0 / 1 / 2 after
    12 steps, RL step 1 sampling it 0.12–0.21 after a full epoch (issue 24, docs/critique/lm.md)."""
    if sft.batch_size % 2 or len(data) % 2:
        raise InputError(source, "critique_lm.sft.batch_size",
                         f"the balanced CoRL warm-up batches each prompt's two targets together: needs an even "
                         f"batch size (got {sft.batch_size})")
    pairs = [data[i:i + 2] for i in range(0, len(data), 2)]
    if any(a["task_id"] != b["task_id"] for a, b in pairs):
        raise ValueError("balanced warm-up rows must come as (self, expert) pairs of one prompt")
    order = np.random.default_rng(seed).permutation(len(pairs))
    return [row for i in order for row in pairs[i]], dataclasses.replace(sft, sampling="sequential")


def mode_balance(advantages: Sequence[float], modes: Sequence[int]) -> np.ndarray:
    """Per-node weights that give every budget mode the same share of a step's advantage mass Σ|A|
    (ours; CoRL with `corl.balance_modes`). A mode whose groups all earned equal rewards keeps weight 1
    (its advantages are 0 anyway); the weights average 1 over the modes that carry signal.

    Why: the choice is one token and most of what moves it is shared by the three prompts, which differ
    in a mode word. Unweighted, the low mode, where the expert always breaks the budget, has a group with
    both outcomes on every query Mixtral solves (~63 % of training rows), the high mode only where GPT-4
    and Mixtral disagree (~30 %): the step's shared direction is "self", every mode drifts there, and once
    no high-mode group samples both choices the signal that would separate the modes is gone (the step
    logs of issue 24's runs). Equal mass per mode leaves the shared direction to the modes' vote."""
    adv, modes = np.abs(np.asarray(advantages, dtype=float)), np.asarray(modes)
    mass = {m: adv[modes == m].sum() for m in np.unique(modes)}
    active = [m for m, v in mass.items() if v > 0]
    if not active:
        return np.ones(len(adv))
    target = sum(mass[m] for m in active) / len(active)
    return np.array([target / mass[m] if mass[m] > 0 else 1.0 for m in modes])


def mode_contrast(advantages: Sequence[float], queries: Sequence[int], choices: Sequence[int]) -> np.ndarray:
    """The advantages with, per (query, choice), their mean over that query's nodes in every budget mode
    taken out (ours; CoRL with `corl.mode_contrast` and paired modes): for each query the summed push
    on "self" and on the expert across the three modes is zero, so an update moves how the modes differ
    and, to first order, not the level they share (the gradients of one choice still differ a little by
    mode, since each prompt has its own probabilities: seed 0's shares all drifted down for 8 steps
    before the modes parted).

    Why: the three prompts of a query differ in a mode word, and the direction they share is learnt far
    faster than the one that tells them apart. Unweighted, low mode's "self" push took every mode to
    "self"; with each mode's advantage mass equalised (`mode_balance`), the two modes that favour the
    expert took low mode with them (its sampled expert share rose 0.41 → 0.69 in 8 steps; issue 24's
    step logs, docs/critique/lm.md). A (query, choice) sampled in one mode only has nothing to contrast
    and gets 0."""
    adv = np.asarray(advantages, dtype=float)
    keys = list(zip(queries, choices))
    out = adv.copy()
    for key in set(keys):
        idx = [i for i, k in enumerate(keys) if k == key]
        out[idx] = adv[idx] - adv[idx].mean()
    return out


def corl_draw(rng: np.random.Generator, rows: np.ndarray, n: int, paired: bool) -> tuple[np.ndarray, np.ndarray]:
    """One step's CoRL states: n training rows, each with a mode drawn uniformly (003 §3.3) or, paired,
    each in every mode (CorlLMSettings.paired_modes)."""
    queries = rng.choice(rows, size=min(n, len(rows)), replace=False)
    if not paired:
        return queries, rng.integers(0, len(MODES), size=len(queries))
    return np.repeat(queries, len(MODES)), np.tile(np.arange(len(MODES)), len(queries))


def adapter_vector(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().float().clone() for p in model.parameters() if p.requires_grad])


def node_weights(nodes: Sequence[TreeNode], horizon: int) -> np.ndarray:
    """Alg. 1 line 29: each query's nodes scaled by 1/|B_T| (|B_T| = 0 read as 1), mean 1 overall."""
    alive = {}
    for n in nodes:
        alive[n.tree] = alive.get(n.tree, 0) + (n.turn == horizon)
    w = np.array([1.0 / max(alive[n.tree], 1) for n in nodes])
    return w / w.mean()


def update(trainer: RLTrainer, nodes: Sequence[TreeNode], minibatch: int, max_seq_len: int,
           accumulate: bool = False) -> dict[str, float]:
    """RLTrainer.step on the nodes with signal, in minibatches (all prepared before the first step), or
    with `accumulate` one RLTrainer.step_accumulated over all the minibatches."""
    live = [n for n in nodes if abs(n.advantage) > 1e-12]
    if not live:
        return {"updated_nodes": 0.0}
    batches = []
    for start in range(0, len(live), minibatch):
        part = live[start:start + minibatch]
        batch = RolloutBatch.from_conversations(
            trainer.tokenizer, [n.messages + [{"role": "assistant", "content": n.output.text}] for n in part],
            [[n.advantage] for n in part], [[n.output] for n in part], max_length=max_seq_len)
        batches.append(batch if accumulate or len(live) <= minibatch else trainer.prepare(batch))
    stats = [trainer.step_accumulated(batches)] if accumulate else [trainer.step(b) for b in batches]
    keys = stats[0].keys()
    out = {k: float(np.mean([s[k] for s in stats])) for k in keys}
    out["updated_nodes"] = float(len(live))
    out["trained_tokens"] = float(sum(int(b.attention_mask.sum()) for b in batches))
    return out


def dual_ascent(xi: np.ndarray, calls: np.ndarray, rho: np.ndarray, lr: float) -> np.ndarray:
    """Ours (beyond 002, which fixes ξ): ξ_k ← [ξ_k + η(u_k − ρ_k)]₊, u_k agent k's share of the calls."""
    share = calls / calls.sum() if calls.sum() > 0 else np.zeros_like(calls)
    return np.maximum(0.0, xi + lr * (share - rho))


def sampled_calls(nodes: Sequence[TreeNode], n_agents: int, group: int) -> np.ndarray:
    """Expected calls per agent under the sampling policy: a node at turn t stands for G^(−t) of its
    query's trajectories (as models/critique/grpo.py usage_shares)."""
    calls = np.zeros(n_agents)
    for n in nodes:
        if n.step.called >= 0:
            calls[n.step.called] += float(group) ** (-n.turn)
    return calls


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def train_controller(cfg: CritiqueLMConfig, table: OutcomeTable, train_rows: Sequence[int], base_folder: Path,
                     seed: int, *, xi: np.ndarray | None = None, dual: bool = False, corl: bool = False,
                     sft_adapter: Path | None = None,
                     progress: Callable[[int, dict], None] | None = None) -> tuple[RLTrainer, dict]:
    """RL of the critique controller (xi: per agent, weaker → stronger) or of the CoRL controller."""
    rng = np.random.default_rng(seed)
    settings = dataclasses.replace(cfg.rl, seed=seed, max_steps=cfg.corl.steps if corl else cfg.tree.steps)
    if corl and cfg.corl.learning_rate > 0:
        settings = dataclasses.replace(settings, learning_rate=cfg.corl.learning_rate)
    trainer = RLTrainer.create(settings, base_folder, sft_adapter)
    start_vector = adapter_vector(trainer.model)
    controller = make_controller(trainer.model, trainer.tokenizer, cfg.generation, temperature=settings.temperature,
                                 seed=10_000 * seed + 1)
    xi = np.zeros(len(table.agents)) if xi is None else np.asarray(xi, dtype=float).copy()
    rho = table.by_strength(cfg.rewards.rho)
    rows, history = np.asarray(train_rows), []
    group = (cfg.corl.group or cfg.tree.group) if corl else cfg.tree.group
    generated = trained = 0
    started = time.perf_counter()
    for step in range(settings.max_steps):
        t0 = time.perf_counter()
        if hasattr(controller, "sync"):  # the fast sampler's merged copy follows the last update
            controller.sync()
        if corl:
            queries, modes = corl_draw(rng, rows, cfg.corl.queries_per_step, cfg.corl.paired_modes)
            nodes = corl_rollout(controller, table, queries, modes, group, state_budgets(cfg.corl, table, rows, modes, rng),
                                 cfg.rewards.malformed_penalty)
        else:
            queries = rng.choice(rows, size=min(cfg.tree.queries_per_step, len(rows)), replace=False)
            nodes = rollout_tree(controller, table, queries, cfg.tree.group, cfg.tree.horizon, xi, cfg.rewards,
                                 cfg.prompts.draft_tail_tokens, trainer.tokenizer)
        rollout_s = time.perf_counter() - t0
        adv, q_hat, _ = tree_backward_pass([n.state for n in nodes], [n.step.reward for n in nodes],
                                           [n.child for n in nodes], cfg.tree.gamma)
        if corl:
            modes = [n.extra["mode"] for n in nodes]
            weights = mode_balance(adv, modes) if cfg.corl.balance_modes else np.ones(len(nodes))
            if cfg.corl.mode_contrast:
                adv = mode_contrast(adv * weights, [n.query for n in nodes], [n.step.called for n in nodes])
                weights = np.ones(len(nodes))
        else:
            weights = node_weights(nodes, cfg.tree.horizon)
        for n, a, w in zip(nodes, adv, weights):
            n.advantage = float(a * w)
        t1 = time.perf_counter()
        stats = update(trainer, nodes, cfg.tree.minibatch, settings.max_seq_len, cfg.tree.accumulate)
        update_s = time.perf_counter() - t1
        generated += sum(n.output.completion_tokens for n in nodes)
        trained += int(stats.get("trained_tokens", 0))
        calls = sampled_calls(nodes, len(table.agents), group) / len(queries)
        roots = [n for n in nodes if n.turn == 1]
        stats = {("updates" if k == "step" else k): v for k, v in stats.items()}  # the trainer's update count
        row = {"step": step + 1, "nodes": len(nodes), "reward_root_mean": float(np.mean([q_hat[i] for i, n in enumerate(nodes) if n.turn == 1])),
               "malformed_share": float(np.mean([n.step.malformed for n in nodes])),
               "strong_first_share": float(np.mean([n.step.called == table.strongest for n in roots])),
               "accept_share": float(np.mean([n.step.verdict is True for n in nodes if n.turn > 1] or [math.nan])),
               "rollout_s": rollout_s, "update_s": update_s,
               **{f"calls_per_query:{a}": float(c) for a, c in zip(table.agents, calls)},
               **{f"xi:{a}": float(x) for a, x in zip(table.agents, xi)}, **stats}
        if corl:
            for m, mode in enumerate(MODES):
                picks = [n.step.called == table.strongest for n in nodes if n.extra["mode"] == m]
                row[f"expert_share:{mode}"] = float(np.mean(picks)) if picks else math.nan
        if dual and cfg.rewards.multiplier_lr > 0:
            xi = dual_ascent(xi, calls, rho, cfg.rewards.multiplier_lr)
        history.append(row)
        if progress is not None:
            progress(step + 1, row)
    seconds = time.perf_counter() - started
    end_vector = adapter_vector(trainer.model)
    change = float(torch.linalg.vector_norm(end_vector - start_vector) / torch.linalg.vector_norm(start_vector))
    summary = {"steps": settings.max_steps, "seconds": seconds, "generated_tokens": generated,
               "trained_tokens": trained, "tokens_per_s": (generated + trained) / seconds if seconds else math.nan,
               "generated_tokens_per_s": generated / seconds if seconds else math.nan,
               "adapter_relative_change": change, "final_xi": [float(x) for x in xi],
               "peak_rss_mb": peak_rss_mb(), "history": history}
    return trainer, summary
