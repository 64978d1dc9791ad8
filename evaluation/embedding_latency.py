"""How long the MTRouter history encoder takes to embed one fresh 512-token history (no cache), with the
default frozen encoder and backend: what benchmarks/mtrouter_latency.py and benchmarks/routing_latency.py
report beside their decision latencies."""

from __future__ import annotations

import os
import time

import numpy as np

from models.mtrouter.config import MTRouterConfig

TARGET_EMBED_P99_MS = 60.0
# Embedding one fresh history is a single latency-bound request: it gets both cores of this machine.
EMBED_THREADS = 2
WORDS = "the beaker holds water heat it until it boils then move it to the table and read the thermometer".split()


def percentiles(ms: np.ndarray, target: float) -> dict:
    p99 = float(np.percentile(ms, 99))
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(p99, 3),
            "mean_ms": round(float(ms.mean()), 3), "n": int(len(ms)), "target_p99_ms": target,
            "meets_target": bool(p99 <= target)}


def measure_embedding(n: int, threads: int = EMBED_THREADS) -> dict:
    """Embed n distinct histories truncated to 512 tokens by the encoder's tokenizer (no cache)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)  # the ONNX Runtime session takes its thread count from torch's
    try:
        return {**time_embedding(n), "threads": threads, "load_average_after": [round(x, 2) for x in os.getloadavg()]}
    finally:
        torch.set_num_threads(previous)


def time_embedding(n: int) -> dict:
    from models.mtrouter.history import HistoryEncoder, Interaction, build_text_encoder

    cfg = MTRouterConfig(max_history_tokens=512, disk_cache=False, cache_size=1)
    encoder = HistoryEncoder(build_text_encoder(cfg), cfg)
    long_history = [Interaction(" ".join(WORDS * 3), " ".join(WORDS * 2)) for _ in range(8)]
    texts = [encoder.serialise(f"task {i}: " + " ".join(WORDS), long_history) for i in range(n + 5)]
    tokens = encoder.text_encoder.count_tokens(texts[0])
    for text in texts[:5]:  # warm-up: model load, first-call allocations
        encoder.encode_texts([text])
    ms = np.empty(n)
    for i, text in enumerate(texts[5:]):
        start = time.perf_counter_ns()
        encoder.encode_texts([text])
        ms[i] = (time.perf_counter_ns() - start) / 1e6
    return {**percentiles(ms, TARGET_EMBED_P99_MS), "history_tokens": tokens, "encoder_backend": cfg.encoder_backend,
            "encoder": encoder.text_encoder.encoder_id}
