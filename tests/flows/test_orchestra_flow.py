"""End to end: the orchestrator flow (tasks → baselines, teacher, probe → verifier filter → SFT → RL →
evaluate → register) under Prefect, with the real llama.cpp server and sandbox behind the embedded pool, TRL +
PEFT training SmolLM2-135M's LoRA adapter, and MLflow tracking and registering it.

Smallest scale: two families with one task per split (OOD: one), two SFT steps, one RL step of two
rollouts, short controller turns, one router seed. The flow writes under its root, a temporary directory with its own MLflow store.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from tests.flows.conftest import short_reply_pool

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]

ORCHESTRA = {
    "pool": str(REPO / "configs/pools/embedded-smollm2.yaml"),
    "tasks": {"families": ["basic_arithmetic", "gcd"], "ood_families": ["decimal_chain_sum"],
              "train": 1, "val": 1, "test": 1, "ood": 1, "seed": 7},
    "turn_limit": 3,
    "prompt": "compact",
    "baselines": {"routers": ["knn"], "router_seeds": [0], "concurrency": 4},
    "gate": {"n_boot": 200},
    "controller": {"max_new_tokens": 48, "batch_size": 8},
    "sft": {"max_steps": 2, "save_steps": 1, "warmup_steps": 0, "max_seq_len": 768},
    # One step on the curriculum: two train tasks after two SFT steps rarely include one with a signal to probe.
    "rl": {"group_size": 2, "max_steps": 1, "save_steps": 1, "max_seq_len": 768, "pool": "curriculum"},
}


@pytest.fixture
def workdir(flow_workdir, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    return flow_workdir("orchestra", {**ORCHESTRA, "pool": short_reply_pool(tmp_path)}, "orchestra-flow-test")


def test_orchestra_flow_end_to_end(workdir, prefect_api):
    import mlflow

    from flows.orchestra import orchestra_flow
    from routerops.envs.suites import read_tasks
    from routerops.orchestra.modes import MODES

    registry = json.loads(orchestra_flow(params_file="params.yaml").read_text())

    tasks = read_tasks(workdir / "data/orchestra/tasks.jsonl")
    by_split = {s: {t.task_id for t in tasks if t.split == s} for s in ("train", "val", "test", "ood")}

    # the curriculum and SFT saw train tasks only
    sft_rows = [json.loads(line) for line in (workdir / "data/orchestra/curriculum/sft.jsonl").read_text().splitlines()]
    assert {r["task_id"] for r in sft_rows} <= by_split["train"]
    probe = pd.read_parquet(workdir / "data/orchestra/probe/episodes.parquet")
    assert set(probe.task_id) == by_split["train"] and set(probe.policy_version) == {"base"}
    result = json.loads((workdir / "data/orchestra/sft/sft_result.json").read_text())
    assert result["global_step"] == 2 and (workdir / "data/orchestra/sft/adapter/adapter_model.safetensors").is_file()

    # RL continued from the SFT adapter on train tasks' rollouts, one step of G = 2
    rl_result = json.loads((workdir / "data/orchestra/rl/rl_result.json").read_text())
    assert rl_result["global_step"] == 1 and rl_result["sft_adapter"].endswith("data/orchestra/sft/adapter")
    assert {s["task_id"] for s in rl_result["steps"]} <= by_split["train"]
    assert len(rl_result["steps"][0]["episodes"]) == 2

    # base, SFT'd and RL'd controller rolled out on val, test and OOD, each turn within the turn limit
    episodes = pd.read_parquet(workdir / "data/orchestra/eval/episodes.parquet")
    assert set(episodes.policy_version) == {"base", "sft", "rl"}
    for version, group in episodes.groupby("policy_version"):
        assert sorted(group.task_id) == sorted(by_split["val"] | by_split["test"] | by_split["ood"]), version
    turns = pd.read_parquet(workdir / "data/orchestra/eval/turns.parquet")
    controller = turns[turns.actor == "controller"]
    assert (controller.completion_tokens <= 48).all() and controller.groupby("episode_id").size().max() <= 3

    # one table: the controller before and after SFT beside the baselines on test and OOD; on val (the
    # gate's evidence) the controller's rows only
    table = pd.read_csv(workdir / "reports/orchestra/results.csv")
    assert set(table.split) == {"val", "test", "ood"} and set(table[table.split == "val"].kind) == {"orchestrator"}
    for split in ("test", "ood"):
        rows = table[table.split == split].set_index("policy")
        assert {"orchestrator-base", "orchestrator-sft", "orchestrator-rl", "uniform_random", "mtrouter"} <= set(rows.index)
        mine = rows.loc[["orchestrator-base", "orchestrator-sft", "orchestrator-rl"]]
        assert mine.valid_turn_rate.between(0, 1).all() and mine.accuracy.between(0, 1).all()
        assert mine[[f"mode_{m}" for m in MODES]].sum(axis=1).round(6).eq(1).all()
        rl_eps = episodes[(episodes.split == split) & (episodes.policy_version == "rl")]
        assert mine.loc["orchestrator-rl", "usd_per_episode"] == pytest.approx(rl_eps.cost_usd.mean())
    assert (workdir / "reports/orchestra/results.md").read_text().startswith("# Orchestrator results")

    # the RL'd controller registered as `orchestrator`, promoted (no champion yet) on the val episodes
    assert registry["name"] == "orchestrator" and registry["version"] == "1"
    decision = registry["decision"]
    assert decision["promote"] and sorted(decision["evidence"]["gate_ids"]) == sorted(by_split["val"])
    client = mlflow.MlflowClient()
    champion = client.get_model_version_by_alias("orchestrator", "champion")
    assert champion.tags["workers"] and champion.tags["base_model"] == "smollm2-135m-instruct"
    rl_weights = workdir / "data/orchestra/rl/adapter/adapter_model.safetensors"
    assert champion.tags["data.adapter_sha256"] == hashlib.sha256(rl_weights.read_bytes()).hexdigest()
    runs = mlflow.search_runs(experiment_names=["orchestra-flow-test"])
    sft_run = runs[runs["tags.mlflow.runName"] == "orchestra-sft"]
    assert len(sft_run) == 1
    curve = client.get_metric_history(sft_run.run_id.iloc[0], "loss")
    assert [m.step for m in curve] == [1, 2]
    rl_run = runs[runs["tags.mlflow.runName"] == "orchestra-rl"]
    assert len(rl_run) == 1
    assert [m.step for m in client.get_metric_history(rl_run.run_id.iloc[0], "reward/verifier_mean")] == [1]

    # the registered champion answers through MLflow's pyfunc as the flow's controller does
    request = pd.DataFrame({"task": [next(t.prompt for t in tasks if t.split == "test")]})
    served = mlflow.pyfunc.load_model("models:/orchestrator@champion").predict(request)
    assert list(served.columns) == ["action", "worker", "routes", "answer", "turn", "error"]
    assert served.action.iloc[0] in {"plan", "final_answer", "malformed"}
    assert os.environ["MLFLOW_TRACKING_URI"].startswith("sqlite:///")
