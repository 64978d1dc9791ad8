"""One RL step of the orchestrator (004 App. B): G rollouts of a task → the RolloutGroup every
estimator reads (V, C, per-turn U_t / V_t, anchors) → one update of the LoRA policy; and which train
tasks the steps draw (the probe of the SFT policy's success rates and its "residual hard pool" with a
learning signal, 004 §4.2).

Beside the trainer it drives (rl.py: `RLTrainer`, `RolloutBatch`) and the estimators it feeds
(advantages.py), as TRL keeps a trainer's step with the trainer; the orchestra-rl stage
(stages/orchestra/rl.py) only reads its inputs, loops over steps and writes its outputs."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Callable

from models.orchestrator.lm import base_gguf
from models.orchestrator.engines import controller_for
from routerops.envs.qa import extract_answer
from routerops.orchestra.executor import WORKER_ACTOR, Executor, TreeShape
from routerops.workers.cache import WorkerCache

log = logging.getLogger(__name__)


def controller_turn_groups(turn_rows: list[dict]) -> list[list[dict]]:
    """The episode's rows cut at each controller turn: the turn's own row, then its plan's worker calls."""
    groups: list[list[dict]] = []
    for row in turn_rows:
        if row["actor"] == "controller":
            groups.append([row])
        elif groups:
            groups[-1].append(row)
    return groups


def rollout_group(results: list, normaliser, task_id: str, tree: bool = False, config=None,
                  score_text: Callable[[str], float] | None = None):
    """The G episodes as advantages.RolloutGroup (004 App. B), every per-turn field filled, so that any
    estimator and either reward runs on it.

    V_g: the episode's verifier score. C_g: its USD, √-normalised by the rolling percentile (the
    normaliser is updated with this group's costs first, §4.1 / App. A.2). Per controller turn:
    - C_t: the USD of the controller turn and the worker calls its plan made, normalised alike.
    - V_t (B.10's "verifier-confirmed progress", which the paper leaves undefined per turn) and U_t
      (B.6's turn score "from the downstream outcome of the decision at turn t"): what the verifier
      confirms of the turn's own outcome. A final answer: the verifier's score of it. A plan or repair:
      the best score the verifier gives to what its subtasks returned (each <obs>'s value: a tool's
      printed value, else the answer in an LLM's reply; `score_text`, None: 0), i.e. whether the
      routes it chose brought the answer into the conversation. A malformed turn: 0.
    - r_t (eq. 6's shaping, |r_t| ≤ η = config.shaping_bound): −η on a malformed turn (schema
      validity), 0 otherwise. A repair is not rewarded in itself: one after a correct result is waste.
    - action: its kind (plan / repair / final_answer / malformed), B.11's and eq. 6's cohorts.
    - state (GiGPO's anchor, B.8): a hash of the conversation the controller saw before the turn
      (system prompt with the pool table, task, earlier turns, <obs>). Two turns share a state only if
      the controller faced exactly the same context: the first turns of a group (unless the blind
      protocol draws different labels per episode), siblings at a tree's branch point, and episodes
      whose earlier turns and (deterministic, cached) observations coincided.
    - node (with `tree`): its node of the rollout tree (Executor.run_tree) for tree-GRPO (B.5).
    Per rollout, schema_share (eq. 5's S(τ) = schema_bonus × it): the share of its controller turns
    that were schema-valid plan-and-route emissions (plan or repair)."""
    from models.orchestrator.advantages import AdvantageConfig, Rollout, RolloutGroup, Turn
    from routerops.orchestra import modes

    eta = (config or AdvantageConfig()).shaping_bound
    normaliser.update([float(r.episode["cost_usd"]) for r in results])
    rollouts = []
    for r in results:
        score = min(1.0, max(0.0, float(r.episode["score"])))
        states = anchor_states(getattr(r, "messages", None) or [])
        turns, kinds = [], []
        for k, rows in enumerate(controller_turn_groups(r.turns)):
            kind = rows[0]["primitive"] or "turn"
            kinds.append(kind)
            if kind == modes.KIND_FINAL_ANSWER:
                progress = score
            elif kind in (modes.KIND_PLAN, modes.KIND_REPAIR) and score_text is not None:
                progress = observed_progress(rows[0].get("observation") or "", score_text)
            else:
                progress = 0.0
            turns.append(Turn(cost=normaliser.normalise(sum(float(x["cost_usd"]) for x in rows)),
                              progress=progress, score=progress, action=kind,
                              shaping=-eta if kind == modes.KIND_MALFORMED else 0.0,
                              state=states[k] if k < len(states) else None,
                              node=r.nodes[k] if tree else None))
        share = sum(kind in (modes.KIND_PLAN, modes.KIND_REPAIR) for kind in kinds) / max(len(kinds), 1)
        rollouts.append(Rollout(verifier=score, cost=normaliser.normalise(float(r.episode["cost_usd"])), turns=turns,
                                schema_share=share))
    return RolloutGroup(tuple(rollouts), task=task_id)


