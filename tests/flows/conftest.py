"""A flow's working directory: its own params.yaml, git commit (registered models are tagged with
`git rev-parse HEAD`), MLflow store and Prefect home, under a temp dir; and the pool with short replies
that the flow tests run on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
# The repository's price books, by absolute path: the flow runs from its own root (params.yaml `prices`).
PRICES = {"collection": str(REPO / "configs/prices/collection-2026-11.yaml"),
          "evaluation": str(REPO / "configs/prices/current.yaml"),
          "replay": str(REPO / "configs/prices/routellm-2024.yaml")}

@pytest.fixture
def flow_workdir(tmp_path, monkeypatch, new_mlflow_db):
    """`flow_workdir(section, settings, experiment)` → the root, with params.yaml holding the section."""
    root = tmp_path / "work"
    root.mkdir()
    db = new_mlflow_db(root / "mlflow" / "test.db")  # migrated once per session (tests/conftest.py)

    def make(section: str, settings: dict, experiment: str):
        params = {"track": {"tracking_uri": f"sqlite:///{db}", "artifact_root": str(root / "mlflow/artifacts"),
                            "experiment": experiment}, "prices": PRICES, section: settings}
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(git + ["init", "-q"], cwd=root, check=True)
        subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "flow test"], cwd=root, check=True)
        monkeypatch.chdir(root)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
        monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
        monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
        return root

    yield make
    import mlflow

    mlflow.set_tracking_uri(None)


def short_reply_pool(dst, max_tokens: int = 32, source: str = "configs/pools/embedded-smollm2.yaml"):
    """The pool `source` (the embedded one by default) with every live LLM worker's replies capped at
    `max_tokens` (smol-cot: 96) and the `reason` primitive's too: the flow tests check the plumbing, not
    the answers, and every token saved is time on the one llama.cpp thread (less than hoped: a call's
    fixed cost, about a second of prompt and overhead, dominates; docs/operations/tests.md). Replay
    workers keep their caps: a cap below a logged answer would cut it."""
    repo = Path(__file__).resolve().parents[2]
    pool = yaml.safe_load((repo / source).read_text())
    for worker in pool["workers"]:
        if worker["kind"] == "llm" and worker["endpoint"] == "local":
            cap = min(worker["generation"]["max_tokens"], max_tokens)
            worker["generation"]["max_tokens"] = worker["attributes"]["max_tokens"] = cap
    reason = pool["primitives"]["reason"]
    reason["max_tokens"] = min(reason["max_tokens"], max_tokens)
    path = Path(dst) / "pool.yaml"
    path.write_text(yaml.safe_dump(pool, sort_keys=False))
    return str(path)
