"""The orchestra-rl stage (stages/orchestra/rl.py): Agentic-GRPO from an SFT adapter, at the smallest
scale, with the real llama.cpp workers and the real SmolLM2 controller."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: idle threads sleep

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from models.orchestrator.config import GenerationSettings, SFTSettings  # noqa: E402
from models.orchestrator.rl import rl_config  # noqa: E402
from routerops.config import TrackConfig  # noqa: E402
from routerops.envs.suites import read_tasks, write_tasks  # noqa: E402
from routerops.errors import InputError, RouteropsError  # noqa: E402
from routerops.layout import Layout  # noqa: E402
from stages.orchestra import OrchestraEvaluation, OrchestraRun, OrchestraTasks, rl_task_order, tasks  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("orchestrator_fixtures",
                                               REPO / "tests/models/orchestrator/conftest.py")
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
CONVERSATIONS = _fixtures.CONVERSATIONS


def small_run(tmp_path: Path, **rl) -> OrchestraRun:
    return OrchestraRun(
        pool=str(REPO / "configs/pools/embedded-smollm2.yaml"), price_book=str(REPO / "configs/prices/current.yaml"),
        tasks=OrchestraTasks(families=["basic_arithmetic"], train=2, val=1, test=1, ood=1), turn_limit=2,
        prompt="compact", evaluation=OrchestraEvaluation(end_on_malformed=True, server_threads=2),
        controller=GenerationSettings(max_new_tokens=48, batch_size=4),
        sft=SFTSettings(max_steps=3, learning_rate=0.002, warmup_steps=0, batch_size=2, max_seq_len=512, save_steps=100),
        rl=rl_config({"estimator": "agentic_grpo", "group_size": 2, "max_steps": 2, "save_steps": 1, "temperature": 0.7,
                      "learning_rate": 0.001, "pool": "curriculum", **rl}),
        track=TrackConfig(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=str(tmp_path / "artifacts"),
                          experiment="orchestra-rl-test"))


def curriculum(run: OrchestraRun, layout: Layout) -> dict[str, list]:
    """tasks.jsonl; D_RL = the first train task; D_SFT names the second (as the filter writes them)."""
    by_split = {}
    for task in read_tasks(tasks(run, layout)):
        by_split.setdefault(task.split, []).append(task)
    write_tasks(by_split["train"][:1], layout.orchestra_rl_tasks)
    layout.orchestra_sft.write_text(json.dumps({"task_id": by_split["train"][1].task_id,
                                                "messages": CONVERSATIONS[0]}) + "\n")
    return by_split


def test_the_rl_curriculum_is_d_rl_then_d_sft_and_refuses_any_task_outside_train(tmp_path):
    run, layout = small_run(tmp_path), Layout(tmp_path)
    by_split = curriculum(run, layout)
    order = rl_task_order(layout, layout.orchestra_rl_tasks)
    assert [t.task_id for t in order] == [t.task_id for t in by_split["train"]]
    write_tasks([*by_split["train"][:1], by_split["val"][0]], layout.orchestra_rl_tasks)
    with pytest.raises(RouteropsError, match="val task"):
        rl_task_order(layout, layout.orchestra_rl_tasks)


@pytest.mark.slow
def test_rl_stage_trains_the_sft_adapter_on_train_rollouts_tracks_every_step_and_resumes(tmp_path, monkeypatch,
                                                                                        mlflow_db):
    import mlflow
    import torch
    from safetensors.torch import load_file

    from evaluation.tracking import dvc_md5
    from models.orchestrator.lm import base_model_folder
    from models.orchestrator.sft import train_sft
    from stages.orchestra import lm_config
    from stages.orchestra.rl import rl

    torch.set_num_threads(2)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    run, layout = small_run(tmp_path), Layout(tmp_path)
    # The dense SmolLM2 the other tests share (dequantised once), seen from this layout's model cache.
    cached = base_model_folder(lm_config(run).model)
    layout.model_cache.mkdir(parents=True)
    (layout.model_cache / cached.name).symlink_to(cached, target_is_directory=True)
    by_split = curriculum(run, layout)
    train_ids = {t.task_id for t in by_split["train"]}
    data = tmp_path / "sft_data.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"t{i}", "messages": m}) + "\n" for i, m in enumerate(CONVERSATIONS)))
    sft_adapter = train_sft(lm_config(run), data, tmp_path / "sft", model_cache=layout.model_cache).adapter_dir

    adapter = rl(run, layout, layout.orchestra_rl_tasks, sft_adapter)

    result = json.loads(layout.orchestra_rl_result.read_text())
    steps = result["steps"]
    assert result["global_step"] == 2 and [s["step"] for s in steps] == [1, 2]
    assert {s["task_id"] for s in steps} <= train_ids  # D_RL's task, then D_SFT's
    assert [s["task_id"] for s in steps] == [t.task_id for t in by_split["train"]]
    for s in steps:
        assert len(s["episodes"]) == 2 and all(map(lambda x: x == x and abs(x) < 1e6, [s["loss"], s["kl"]]))
        assert 0 <= s["reward/verifier_mean"] <= 1 and 0 <= s["reward/cost_mean"] <= 1
        assert 1 <= s["controller_turns_mean"] <= run.turn_limit
    print("seconds per RL step:", [round(s["step_seconds"], 1) for s in steps],
          "rollout:", [round(s["rollout_seconds"], 1) for s in steps],
          "update:", [round(s["update_seconds"], 1) for s in steps])
    # The policy moved away from the SFT adapter (unless no rollout differed from its group's other).
    start, end = load_file(sft_adapter / "adapter_model.safetensors"), load_file(adapter / "adapter_model.safetensors")
    assert start.keys() == end.keys()
    moved = any(not torch.equal(start[k], end[k]) for k in start)
    assert moved or all(a == 0 for s in steps for adv in s["advantages"] for a in adv)
    assert (layout.orchestra_rl_run / "checkpoints/step-000002/adapter/adapter_model.safetensors").is_file()
    assert (layout.orchestra_manifests / "orchestra-rl.json").is_file()
    rolled = [json.loads(line) for line in (layout.orchestra_rl_run / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rolled] == [1, 1, 2, 2]
    assert {r["episode"]["split"] for r in rolled} == {"train"} and {r["episode"]["task_id"] for r in rolled} <= train_ids
    assert {r["episode"]["policy_version"] for r in rolled} == {"rl-step1", "rl-step2"}  # the policy of each step
    assert {k for k in steps[0] if k.startswith("usage/")} == {"usage/python", "usage/smol-cot", "usage/smol-direct",
                                                                "usage/sympy"}

    client = mlflow.tracking.MlflowClient()
    [tracked] = mlflow.search_runs(experiment_names=["orchestra-rl-test"], output_format="list")
    for key in ("loss", "kl", "clip_fraction", "reward/verifier_mean", "reward/cost_mean", "success_rate",
                "controller_turns_mean", "usage/smol-direct"):
        assert [m.step for m in client.get_metric_history(tracked.info.run_id, key)] == [1, 2], key
    inputs = {i.dataset.name: i for i in client.get_run(tracked.info.run_id).inputs.dataset_inputs}
    assert inputs[str(layout.orchestra_rl_tasks)].dataset.digest == dvc_md5(layout.orchestra_rl_tasks)
    assert inputs[str(sft_adapter)].dataset.digest == dvc_md5(sft_adapter)  # the SFT adapter, as DVC's "<md5>.dir"

    again = rl(run, layout, layout.orchestra_rl_tasks, sft_adapter)  # resumes at max_steps: no new step
    rerun = json.loads(layout.orchestra_rl_result.read_text())
    assert rerun["resumed_from_step"] == 2 and rerun["global_step"] == 2 and rerun["steps"] == steps
    assert len((layout.orchestra_rl_run / "rollouts.jsonl").read_text().splitlines()) == 4  # kept on resume
    assert again == adapter and load_file(adapter / "adapter_model.safetensors").keys() == end.keys()
    with pytest.raises(RouteropsError, match="settings"):  # other settings are refused, not mixed in
        rl(small_run(tmp_path, max_steps=3), layout, layout.orchestra_rl_tasks, sft_adapter)


@pytest.mark.slow
def test_mt_grpo_runs_end_to_end_in_the_stage_blind_and_with_the_worker_cache(tmp_path, monkeypatch, mlflow_db):
    """MT-GRPO (B.6–B.7) through the real stage at the smallest scale: one step of G = 2 rollouts of the
    SFT'd SmolLM2 controller through the llama.cpp workers, with the blind-worker protocol and the
    worker cache on; U_t comes from rollout_group."""
    import dataclasses

    import mlflow
    import torch

    from models.orchestrator.lm import base_model_folder
    from models.orchestrator.sft import train_sft
    from stages.orchestra import lm_config
    from stages.orchestra.rl import rl

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


def test_the_demo_and_paper_rl_sections_load_with_the_papers_values_where_it_gives_them():
    from stages.orchestra import load_run

    demo = load_run(REPO / "params.yaml").rl
    paper = load_run(REPO / "configs/paper/orchestra.yaml").rl
    assert demo.advantages.estimator == paper.advantages.estimator == "agentic_grpo"
    assert (demo.group_size, demo.settings.max_steps, demo.settings.save_steps, demo.settings.temperature) == (4, 16, 4, 0.7)
    assert (demo.settings.pool, demo.settings.probe_samples, demo.settings.learning_rate) == ("signal", 4, 1e-4)
    assert (paper.group_size, paper.settings.clip_epsilon, paper.settings.kl_beta, paper.advantages.alpha) == (8, 0.2, 1e-3, 0.1)


def test_the_rollout_group_takes_v_from_the_verifier_and_c_per_turn_from_its_rows():
    from types import SimpleNamespace

    from models.orchestrator.advantages import CostNormaliser
    from models.orchestrator.rl_step import rollout_group, rollout_metrics

    def result(score, rows):
        cost = sum(r["cost_usd"] for r in rows)
        return SimpleNamespace(episode={"score": score, "cost_usd": cost, "success": score == 1},
                               turns=rows, controller_turns=[r for r in rows if r["actor"] == "controller"],
                               malformed_turns=0)

    plan = [{"actor": "controller", "primitive": "plan", "cost_usd": 1e-4, "worker": "orchestrator"},
            {"actor": "worker", "primitive": "answer", "cost_usd": 3e-4, "worker": "smol-direct"},
            {"actor": "controller", "primitive": "final_answer", "cost_usd": 1e-4, "worker": "orchestrator"}]
    lazy = [{"actor": "controller", "primitive": "final_answer", "cost_usd": 4e-4, "worker": "orchestrator"}]
    normaliser = CostNormaliser(percentile=100)
    group = rollout_group([result(1.0, plan), result(0.0, lazy)], normaliser, "t")
    first, second = group.rollouts
    assert first.verifier == 1.0 and second.verifier == 0.0
    scale = (5e-4) ** 0.5  # the 100th percentile of √c over the two episodes (5e-4 and 4e-4 USD)
    assert first.cost == pytest.approx(1.0) and second.cost == pytest.approx((4e-4) ** 0.5 / scale)
    assert [t.cost for t in first.turns] == pytest.approx([(4e-4) ** 0.5 / scale, (1e-4) ** 0.5 / scale])
    assert [(t.action, t.progress) for t in first.turns] == [("plan", 0.0), ("final_answer", 1.0)]
    assert [(t.action, t.progress) for t in second.turns] == [("final_answer", 0.0)]
    metrics = rollout_metrics([result(1.0, plan), result(0.0, lazy)], group, 0.1, ["python", "smol-direct"])
    assert metrics["usage/smol-direct"] == 1.0 and metrics["usage/python"] == 0.0
    assert metrics["success_rate"] == 0.5 and metrics["controller_turns_mean"] == 1.5


def test_a_tree_group_carries_each_turn_s_node_and_tree_grpo_credits_the_shared_prefix_once():
    from types import SimpleNamespace

    from models.orchestrator.advantages import AdvantageConfig, CostNormaliser, turn_advantages
    from models.orchestrator.rl_step import rollout_group

    def leaf(score, nodes):
        rows = [{"actor": "controller", "primitive": "plan", "cost_usd": 0.0, "worker": "orchestrator"},
                {"actor": "controller", "primitive": "final_answer", "cost_usd": 0.0, "worker": "orchestrator"}]
        return SimpleNamespace(episode={"score": score, "cost_usd": 0.0}, turns=rows, nodes=nodes)

    # one root, split before turn 1 (Executor.run_tree): the plan is shared, the answers are siblings
    results = [leaf(1.0, ["r0/t0", "r0.0/t1"]), leaf(0.0, ["r0/t0", "r0.1/t1"])]
    group = rollout_group(results, CostNormaliser(percentile=100), "t", tree=True)
    assert [[t.node for t in r.turns] for r in group.rollouts] == [n.nodes for n in results]
    first, second = turn_advantages(AdvantageConfig(estimator="tree_grpo", alpha=0.0, group_size=2), group)
    assert first[0] == second[0]  # the shared plan gets one signal
    assert first[1] > 0 > second[1]  # the right sibling is pushed up, the wrong one down


def test_tree_rollouts_need_g_to_split_evenly_into_branches():
    from models.orchestrator.rl import rl_config

    assert rl_config({"estimator": "tree_grpo", "group_size": 4, "tree_branches": 2}).settings.tree_branches == 2
    with pytest.raises(RouteropsError, match="tree_branches"):
        rl_config({"estimator": "tree_grpo", "group_size": 4, "tree_branches": 3})
    with pytest.raises(RouteropsError, match="tree_branches"):
        rl_config({"tree_branches": 1})


def test_the_rollout_group_fills_every_turn_field_so_mt_grpo_gigpo_and_eq5_eq6_run_on_it():
    from types import SimpleNamespace

    from models.orchestrator.advantages import AdvantageConfig, CostNormaliser, turn_advantages
    from routerops.envs.qa import score_answer
    from routerops.orchestra.render import render_observations
    from routerops.types import Task
    from models.orchestrator.rl_step import answer_scorer, rollout_group

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


def test_the_signal_pool_keeps_tasks_solved_sometimes_but_not_always():
    from stages.orchestra import signal_pool

    assert signal_pool({"a": 0.0, "b": 0.25, "c": 1.0, "d": 0.75}) == ["b", "d"]
    assert signal_pool({"a": 0.0, "c": 1.0}) == []


def test_a_limited_pool_keeps_the_tasks_nearest_one_half_in_the_pool_s_order():
    from stages.orchestra.rl import limit_pool

    rates = {"a": 0.25, "b": 0.75, "c": 0.5, "d": 0.25, "e": 0.5}
    pool = list(rates)
    assert limit_pool(pool, rates, 2) == ["c", "e"]
    assert limit_pool(pool, rates, 3) == ["a", "c", "e"]  # of the 0.25 / 0.75 ties, the earliest
    assert limit_pool(pool, rates, 0) == pool and limit_pool(pool, rates, 9) == pool


def test_a_run_recorded_before_pool_size_existed_still_resumes(tmp_path):
    """pool_size is left out of the run record at its default, so the record of a run made before the
    key existed still matches; a limit, which changes the steps, is recorded."""
    import dataclasses

    from stages.orchestra.config import lm_config, load_run
    from stages.orchestra.rl import rl_run_record

    params = Path(__file__).resolve().parents[2] / "params.yaml"
    run = load_run(params)
    cfg = dataclasses.replace(run.rl, settings=dataclasses.replace(run.rl.settings, pool_size=0))
    record = rl_run_record(run, lm_config(run), cfg, [], tmp_path)
    assert "pool_size" not in record["settings"] and "probe_samples" in record["settings"]
    limited = dataclasses.replace(cfg, settings=dataclasses.replace(cfg.settings, pool_size=8))
    assert rl_run_record(run, lm_config(run), limited, [], tmp_path)["settings"]["pool_size"] == 8
