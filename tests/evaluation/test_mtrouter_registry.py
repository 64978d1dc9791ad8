"""The multi-turn MTRouter in the MLflow registry (evaluation/registry.py, evaluation/serving/mtrouter.py) on a
real MLflow store (SQLite in tmp_path), with training and gate episodes from real rollouts.

The rollouts run the engine (routerops.rollout) in the replay environment: each call answers from a
logged-outcome table, so the episodes are deterministic and the two routers differ for sure.
Arithmetic questions are solved only by `cheap`, capital-city questions only by `dear`: a router
that reads the task scores 1 on every test task, one trained on inverted outcomes scores 0.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from models.mtrouter.config import MTRouterConfig
from stages.mtrouter import held_out_outcomes, judged_episodes
from models.mtrouter.router import MTRouter
from evaluation.serving.mtrouter import ServedMTRouter
from routerops import schema
from routerops.config import TrackConfig
from routerops.envs.replay import ReplayEnvironment, replay_tasks, replay_workers
from routerops.errors import InputError
from routerops.policies import RandomMultiTurnPolicy, SinglePolicy
from routerops.pricing import Pool, Price, PriceBook, WorkerSpec
from routerops.promotion import GateConfig
from routerops.rollout import collect_sync

WORKERS = ("cheap", "dear")
BOOK = PriceBook("test-2026-02", dt.date(2026, 2, 1), {"cheap": Price(0.1, 0.1), "dear": Price(2.0, 2.0)})
POOL = Pool("replay-pool", tuple(
    WorkerSpec(name=w, kind="llm", primitives=("answer",), endpoint="replay", model=w,
               attributes={"context_limit": c, "params_b": p})
    for w, c, p in (("cheap", 8192, 1), ("dear", 131072, 70))))
CFG = MTRouterConfig(encoder_kind="hashing", hashing_dim=256, hidden_dims=(32,), attr_embed_dim=8, residual_dim=4,
                     model_embed_dim=8, max_epochs=40, patience=5, disk_cache=False, surface_features=False,
                     expected_episode_length=1.0)
GATE = GateConfig(objective="accuracy_at_budget", n_boot=1000, seed=0)
COUNTRIES = ["France", "Japan", "Kenya", "Peru", "Canada", "Egypt", "Norway", "Chile", "India", "Spain", "Ghana"]


def logged_outcomes(n: int = 72) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        arith = i % 2 == 0
        query = (f"What is {rng.integers(10, 999)} plus {rng.integers(10, 999)}?" if arith
                 else f"Which city is the capital of {COUNTRIES[i % len(COUNTRIES)]}?")
        split = ("train", "train", "val", "test")[i % 4] if i < 48 else "test"
        for worker in WORKERS:
            solved = (worker == "cheap") == arith
            rows.append({"dataset": "synthetic", "query_id": f"q{i:03d}", "query": query, "worker": worker,
                         "score": float(solved), "prompt_tokens": 20,
                         "completion_tokens": 10 if worker == "cheap" else 60,
                         "response": f"{worker} answer {i}", "split": split})
    return pd.DataFrame(rows)


def roll_out(frame: pd.DataFrame, tasks: list, policies: list, out_dir) -> tuple[pd.DataFrame, pd.DataFrame]:
    return collect_sync(tasks, policies, env=ReplayEnvironment(frame), workers=replay_workers(frame), book=BOOK,
                        budget_usd=1.0, turn_limit=2, out_dir=out_dir, run_id="registry-test", seed=0,
                        concurrency=4, progress=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Training episodes of the behaviour policies (single models + random router), the routers and a judge."""
    tmp = tmp_path_factory.mktemp("episodes")
    frame = logged_outcomes()
    tasks = replay_tasks(frame)
    train = [t for t in tasks if t.split in ("train", "val")]
    policies = [SinglePolicy(w, "answer", turns=1) for w in WORKERS] + [RandomMultiTurnPolicy(stop_prob=0.5, seed=0)]
    episodes, turns = roll_out(frame, train, policies, tmp / "train")
    prompts = {t.task_id: t.prompt for t in tasks}
    good = MTRouter(POOL, BOOK, CFG).fit(episodes, turns, prompts)
    worse = MTRouter(POOL, BOOK, CFG).fit(episodes.assign(score=1.0 - episodes.score), turns, prompts)
    test = [t for t in tasks if t.split == "test"]

    def judge(served, label: str):
        router = served.router if isinstance(served, ServedMTRouter) else served
        return judged_episodes(held_out_outcomes(roll_out(frame, test, [router.policy(name=label)], tmp / label)[0]))

    hashes = {"train_episodes_sha256": schema.file_sha256(tmp / "train/episodes.parquet")}
    return {"good": good, "worse": worse, "judge": judge, "hashes": hashes, "test": test}


@pytest.fixture
def tracking(tmp_path, monkeypatch, mlflow_db):
    import mlflow

    from evaluation.tracking import use_tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    use_tracking(TrackConfig(tracking_uri=uri, artifact_root=str(tmp_path / "artifacts"),
                             experiment="mtrouter-registry"))
    yield uri
    mlflow.set_tracking_uri(None)


