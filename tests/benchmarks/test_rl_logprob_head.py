"""benchmarks/rl_logprob_head.py at a tiny shape: both paths run through the real sequence_logprobs on
one model and give the same log-probs (no timing is asserted)."""

from __future__ import annotations


import torch

def test_the_two_heads_score_the_same_controller_tokens(bench):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40_001, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128))
    data = bench.batch(2, 100, bench.TURNS)
    assert int(data.mask.sum()) == 2 * (6 + 6 + 4)  # the turns' spans at 100 tokens
    fast = bench.rl.sequence_logprobs(model, data, 0.7)
    full = bench.rl.sequence_logprobs(bench.FullHead(model), data, 0.7)
    assert torch.allclose(fast, full, atol=1e-5) and bool((fast[data.mask.bool()] < 0).all())
    times = bench.timed(model, data)
    assert set(times) == {"update_s", "reference_s"}
