"""Tracked runs show their data: each input of a stage manifest becomes an MLflow dataset input of the
stage's run (repo-relative name, DVC's md5 as digest, split as context, rows), the price book among
them; digests are checked against what the real `dvc add` records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import yaml

from evaluation.tracking import dvc_md5, log_pipeline_runs
from routerops.config import TrackConfig
from stages.manifest import write_manifest

PRICE_BOOK = {"version": "2026-11-01", "effective_date": "2026-11-01", "currency": "USD",
              "prices": {"cheap": {"input_per_1m": 0.1, "output_per_1m": 0.4},
                         "strong": {"input_per_1m": 2.5, "output_per_1m": 10.0, "per_call": 0.0}}}


def write_inputs(root: Path) -> dict[str, Path]:
    """A task table over three splits, a test-split episode table, a price book and a directory."""
    paths = {"tasks": root / "data/suites/tasks.jsonl", "episodes": root / "data/priced/episodes.parquet",
             "book": root / "configs/prices/current.yaml", "adapter": root / "data/sft/adapter"}
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    splits = ["train"] * 3 + ["val"] * 2 + ["test"]
    paths["tasks"].write_text("".join(json.dumps({"task_id": f"t{i}", "split": s, "prompt": f"{i}+1"}) + "\n"
                                      for i, s in enumerate(splits)))
    pd.DataFrame({"episode_id": ["e0", "e1", "e2", "e3"], "split": "test", "cost_usd": [0.1, 0.2, 0.0, 0.3]}
                 ).to_parquet(paths["episodes"])
    paths["book"].write_text(yaml.safe_dump(PRICE_BOOK))
    paths["adapter"].mkdir()
    (paths["adapter"] / "adapter_config.json").write_text('{"r": 8}')
    (paths["adapter"] / "weights").mkdir()
    (paths["adapter"] / "weights" / "a.bin").write_bytes(b"\x00\x01" * 100)
    return paths


def dvc_add_md5s(root: Path, paths: list[Path]) -> dict[str, str]:
    """What real DVC records for each path (the md5 in its .dvc file, as dvc.lock records outs)."""
    def dvc(*args):
        done = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
    dvc("init", "--no-scm", "-q")
    dvc("add", "-q", *[str(p.relative_to(root)) for p in paths])
    return {str(p.relative_to(root)): yaml.safe_load(p.with_name(p.name + ".dvc").read_text())["outs"][0]["md5"]
            for p in paths}


@pytest.fixture
def tracked(tmp_path, monkeypatch, mlflow_db):
    """Two stage manifests written by the real write_manifest from the repo root (as DVC runs stages),
    logged by the real log_pipeline_runs into a temp MLflow store; yields (paths, run ids, client)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    paths = write_inputs(tmp_path)
    rel = {k: p.relative_to(tmp_path) for k, p in paths.items()}
    manifests = Path("reports/stages")
    write_manifest(manifests, "collect", {}, [rel["tasks"], rel["book"]], [], {"episodes": 4})
    write_manifest(manifests, "evaluate", {}, [rel["episodes"], rel["book"]], [], {"accuracy": 0.5})
    track = TrackConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_root="mlruns-artifacts",
                        experiment="datasets-test")
    try:
        run_ids = log_pipeline_runs(track, manifests, ["collect", "evaluate"])
        yield paths, run_ids, mlflow.MlflowClient()
    finally:
        mlflow.set_tracking_uri(None)


def inputs_of(client, run_id) -> dict[str, dict]:
    return {i.dataset.name: {"digest": i.dataset.digest, "tags": {t.key: t.value for t in i.tags},
                             "profile": json.loads(i.dataset.profile or "{}"), "schema": i.dataset.schema}
            for i in client.get_run(run_id).inputs.dataset_inputs}