def observed_progress(observation: str, score_text: Callable[[str], float]) -> float:
    """The best verifier score among a plan turn's <obs> results (0 when it has none)."""
    from routerops.orchestra.render import parse_observations

    try:
        results = parse_observations(observation)
    except ValueError:  # an <error> block (a malformed turn answered), not observations
        return 0.0
    return max((min(1.0, max(0.0, float(score_text(text)))) for _, text in results), default=0.0)


def answer_scorer(task, verifier) -> Callable[[str], float]:
    """`score_text` for rollout_group: a worker's result scored as an answer to `task` by the task's
    verifier — a tool's printed value if it printed one, else the answer an LLM's reply gives."""
    from routerops.envs.qa import tool_value

    def score(text: str) -> float:
        candidate = tool_value(text) or extract_answer(text)
        return float(verifier(task, candidate)) if candidate else 0.0

    return score


def anchor_states(messages: list) -> list[str]:
    """Per assistant message, a hash of every message before it: the state its turn was taken from."""
    import hashlib

    states = []
    for i, message in enumerate(messages):
        if message.get("role") == "assistant":
            prefix = json.dumps(messages[:i], ensure_ascii=False, sort_keys=True)
            states.append(hashlib.sha256(prefix.encode()).hexdigest()[:16])
    return states


def rollout_metrics(results: list, group, alpha: float, workers: list[str] = (), config=None) -> dict[str, float]:
    """The group's reward components and behaviour: mean V, mean C (normalised), mean R (config's reward:
    B.1's V − αC, or eq. 5; without a config V − αC), USD,
    success rate, controller turns, malformed turns, and each worker's share of the worker calls (the
    usage ratios; every pool worker in `workers` is logged, 0 when not called)."""
    import numpy as np

    from models.orchestrator.advantages import rewards

    calls = [row["worker"] for r in results for row in r.turns if row["actor"] == WORKER_ACTOR]
    verifier = np.array([g.verifier for g in group.rollouts])
    cost = np.array([g.cost for g in group.rollouts])
    metrics = {"reward/verifier_mean": float(verifier.mean()), "reward/cost_mean": float(cost.mean()),
               "reward/return_mean": float(np.mean(rewards(group, config)) if config is not None
                                           else (verifier - alpha * cost).mean()),
               "reward/usd_mean": float(np.mean([r.episode["cost_usd"] for r in results])),
               "success_rate": float(np.mean([bool(r.episode["success"]) for r in results])),
               "controller_turns_mean": float(np.mean([len(r.controller_turns) for r in results])),
               "malformed_turns_mean": float(np.mean([r.malformed_turns for r in results])),
               "worker_calls_mean": len(calls) / len(results)}
    for worker in sorted(set(calls) | set(workers)):
        metrics[f"usage/{worker}"] = calls.count(worker) / len(calls) if calls else 0.0
    return metrics