def requests(test: list) -> pd.DataFrame:
    """Turn-1 and turn-2 decisions on test tasks, with budgets, candidate subsets and turn limits."""
    history = json.dumps([{"action": "cheap answer 3", "observation": "That is not right."}])
    rows = [{"task": t.prompt, "history": "[]" if i % 2 else history,
             "candidates": json.dumps(list(WORKERS)) if i % 3 else '["cheap"]',
             "budget_usd": 1.0 if i % 5 else 1e-6, "turns_left": 3.0 if i % 7 else 0.0}
            for i, t in enumerate(test[:14])]
    return pd.DataFrame(rows)


@pytest.mark.slow  # a fresh interpreter loads the champion
def test_register_load_in_a_fresh_process_and_refuse_a_worse_candidate(world, tracking, tmp_path):
    import mlflow

    from evaluation.registry import CHAMPION_ALIAS, DECISION_FILE, register_and_promote

    judge = world["judge"]
    good_outcomes = judge(world["good"], "candidate-good")
    assert good_outcomes.outcomes.correct.mean() == 1.0  # it reads the task: cheap for sums, dear for capitals
    first, promoted = register_and_promote(ServedMTRouter(world["good"], "replay"), good_outcomes, judge, GATE,
                                           data_hashes=world["hashes"], metrics={"id_test_score_mean": 1.0})
    assert first.name == "mtrouter-replay" and promoted.promote and "no current champion" in promoted.reason

    worse_outcomes = judge(world["worse"], "candidate-worse")
    assert worse_outcomes.outcomes.correct.mean() < 0.5
    second, refused = register_and_promote(ServedMTRouter(world["worse"], "replay"), worse_outcomes, judge, GATE,
                                           data_hashes=world["hashes"], include_code=False)
    assert not refused.promote and refused.ci_high < 0, refused.reason
    assert refused.champion_score == 1.0 and refused.n == len(world["test"])
    assert sorted(refused.evidence["gate_ids"]) == sorted(t.task_id for t in world["test"])

    client = mlflow.MlflowClient()
    assert str(client.get_model_version_by_alias("mtrouter-replay", CHAMPION_ALIAS).version) == first.version
    tags = client.get_model_version("mtrouter-replay", second.version).tags
    assert tags["promotion.decision"] == "refused" and tags["promotion.champion_version"] == first.version
    assert tags["price_book_version"] == BOOK.version and tags["pool"] == "replay-pool"
    assert tags["workers"] == "cheap,dear" and len(tags["git_commit"]) >= 7 and tags["encoder_kind"] == "hashing"
    assert tags["data.train_episodes_sha256"] == world["hashes"]["train_episodes_sha256"]
    record = mlflow.artifacts.load_dict(f"runs:/{tags['promotion.run_id']}/{DECISION_FILE}")
    assert record["promote"] is False and len(record["evidence"]["champion_scores"]) == len(world["test"])

    # The champion, loaded by alias in a fresh interpreter, routes exactly as the in-process router.
    frame = requests(world["test"])
    frame.to_parquet(tmp_path / "requests.parquet")
    script = textwrap.dedent(f"""
        import mlflow, pandas as pd
        mlflow.set_tracking_uri({tracking!r})
        model = mlflow.pyfunc.load_model("models:/mtrouter-replay@champion")
        out = model.predict(pd.read_parquet("requests.parquet"))
        out.to_parquet("out.parquet")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    served = pd.read_parquet(tmp_path / "out.parquet")
    expected = ServedMTRouter(world["good"]).predict(frame)
    assert list(served.worker) == list(expected.worker)
    np.testing.assert_array_equal(served.filter(like="score:").to_numpy(), expected.filter(like="score:").to_numpy())
    assert {"cheap", "dear", "STOP"} <= set(served.worker)  # the rows exercise routing, budgets and turn limits


def test_logged_model_signature_example_and_input_errors(world, tracking, tmp_path):
    import mlflow
    from mlflow.models import Model

    from evaluation.registry import register

    reg = register(ServedMTRouter(world["good"], "replay"), include_code=False)
    local = mlflow.artifacts.download_artifacts(reg.model_uri, dst_path=str(tmp_path / "dl"))
    model = Model.load(local)
    assert model.signature.inputs.input_names() == ["task", "history", "candidates", "budget_usd", "turns_left"]
    assert model.signature.outputs.input_names() == ["worker", "score:cheap", "score:dear"]
    assert model.saved_input_example_info is not None

    loaded = mlflow.pyfunc.load_model(reg.model_uri)
    frame = requests(world["test"])
    with pytest.raises(Exception, match="history"):  # MLflow's schema check names the missing column
        loaded.predict(frame.drop(columns=["history"]))
    with pytest.raises(InputError, match="unknown worker 'gpt-9'"):
        loaded.predict(frame.assign(candidates='["cheap", "gpt-9"]'))
    with pytest.raises(InputError, match=r"history\[0\]"):
        loaded.predict(frame.assign(history="[{\"observation\": \"no action\"}]"))