@pytest.mark.slow
def test_each_stage_run_lists_its_inputs_with_dvc_digests_splits_and_rows(tracked, tmp_path):
    paths, run_ids, client = tracked
    dvc = dvc_add_md5s(tmp_path, [paths["tasks"], paths["episodes"], paths["book"], paths["adapter"]])
    collect, evaluate = inputs_of(client, run_ids["collect"]), inputs_of(client, run_ids["evaluate"])

    assert set(collect) == {"data/suites/tasks.jsonl", "configs/prices/current.yaml"}
    assert set(evaluate) == {"data/priced/episodes.parquet", "configs/prices/current.yaml"}
    parent = inputs_of(client, run_ids["pipeline"])  # the row the runs table shows first: every input, once
    assert set(parent) == set(collect) | set(evaluate)
    assert {name: logged["digest"] for name, logged in parent.items()} == {name: dvc[name] for name in parent}
    for name, logged in {**collect, **evaluate}.items():
        assert logged["digest"] == dvc[name], name
    tasks = collect["data/suites/tasks.jsonl"]
    # Three splits in one table: context "input", the rows of each split beside it.
    assert tasks["tags"]["mlflow.data.context"] == "input" and tasks["tags"]["splits"] == "train=3,val=2,test=1"
    assert tasks["profile"]["num_rows"] == 6 and tasks["tags"]["rows"] == "6"
    episodes = evaluate["data/priced/episodes.parquet"]
    assert episodes["tags"]["mlflow.data.context"] == "test" and episodes["profile"]["num_rows"] == 4
    assert "cost_usd" in episodes["schema"]
    book = evaluate["configs/prices/current.yaml"]
    assert book["tags"]["mlflow.data.context"] == "price_book" and book["tags"]["version"] == "2026-11-01"
    assert book["profile"]["num_rows"] == 2  # one row per priced worker
    # A directory (an adapter, a trajectory folder) hashes as DVC's "<md5>.dir" listing.
    assert dvc_md5(paths["adapter"]) == dvc["data/sft/adapter"] and dvc["data/sft/adapter"].endswith(".dir")


@pytest.mark.slow
def test_an_input_rewritten_after_its_stage_ran_is_named_not_logged(tmp_path, monkeypatch, mlflow_db):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    paths = write_inputs(tmp_path)
    manifests = Path("reports/stages")
    write_manifest(manifests, "collect", {}, [paths["tasks"].relative_to(tmp_path),
                                              paths["book"].relative_to(tmp_path)], [], {})
    paths["book"].write_text(yaml.safe_dump({**PRICE_BOOK, "version": "2026-12-01"}))  # after the stage read it
    track = TrackConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_root="artifacts",
                        experiment="datasets-test")
    try:
        run_id = log_pipeline_runs(track, manifests, ["collect"])["collect"]
        run = mlflow.MlflowClient().get_run(run_id)
    finally:
        mlflow.set_tracking_uri(None)
    assert [i.dataset.name for i in run.inputs.dataset_inputs] == ["data/suites/tasks.jsonl"]
    assert run.data.tags["datasets.changed"] == "configs/prices/current.yaml"


def test_integer_columns_of_a_logged_table_raise_no_model_signature_hint(tmp_path, monkeypatch, mlflow_db):
    """Token counts are integers by schema; MLflow's "integer columns cannot represent missing values"
    hint is advice for a model's input and was shown dozens of times per `make demo` (issue 26)."""
    import warnings

    from evaluation.tracking import log_dataset_inputs

    monkeypatch.chdir(tmp_path)
    table = tmp_path / "turns.parquet"
    pd.DataFrame({"episode_id": ["e0", "e1"], "prompt_tokens": [12, 30], "completion_tokens": [4, 9]}).to_parquet(table)
    book = tmp_path / "book.yaml"
    book.write_text(yaml.safe_dump(PRICE_BOOK))
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment("integer-columns")  # not the experiment id an earlier test left active
    try:
        with warnings.catch_warnings(record=True) as caught, mlflow.start_run():
            warnings.simplefilter("always")
            logged = log_dataset_inputs([table, book])
            inputs = mlflow.get_run(mlflow.active_run().info.run_id).inputs.dataset_inputs
    finally:
        mlflow.set_tracking_uri(None)
    assert logged == ["turns.parquet", "book.yaml"]
    assert not [w for w in caught if "Inferred schema contains integer" in str(w.message)]
    schema = json.loads(next(d.dataset.schema for d in inputs if d.dataset.name == "turns.parquet"))
    assert {"name": "prompt_tokens", "type": "long", "required": True} in schema["mlflow_colspec"]
