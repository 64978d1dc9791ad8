"""End to end: the MTRouter flow (collect → ablations → evaluate → analyses → register) under Prefect,
on ScienceWorld (its simulator in a JVM) with the embedded pool served by the real llama.cpp server.

Tiny scale: one ID task type with 2 variations (1 train, 1 test), one OOD task type with 2, two
turns, one estimator seed, two ablations, the hashing history encoder. The flow writes to paths
relative to the working directory, so it runs in a temporary one with its own MLflow store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.flows.conftest import short_reply_pool

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
pytest.importorskip("scienceworld")

MTROUTER = {
    "pool": str(REPO / "configs/pools/embedded-smollm2.yaml"),
    "id_types": ["find-plant"], "ood_types": ["find-non-living-thing"], "max_variations": 2,
    "budget_usd": 0.05, "turn_limit": 2, "concurrency": 2, "seeds": [0], "ablations": ["full", "ridge"],
    "estimator": {"encoder_kind": "hashing", "hashing_dim": 512, "disk_cache": False, "max_epochs": 20},
    "gate": {"n_boot": 500}, "episode_routers": ["logistic"], "ablation_rollouts": True,
}


@pytest.fixture
def workdir(flow_workdir, tmp_path, monkeypatch):
    monkeypatch.setenv("ROUTEROPS_CACHE_DIR", str(tmp_path / "cache"))
    return flow_workdir("mtrouter", {**MTROUTER, "pool": short_reply_pool(tmp_path)}, "mtrouter-flow-test")


def test_mtrouter_flow_end_to_end(workdir, prefect_api):
    import mlflow

    from flows.mtrouter import mtrouter_flow

    run_ids = json.loads(mtrouter_flow(params_file="params.yaml").read_text())

    report = workdir / "reports/mtrouter"
    ablations = (report / "ablations.md").read_text()
    assert "full" in ablations and "ridge" in ablations
    evaluation = pd.read_csv(report / "evaluation.csv")
    assert {"test", "ood"} <= set(evaluation.split) and "mtrouter" in set(evaluation.policy)
    assert {"random_multi_turn", "single/smol-direct/answer", "single/smol-cot/answer",
            "episode/logistic", "mtrouter:ridge"} <= set(evaluation.policy)
    assert (report / "analyses/cost_vs_switches.png").stat().st_size > 1000

    turns = pd.read_parquet(workdir / "data/mtrouter/eval/turns.parquet")
    assert len(turns) > 0 and (turns.prompt_tokens > 0).all() and (turns.completion_tokens > 0).all()
    assert turns.groupby("episode_id").turn_index.max().max() <= 1  # turn limit 2

    registry = json.loads((report / "registry.json").read_text())
    assert registry["name"] == "mtrouter-scienceworld"
    decision = registry["decision"]
    assert decision["promote"] and "no current champion" in decision["reason"]
    evaluated = pd.read_parquet(workdir / "data/mtrouter/eval/episodes.parquet")
    id_test = evaluated.query("policy == 'mtrouter' and split == 'test'")
    assert decision["candidate_score"] == pytest.approx(id_test.score.mean())
    assert sorted(decision["evidence"]["gate_ids"]) == sorted(id_test.task_id)

    runs = mlflow.search_runs(experiment_names=["mtrouter-flow-test"])
    children = runs[runs["tags.mlflow.parentRunId"] == run_ids["pipeline"]]
    assert {"mtrouter-collect", "mtrouter-ablations:full", "mtrouter-ablations:ridge", "mtrouter-evaluate",
            "mtrouter-analyses", "mtrouter-register"} <= set(children["tags.mlflow.runName"])
    assert {"register mtrouter-scienceworld", "promotion-gate mtrouter-scienceworld v1"} <= set(runs["tags.mlflow.runName"])

    client = mlflow.MlflowClient()
    champion = client.get_model_version_by_alias("mtrouter-scienceworld", "champion")
    assert str(champion.version) == registry["version"] == "1"
    tags = champion.tags
    assert tags["workers"] == "smol-direct,smol-cot" and tags["encoder_kind"] == "hashing"
    assert len(tags["git_commit"]) == 40 and tags["price_book_version"]
    assert {"data.train_episodes_sha256", "data.train_turns_sha256", "data.tasks_sha256"} <= set(tags)

    # The registered champion routes a ScienceWorld turn the way the router the flow evaluated does.
    from models.mtrouter.router import MTRouter
    from evaluation.serving.mtrouter import ServedMTRouter

    from routerops.envs.suites import read_tasks

    prompt = next(t.prompt for t in read_tasks(workdir / "data/mtrouter/tasks.jsonl") if t.split == "test")
    # Through MLflow every input column is required; null = the whole pool, no budget, no turn limit.
    request = pd.DataFrame({"task": [prompt, prompt], "history": ["[]", json.dumps(
        [{"action": "look around", "observation": "This room is called the greenhouse."}])],
        "candidates": [None, None], "budget_usd": [None, None], "turns_left": [None, None]})
    served = mlflow.pyfunc.load_model("models:/mtrouter-scienceworld@champion").predict(request)
    local = ServedMTRouter(MTRouter.load(workdir / "data/mtrouter/routers/seed0")).predict(request)
    pd.testing.assert_frame_equal(served, local)

    # Registering again gates against v1, rolled out on the same ID-test tasks: a tie keeps v1.
    from stages import run_stage

    again = json.loads(run_stage("mtrouter-register").read_text())
    evidence = again["decision"]["evidence"]
    assert again["version"] == "2" and evidence["champion_version"] == "1"
    assert sorted(evidence["gate_ids"]) == sorted(id_test.task_id) and len(evidence["champion_scores"]) == len(id_test)
    assert (workdir / ".routerops/mtrouter/gate/mtrouter-scienceworld-v1/episodes.parquet").is_file()
    if evidence["champion_scores"] == evidence["candidate_scores"]:
        assert not again["decision"]["promote"]
    now = client.get_model_version_by_alias("mtrouter-scienceworld", "champion")
    assert str(now.version) == ("2" if again["decision"]["promote"] else "1")
