"""The controller's SFT run in a real MLflow store (SQLite in tmp_path): a run interrupted at step 1 and
resumed under tracking holds the whole loss curve, the settings and the adapter."""

from __future__ import annotations

import json
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # two shared cores: idle OpenMP threads sleep

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from models.orchestrator.config import OrchestraConfig, SFTSettings  # noqa: E402
from models.orchestrator.sft import train_sft  # noqa: E402
from routerops.config import TrackConfig  # noqa: E402

MESSAGES = [
    {"role": "system", "content": "Route subtasks to (model, skill) pairs; end with one <final_answer>."},
    {"role": "user", "content": "What is 6 × 7?"},
    {"role": "assistant", "content": '<route subtask="1" model="python" skill="python">print(6*7)</route>'},
    {"role": "user", "content": '<obs subtask="1"> 42 </obs>'},
    {"role": "assistant", "content": "<verify>\nok\n</verify>\n<final_answer> 42 </final_answer>"},
]
CONFIG = OrchestraConfig(sft=SFTSettings(learning_rate=1e-3, warmup_steps=0, max_steps=2, batch_size=1,
                                         max_seq_len=96, save_steps=1, logging_steps=1))


class StopAfterFirstStep(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = True
        return control


@pytest.mark.slow
def test_a_resumed_tracked_run_logs_the_whole_curve_the_settings_and_the_adapter(tmp_path, monkeypatch, mlflow_db):
    import mlflow

    from evaluation.sft_tracking import train_sft_tracked
    from evaluation.tracking import dvc_md5

    torch.set_num_threads(min(torch.get_num_threads(), 2))
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"task_id": "t0", "messages": MESSAGES}) + "\n")
    train_sft(CONFIG, data, tmp_path / "out", callbacks=[StopAfterFirstStep()])  # the interrupted run
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    track = TrackConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_root=str(tmp_path / "artifacts"),
                        experiment="orchestra-sft-test")
    try:
        result, run_id = train_sft_tracked(CONFIG, data, tmp_path / "out", track=track)
        client = mlflow.MlflowClient()
        history = client.get_metric_history(run_id, "loss")
        run = client.get_run(run_id)
        artifacts = {a.path for a in client.list_artifacts(run_id, "adapter")}
    finally:
        mlflow.set_tracking_uri(None)
    assert result.resumed_from_step == 1
    assert sorted(m.step for m in history) == [1, 2]
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx([e["loss"] for e in result.loss_curve])
    assert run.data.params["sft.learning_rate"] == "0.001" and run.data.params["model.name"] == "smollm2-135m-instruct"
    assert run.data.metrics["data.assistant_tokens"] == result.data["assistant_tokens"] > 0
    assert "adapter/adapter_model.safetensors" in artifacts
    [data_input] = run.inputs.dataset_inputs  # the conversations it learned from, by DVC digest
    assert data_input.dataset.digest == dvc_md5(data) and json.loads(data_input.dataset.profile)["num_rows"] == 1
    assert {t.key: t.value for t in data_input.tags}["mlflow.data.context"] == "train"
