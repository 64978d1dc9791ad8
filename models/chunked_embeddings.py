"""Whole-query vectors from a windowed encoder: cut the query into consecutive windows of the
encoder's token budget, embed each window, mean-pool, L2-normalise (issue 28, item 2).

The shared encoder keeps the first 128 tokens (models.embeddings.DEFAULT_MAX_SEQ). The nine-model
table's queries are long (13 % exceed 600 characters) and often ask their question at the end (a
logic puzzle's clues, then "What is the number of the house where ..."), which a head window never
reads. Chunk pooling sees every token at the window's cost per chunk, and keeps serving's
exact-vector guarantee: windows are cut at tokenizer offsets of the text alone, each window's
vector is the base encoder's (a function of that window's text: int8 backends embed one text per
call), so a query's vector depends on nothing but its text.

Mean pooling of windows follows the long-document practice of sentence-transformers' documentation
("Input Sequence Length": split and average) and of passage aggregation in dense retrieval
(e.g. Dai & Callan, SIGIR 2019, "FirstP / MaxP / SumP" over passages).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from models.embeddings import DEFAULT_MAX_SEQ, SentenceEncoder, bundled_minilm_path, default_encoder

SPECIAL_TOKENS = 2  # [CLS] and [SEP] take two of the window's positions


@functools.lru_cache(maxsize=1)
def _tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


class ChunkPooledEncoder:
    """encode(texts) → (n, d) float32 unit vectors: the mean of the base encoder's vectors of each
    text's windows (`window` tokens each, the last one shorter), at most `max_windows` per text
    (then the windows are the first max_windows − 1 and the last, so the question at the end is kept).
    """

    def __init__(self, base: SentenceEncoder | None = None, window: int = DEFAULT_MAX_SEQ, max_windows: int = 8):
        self.base = base or default_encoder()
        self.window = int(window)
        self.max_windows = int(max_windows)
        if self.window <= SPECIAL_TOKENS or self.max_windows < 1:
            raise ValueError(f"window must exceed {SPECIAL_TOKENS} tokens and max_windows ≥ 1")
        self.cache_id = f"{self.base.cache_id}|chunk-mean={self.window}x{self.max_windows}"
        self.model_path = getattr(self.base, "model_path", None)

    def windows(self, text: str) -> list[str]:
        """The text's consecutive windows, cut at token boundaries (character offsets of the text)."""
        tok = _tokenizer(str(self.model_path or bundled_minilm_path()))
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
        step = self.window - SPECIAL_TOKENS
        if len(offsets) <= step:
            return [text]
        spans = [(offsets[i][0], offsets[min(i + step, len(offsets)) - 1][1]) for i in range(0, len(offsets), step)]
        if len(spans) > self.max_windows:
            spans = spans[: self.max_windows - 1] + spans[-1:]
        return [text[a:b] for a, b in spans]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        pieces = [self.windows(str(t)) for t in texts]
        flat = [w for ws in pieces for w in ws]
        vectors = self.base.encode(flat)  # every window through the base encoder's caches
        out, start = [], 0
        for ws in pieces:
            v = vectors[start : start + len(ws)].mean(axis=0)
            out.append(v / max(float(np.linalg.norm(v)), 1e-12))
            start += len(ws)
        return np.asarray(out, dtype=np.float32)
