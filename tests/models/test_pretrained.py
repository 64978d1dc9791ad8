"""Concurrent model loads in one process leave weight tying working (models/pretrained.py).

Without the lock, four threads entering `from_pretrained` together leave transformers'
`PreTrainedModel.tie_weights` replaced by its loading-time no-op, and every later load of a
tied-embedding model has `lm_head` on the meta device: this test failed that way first.
"""

from __future__ import annotations

import threading

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from models.orchestrator.lm import load_causal_lm


def tied_llama_folder(tmp_path):
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    return tmp_path


def test_loads_in_threads_leave_tying_on_for_the_next_load(tmp_path):
    folder = tied_llama_folder(tmp_path)
    tie_weights = PreTrainedModel.tie_weights
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def load() -> None:
        start.wait()
        try:
            load_causal_lm(folder, "float32", "cpu")
        except BaseException as exc:  # noqa: BLE001 - reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert not errors
    assert PreTrainedModel.tie_weights is tie_weights
    model = load_causal_lm(folder, "float32", "cpu")
    assert model.lm_head.weight.device == torch.device("cpu")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
