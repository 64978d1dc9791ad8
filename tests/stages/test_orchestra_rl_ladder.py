"""The RL stage's side of the App. B ladder and §4 options (issue 23, items 2 and 4): the RolloutGroup the
stage builds carries every per-turn field (U_t / V_t, eq. 6 shaping, GiGPO anchor states, eq. 5's schema
share), MT-GRPO end to end in the stage at the smallest scale with the blind-worker protocol and the
worker cache on, and the two switches' configs. The stage helpers (small_run, curriculum) are those of
tests/stages/test_orchestra_rl.py."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle threads sleep

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from routerops.errors import InputError  # noqa: E402
from routerops.layout import Layout  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("orchestra_rl_tests", Path(__file__).with_name("test_orchestra_rl.py"))
_rl_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rl_tests)
small_run, curriculum, CONVERSATIONS = _rl_tests.small_run, _rl_tests.curriculum, _rl_tests.CONVERSATIONS


@pytest.mark.slow
def test_mt_grpo_runs_end_to_end_in_the_stage_blind_and_with_the_worker_cache(tmp_path, monkeypatch):
    """MT-GRPO (B.6–B.7) through the real stage at the smallest scale: one step of G = 2 rollouts of the
    SFT'd SmolLM2 controller through the llama.cpp workers, with the blind-worker protocol and the
    worker cache on; U_t comes from rollout_group."""
    import dataclasses

    import mlflow
    import torch

    from models.orchestrator.lm import base_model_folder
    from models.orchestrator.sft import train_sft
    from stages.orchestra import lm_config, rl

    torch.set_num_threads(2)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    run = dataclasses.replace(small_run(tmp_path, estimator="mt_grpo", max_steps=1), anonymize_workers=True)
    layout = Layout(tmp_path)
    cached = base_model_folder(lm_config(run).model)
    layout.model_cache.mkdir(parents=True)
    (layout.model_cache / cached.name).symlink_to(cached, target_is_directory=True)
    curriculum(run, layout)
    data = tmp_path / "sft_data.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"t{i}", "messages": m}) + "\n" for i, m in enumerate(CONVERSATIONS)))
    sft_adapter = train_sft(lm_config(run), data, tmp_path / "sft", model_cache=layout.model_cache).adapter_dir

    rl(run, layout, layout.orchestra_rl_tasks, sft_adapter)

    result = json.loads(layout.orchestra_rl_result.read_text())
    assert result["estimator"] == "mt_grpo" and result["global_step"] == 1
    [step] = result["steps"]
    assert all(np.isfinite([step["loss"], step["kl"]]))
    for key in ("cache/hits", "cache/misses", "cache/uncacheable", "cache/hit_rate"):
        assert key in step
    assert result["worker_cache"]["hits"] + result["worker_cache"]["misses"] == step["cache/hits"] + step["cache/misses"]
    rolled = [json.loads(line) for line in (layout.orchestra_rl_run / "rollouts.jsonl").read_text().splitlines()]
    system = [json.loads(r["episode"]["conversation"])[0]["content"] for r in rolled]
    # one MT-GRPO advantage per controller turn of each rollout
    assert [len(a) for a in step["advantages"]] == [sum(t["actor"] == "controller" for t in r["turns"]) for r in rolled]
    assert all("Worker1" in text and "smol-direct" not in text and "smol-cot" not in text for text in system)
    client = mlflow.tracking.MlflowClient()
    [tracked] = mlflow.search_runs(experiment_names=["orchestra-rl-test"], output_format="list")
    assert [m.step for m in client.get_metric_history(tracked.info.run_id, "cache/misses")] == [1]
    assert tracked.data.params["advantages.estimator"] == "mt_grpo"


def test_the_rollout_group_fills_every_turn_field_so_mt_grpo_gigpo_and_eq5_eq6_run_on_it():
    from types import SimpleNamespace

    from models.orchestrator.advantages import AdvantageConfig, CostNormaliser, turn_advantages
    from routerops.envs.qa import score_answer
    from routerops.orchestra.render import render_observations
    from routerops.types import Task
    from stages.orchestra import answer_scorer, rollout_group

    task = Task("t/1", "unit/qa", "train", "What is 6*7 + 1?", "43")
    system, question = {"role": "system", "content": "pool table"}, {"role": "user", "content": task.prompt}

    def episode(score, turns):
        """turns: (kind, assistant text, observation or None) per controller turn."""
        rows, messages = [], [system, question]
        for kind, text, observation in turns:
            rows.append({"actor": "controller", "primitive": kind, "cost_usd": 0.0, "worker": "orchestrator",
                         "observation": observation or ""})
            messages.append({"role": "assistant", "content": text})
            if observation:
                rows.append({"actor": "worker", "primitive": "sympy", "cost_usd": 1e-5, "worker": "sympy"})
                messages.append({"role": "user", "content": observation})
        return SimpleNamespace(episode={"score": score, "cost_usd": sum(r["cost_usd"] for r in rows),
                                        "success": score == 1}, turns=rows, messages=messages, nodes=[])

    right, wrong = render_observations([(1, "43")]), render_observations([(1, "Answer: 42")])
    results = [episode(1.0, [("plan", "<plan A>", right), ("final_answer", "<final 43>", None)]),
               episode(0.0, [("plan", "<plan A>", right), ("final_answer", "<final 42>", None)]),
               episode(0.0, [("plan", "<plan B>", wrong), ("final_answer", "<final 42>", None)]),
               episode(0.0, [("malformed", "<garbage>", None)])]
    eta = 0.05
    group = rollout_group(results, CostNormaliser(percentile=100), task.task_id, config=AdvantageConfig(shaping_bound=eta),
                          score_text=answer_scorer(task, score_answer))
    # U_t = V_t: a plan scores what the verifier confirms of its observations, an answer its own score
    assert [[t.score for t in r.turns] for r in group.rollouts] == [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0]]
    assert [[t.progress for t in r.turns] for r in group.rollouts] == [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0]]
    assert [[t.shaping for t in r.turns] for r in group.rollouts] == [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [-eta]]
    assert [r.schema_share for r in group.rollouts] == [0.5, 0.5, 0.5, 0.0]
    # anchor states: every first turn faced the same conversation; the second turns of the two episodes
    # whose plan and observation coincided share one, the third's differs
    states = [[t.state for t in r.turns] for r in group.rollouts]
    assert len({s[0] for s in states}) == 1 and states[0][1] == states[1][1] != states[2][1]
    for estimator, extra in (("mt_grpo", {}), ("gigpo", {}), ("agentic_grpo", {"turn_return": "eq6"}),
                             ("grpo", {"reward": "eq5"}), ("agentic_grpo", {})):
        advantages = turn_advantages(AdvantageConfig(estimator=estimator, group_size=4, **extra), group)
        assert [len(a) for a in advantages] == [2, 2, 2, 1] and all(np.isfinite(a).all() for a in advantages)
    # MT-GRPO credits the plan whose observation held the answer over the one whose did not (same turn index)
    mt = turn_advantages(AdvantageConfig(estimator="mt_grpo", group_size=4, alpha=0.0), group)
    assert mt[1][0] > mt[2][0]
    # GiGPO: episodes 0 and 1 faced the same state at turn 1, the right answer there is pushed above the wrong one
    # (M_t = ±1 between them), the third episode's turn 1 faced a state of its own (M_t = 0)
    gi = turn_advantages(AdvantageConfig(estimator="gigpo", group_size=4, alpha=0.0), group)
    a_g = turn_advantages(AdvantageConfig(estimator="grpo", group_size=4, alpha=0.0), group)
    anchor = [g - a for g, a in zip(gi, a_g)]
    assert [anchor[0][1], anchor[1][1], anchor[2][1]] == pytest.approx([1.0, -1.0, 0.0], abs=1e-4)


def test_the_blind_worker_and_cache_switches_load_off_and_on_and_refuse_other_values(tmp_path):
    from stages.orchestra import load_run

    demo, paper = load_run(REPO / "params.yaml"), load_run(REPO / "configs/paper/orchestra.yaml")
    assert (demo.anonymize_workers, paper.anonymize_workers) == (False, True)
    assert demo.worker_cache and paper.worker_cache
    bad = tmp_path / "params.yaml"
    bad.write_text("orchestra:\n  anonymize_workers: sometimes\n")
    with pytest.raises(InputError, match="orchestra.anonymize_workers"):
        load_run(bad)
