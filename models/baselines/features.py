"""Query features shared by the learned baselines: the sentence embedding plus a few surface statistics.

Surface statistics (length, how many numbers, how many sentences) are cheap proxies for difficulty that
an embedding of a 256-token window only partly sees: a GSM8K question with more quantities usually
needs more reasoning steps. They are standardised on the training queries only.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator, Sequence

import numpy as np

from models.base import RoutingData
from models.embeddings import default_encoder

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")
_WORD = re.compile(r"\w+")


def surface_features(texts: Sequence[str]) -> np.ndarray:
    """(n, 6) float32: log chars, log words, numbers, distinct numbers, sentences, max number digits."""
    return np.asarray([surface_row(text) for text in texts], dtype=np.float32).reshape(len(texts), 6)


# Memoised per text: cross-fitting computes a query's statistics once per fold and router (fit,
# transform, score); a 14k-query replay spent ~5 s of every fit re-running these regexes.
@functools.lru_cache(maxsize=1 << 16)
def surface_row(text: str) -> tuple[float, ...]:
    numbers = _NUMBER.findall(text)
    return (
        float(np.log1p(len(text))),
        float(np.log1p(len(_WORD.findall(text)))),
        len(numbers),
        len(set(numbers)),
        len(_SENTENCE_END.findall(text)) or 1,
        max((len(re.sub(r"\D", "", n)) for n in numbers), default=0),
    )


def require_embeddings(data: RoutingData, encoder=None) -> np.ndarray:
    """The (n, d) query embeddings: cached ones from `data`, else computed with `encoder`.

    Without either, the bundled MiniLM encoder is used (its on-disk cache makes repeats free).
    """
    if data.embeddings is not None:
        if len(data.embeddings) != len(data):
            raise ValueError(f"embeddings have {len(data.embeddings)} rows for {len(data)} queries")
        return np.asarray(data.embeddings, dtype=np.float32)
    if encoder is None:
        encoder = default_encoder()
    return encoder.encode(data.queries)


class QueryFeaturizer:
    """embedding ⊕ standardised surface statistics; fit() learns the scaler on training queries only."""

    def __init__(self, use_embedding: bool = True, use_surface: bool = True, encoder=None):
        if not (use_embedding or use_surface):
            raise ValueError("QueryFeaturizer needs at least one feature group")
        self.use_embedding = use_embedding
        self.use_surface = use_surface
        self.encoder = encoder
        self.mean_: np.ndarray | None = None
        self.std_: np.ndarray | None = None

    def fit(self, data: RoutingData) -> "QueryFeaturizer":
        if self.use_surface:
            s = surface_features(data.queries)
            self.mean_, self.std_ = s.mean(axis=0), s.std(axis=0) + 1e-6
        return self

    def transform(self, data: RoutingData) -> np.ndarray:
        parts = []
        if self.use_embedding:
            parts.append(require_embeddings(data, self.encoder))
        if self.use_surface:
            if self.mean_ is None:
                raise RuntimeError("QueryFeaturizer.transform before fit")
            parts.append((surface_features(data.queries) - self.mean_) / self.std_)
        return np.concatenate(parts, axis=1).astype(np.float32)


def is_binary(scores: np.ndarray) -> bool:
    return bool(np.isin(scores, (0.0, 1.0)).all())


def worker_cost_order(costs: np.ndarray) -> np.ndarray:
    """Worker indices from cheapest to dearest by mean cost (a fixed order for cascades and fallbacks)."""
    return np.argsort(costs.mean(axis=0), kind="stable")


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Run BLAS and torch on one thread inside the block, restoring the settings after.

    The baselines' problems are small (a few thousand rows): thread start-up and, on a busy machine,
    oversubscription cost far more than a second core saves (measured 10–100× slower fits on 2 cores).
    """
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        torch.set_num_threads(before)