async def rl_step(trainer, executor: Executor, cfg, controller, generation, task, run_id: str, normaliser,
                  rollouts: Path) -> dict:
    """One Agentic-GRPO step: G rollouts of `task` sampled from the current policy through the real
    executor and workers, their turn advantages, one clipped-ratio update (models/orchestrator/rl.py).
    `controller` samples the trainer's policy (`rl_controller`): synced to the weights before the step."""
    import time

    from models.orchestrator.advantages import turn_advantages
    from models.orchestrator.rl import RolloutBatch

    n, g = trainer.step_count + 1, cfg.group_size
    started = time.perf_counter()
    cache_before = executor.cache.stats.snapshot() if executor.cache is not None else None
    # Each step samples the policy as the previous update left it, under its own seed.
    prepare_rl_controller(controller, generation, n)
    seeds = [n * g + i for i in range(g)]
    tree = cfg.advantages.estimator == "tree_grpo"
    if tree:  # Uno-tree-GRPO: prefix-sharing rollouts, at most G leaves (004 App. B)
        shape = TreeShape(g // cfg.settings.tree_branches, cfg.settings.tree_branches, cfg.settings.tree_branch_turn)
        results = await executor.run_tree(task, controller, run_id, seeds, shape)
    else:
        results = await executor.run_group(task, controller, run_id, seeds)
    rollout_seconds = time.perf_counter() - started
    group = rollout_group(results, normaliser, task.task_id, tree, cfg.advantages,
                          answer_scorer(task, executor.verifier))
    advantages = turn_advantages(cfg.advantages, group)
    batch = RolloutBatch.from_conversations(trainer.tokenizer, [r.messages for r in results],
                                            [a.tolist() for a in advantages],
                                            turns=[r.controller_turns for r in results],
                                            max_length=cfg.settings.max_seq_len)
    # The turns let the batch drop a template end token the policy never chose (a turn cut at
    # max_new_tokens); old log-probs are still recomputed by the trainer (RolloutBatch: exact ρ = 1
    # at the update of a synchronous loop), and the sampler's weigh its drift (RLSettings.tis_cap).
    batch = batch.with_sampler_logprobs()
    stats = trainer.step(batch)  # one update per group: old log-probs from its own forward pass
    with open(rollouts, "a") as fh:  # what the step trained on, for inspection (not a resume journal)
        for r in results:
            fh.write(json.dumps({"step": n, "episode": r.episode, "turns": r.turns}, default=str) + "\n")
    return {"step": n, "task_id": task.task_id, "episodes": [r.episode["episode_id"] for r in results],
            "leaves": len(results),
            "scores": [float(r.episode["score"]) for r in results],
            "advantages": [[round(float(x), 6) for x in a] for a in advantages],
            "truncated": batch.truncated, **{k: v for k, v in stats.items() if k not in ("step", "seconds")},
            "controller_tokens": sum(t.completion_tokens for r in results for t in r.controller_turns),
            **rollout_metrics(results, group, cfg.advantages.alpha, sorted(executor.workers), cfg.advantages),
            **cache_metrics(cache_before, executor.cache), "rollout_seconds": rollout_seconds,
            "update_seconds": stats["seconds"], "step_seconds": time.perf_counter() - started}


# ---------------------------------------------------------------- which train tasks RL steps on


def signal_pool(rates: dict[str, float]) -> list[str]:
    """Tasks solved sometimes but not always (004's residual hard pool with a learning signal)."""
    return [task_id for task_id, rate in rates.items() if 0.0 < rate < 1.0]


def limit_pool(pool: list[str], rates: dict[str, float], size: int) -> list[str]:
    """At most `size` tasks of `pool` (0: all), those whose probed success is nearest ½ (ties: the pool's
    order), kept in the pool's order (RLSettings.pool_size)."""
    if size <= 0 or size >= len(pool):
        return list(pool)
    nearest = sorted(range(len(pool)), key=lambda i: (abs(rates[pool[i]] - 0.5), i))[:size]
    return [pool[i] for i in sorted(nearest)]


async def probe_success_rates(executor: Executor, controller, generation, tasks: list, samples: int,
                              run_id: str) -> dict[str, float]:
    """Each task's success rate over `samples` rollouts of the policy as it stands (the SFT adapter),
    sampled at the RL temperature under a seed of the probe's own (not the run's sampling seed: the
    probe describes the SFT policy, so runs of other seeds share it), all tasks in one lockstep batch."""
    prepare_rl_controller(controller, dataclasses.replace(generation, seed=PROBE_SEED), 0)
    controller.version = "rl-probe"
    items = [(task, PROBE_SEED + i) for task in tasks for i in range(samples)]
    results = await executor.run_batch(items, controller, f"{run_id}-probe")
    successes: dict[str, list[bool]] = {t.task_id: [] for t in tasks}
    for r in results:
        successes[r.episode["task_id"]].append(bool(r.episode["success"]))
    return {task_id: sum(s) / len(s) for task_id, s in successes.items()}


PROBE_SEED = 900_000  # the probe's sampling seeds, apart from the steps' (n·G + i)


def rl_controller(trainer, generation, spec, model_cache, name: str):
    """The RL stage's sampler of the trainer's policy (orchestra.controller.engine: FastSampler, a merged,
    KV-cached copy, or LlamaCppSampler, the adapter on llama.cpp; either re-synced before every step).
    `name`: the controller's price-book entry (its turns are billed under it)."""
    return controller_for(trainer.model, trainer.tokenizer, generation, name=name, version="rl",
                          gguf=base_gguf(spec), work_dir=model_cache, weights=trainer.settings.rollout_weights)


def prepare_rl_controller(controller, generation, step: int) -> None:
    """Step `step`'s sampling: the current weights (FastSampler re-merges them) and a seed of the step's
    own, so a resumed run samples what an uninterrupted one would have."""
    if hasattr(controller, "sync"):
        controller.sync()
    controller.settings = dataclasses.replace(generation, seed=generation.seed + 10_000 * step)
    controller.calls = 0
    controller.version = f"rl-step{step}"


def cache_metrics(before: dict | None, cache: WorkerCache | None) -> dict[str, float]:
    """This step's worker-cache hits, misses (deterministic calls made) and uncacheable (sampling
    workers') calls, and the hit rate among cacheable calls; nothing when the cache is off."""
    if before is None or cache is None:
        return {}
    now = cache.stats.snapshot()
    hits, misses = now["hits"] - before["hits"], now["misses"] - before["misses"]
    return {"cache/hits": hits, "cache/misses": misses, "cache/uncacheable": now["uncacheable"] - before["uncacheable"],
            "cache/hit_rate": hits / (hits + misses) if hits + misses else 0.0}
