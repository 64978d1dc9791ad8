"""experiments/orchestra_rl_variants.py's bookkeeping: finished runs are archived and found again, a run
from another SFT adapter is not this table's, and runs from two SFT adapters are never pooled."""

from __future__ import annotations

import json

import pytest

from routerops.errors import InputError

def record(name: str, sha: str) -> dict:
    return {"name": name, "estimator": name.split("-")[0], "seed": 0, "sft_sha256": sha, "steps": [],
            "episodes": [{"task_id": "t1", "split": "test", "score": 1.0, "success": True, "cost_usd": 1e-4,
                          "decisions": ["<route>calc</route>"]}]}


def test_an_archived_run_is_found_again_without_its_work_folder(bench, tmp_path):
    archive, work = tmp_path / "archive", tmp_path / "work"
    bench.archive_run(record("grpo-s1", "abc"), archive)
    assert not list(archive.glob("*.partial"))
    assert bench.finished_run(work, archive, "grpo-s1", "abc") == record("grpo-s1", "abc")
    assert bench.finished_run(work, archive, "grpo-s2", "abc") is None


def test_the_work_folder_wins_over_the_archive(bench, tmp_path):
    archive, work = tmp_path / "archive", tmp_path / "work"
    bench.archive_run(record("sft", "abc"), archive)
    fresher = {**record("sft", "abc"), "eval_seconds": 5.0}
    (work / "sft").mkdir(parents=True)
    (work / "sft" / bench.RUN_FILE).write_text(json.dumps(fresher))
    assert bench.finished_run(work, archive, "sft", "abc")["eval_seconds"] == 5.0


def test_a_run_from_another_sft_adapter_is_redone(bench, tmp_path):
    bench.archive_run(record("agentic_grpo-s0", "old"), tmp_path)
    assert bench.finished_run(tmp_path / "work", tmp_path, "agentic_grpo-s0", "new") is None
    legacy = {k: v for k, v in record("mt_grpo-s0", "x").items() if k != "sft_sha256"}
    bench.archive_run(legacy, tmp_path)  # written before runs carried their SFT adapter's hash
    assert bench.finished_run(tmp_path / "work", tmp_path, "mt_grpo-s0", "x") is None


def test_runs_from_two_sft_adapters_are_not_pooled(bench):
    same = [record("sft", "abc"), record("grpo-s0", "abc")]
    assert bench.same_sft(same) == same
    with pytest.raises(InputError, match=r"different SFT adapters.*abc: sft.*def: grpo-s1"):
        bench.same_sft([*same, record("grpo-s1", "def")])
