"""Outcome estimators that read the whole query's words as well as its sentence vector (issue 28).

The shared MiniLM vector reads a 128-token window and smooths a query into one point; on LLMRouter's
nine-model table many queries are templated tasks (logic grids, multiple choice, code, maths) whose
type and size show in their words, digits and symbols, across the whole text. So:

- `LexicalFeaturizer`: TF-IDF of word 1–2-grams and of character 2–5-grams inside word boundaries
  (sublinear tf, each block L2-normalised; they see every token of the query, whatever its length),
  ⊕ the MiniLM vector (unit norm) ⊕ standardised surface statistics and markers of code, maths,
  multiple-choice options, questions and layout, scaled by 1/√d so that block, like the others, has
  about unit norm and one C regularises all four alike. Character n-grams follow the text-
  classification practice of Joachims 1998 / Cavnar & Trenkle 1994 (robust to numbers, symbols and
  inflection); TF-IDF with sublinear tf is Salton & Buckley 1988.
- `LexicalLogisticRouter`: one L2 logistic regression per worker on those features (RouterBench's
  predictive router, Hu et al. 2024, arXiv 2403.12031, with richer inputs); quality = P̂(correct),
  routed by the shared expected-utility rule q̂ − λ·c (models/base.py). C = 0.3 was chosen on the
  *validation* split of the nine-model table among {0.03, 0.1, 0.3, 1, 3, 10} (fitted on train; see
  docs/routers/many-workers.md): inner-fold log loss on train picked C ≈ 0.01 for most workers and
  routed worse on validation, so the default is the validation choice, not an inner-CV one.
- `LexicalKNNRouter`: RouterBench's kNN router on cosine similarity of those TF-IDF vectors (word ⊕
  character, renormalised) instead of the sentence vectors, k by the same leave-one-out Brier score
  on the training queries as `models.baselines.knn.KNNRouter`.

Serving computes the same features from the request's text and its (exactly reproduced) MiniLM
vector; the fitted vectorisers travel with the router.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from scipy import sparse
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import normalize

from models.base import Router, RoutingData
from models.baselines.features import require_embeddings, single_threaded, surface_features
from models.baselines.knn import DEFAULT_K_GRID, KNNRouter
from models.baselines.linear import TFIDF_MAX_FEATURES, LinearOutcome, word_ngrams

# Cheap markers of what kind of task a query is, counted over the whole text (log1p of the count).
MARKERS = {
    "code": re.compile(r"```|\bdef |\breturn\b|[{};]\s*$|\bimport\b", re.MULTILINE),
    "math": re.compile(r"\\[a-zA-Z]+|\$|\^|=|\\frac"),
    "options": re.compile(r"(?:^|\s)\(?[A-E]\)|^[A-E][.:]\s", re.MULTILINE),
    "questions": re.compile(r"\?"),
    "lines": re.compile(r"\n"),
}
CHAR_MAX_FEATURES = 1 << 17


def marker_features(texts: Sequence[str]) -> np.ndarray:
    """(n, 7) float: log1p counts of each MARKERS pattern, then the share of digits and of capitals."""
    rows = []
    for text in texts:
        size = max(len(text), 1)
        rows.append([np.log1p(len(p.findall(text))) for p in MARKERS.values()]
                    + [sum(c.isdigit() for c in text) / size, sum(c.isupper() for c in text) / size])
    return np.asarray(rows, dtype=float).reshape(len(texts), len(MARKERS) + 2)


class LexicalFeaturizer:
    """word TF-IDF ⊕ character TF-IDF ⊕ sentence vector ⊕ scaled surface statistics and markers, as
    one sparse matrix; every statistic (vocabularies, idf, means, deviations) is fitted on the
    training queries only."""

    def __init__(self, use_embedding: bool = True, encoder=None, min_df: int = 2):
        self.use_embedding, self.encoder, self.min_df = use_embedding, encoder, min_df
        self.word_: TfidfVectorizer | None = None

    def fit(self, data: RoutingData) -> "LexicalFeaturizer":
        if len(data) < 2:
            raise ValueError(f"LexicalFeaturizer needs at least two training queries, got {len(data)}")
        # min_df counts documents: on a tiny table allow singletons, else rare n-grams fit noise.
        min_df = self.min_df if len(data) >= 10 * self.min_df else 1
        self.word_ = TfidfVectorizer(analyzer=word_ngrams, min_df=min_df, sublinear_tf=True,
                                     max_features=TFIDF_MAX_FEATURES).fit(data.queries)
        self.char_ = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), min_df=min_df, sublinear_tf=True,
                                     max_features=CHAR_MAX_FEATURES).fit(data.queries)
        stats = self.stats(data.queries)
        self.mean_, self.std_ = stats.mean(axis=0), stats.std(axis=0) + 1e-6
        return self

    @staticmethod
    def stats(texts: Sequence[str]) -> np.ndarray:
        return np.hstack([surface_features(texts).astype(float), marker_features(texts)])

    def text_vectors(self, texts: Sequence[str]) -> sparse.csr_matrix:
        """(n, V) word ⊕ character TF-IDF, each block unit norm (the lexical part alone)."""
        if self.word_ is None:
            raise RuntimeError("LexicalFeaturizer.transform before fit")
        return sparse.hstack([self.word_.transform(texts), self.char_.transform(texts)]).tocsr()

    def transform(self, data: RoutingData) -> sparse.csr_matrix:
        parts = [self.text_vectors(data.queries)]
        if self.use_embedding:
            emb = np.asarray(require_embeddings(data, self.encoder), dtype=float)
            parts.append(sparse.csr_matrix(normalize(emb)))
        stats = (self.stats(data.queries) - self.mean_) / self.std_
        parts.append(sparse.csr_matrix(stats / np.sqrt(stats.shape[1])))
        return sparse.hstack(parts).tocsr()


class LexicalLogisticRouter(Router):
    """Per-worker L2 logistic regression on `LexicalFeaturizer` features; quality = P̂(correct)."""

    name = "lexical"

    def __init__(self, C: float = 0.3, use_embedding: bool = True, seed: int = 0, encoder=None):
        if not C > 0:
            raise ValueError(f"C must be > 0, got {C}")
        self.C, self.seed = C, seed
        self.featurizer = LexicalFeaturizer(use_embedding=use_embedding, encoder=encoder)
        self.models_: list[LinearOutcome] | None = None

    def fit(self, data: RoutingData) -> "LexicalLogisticRouter":
        self.featurizer.fit(data)
        x = self.featurizer.transform(data)
        scores = np.asarray(data.scores, dtype=float)
        self.models_ = [self.fit_worker(x, scores[:, j]) for j in range(scores.shape[1])]
        return self

    def fit_worker(self, x: sparse.csr_matrix, y: np.ndarray) -> LinearOutcome:
        keep = ~np.isnan(y)
        labels = (y[keep] > 0.5).astype(int)
        if len(np.unique(labels)) < 2:  # always right (or wrong, or never logged) on train: the base rate
            rate = float(labels.mean()) if len(labels) else 0.5
            return LinearOutcome(np.zeros(x.shape[1]), rate, logistic=False)
        model = LogisticRegression(C=self.C, max_iter=3000, random_state=self.seed)
        with single_threaded():
            model.fit(x[keep], labels)
        return LinearOutcome(model.coef_.ravel().astype(float), float(model.intercept_[0]), logistic=True)

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.models_ is None:
            raise RuntimeError("LexicalLogisticRouter.predict_quality before fit")
        x = self.featurizer.transform(data)
        return np.stack([m(x) for m in self.models_], axis=1)


class LexicalKNNRouter(KNNRouter):
    """Mean score of the k training queries nearest in TF-IDF cosine (word ⊕ character n-grams)."""

    name = "knn_lexical"

    def __init__(self, k: int | None = None, k_grid: Sequence[int] = DEFAULT_K_GRID):
        super().__init__(k=k, k_grid=k_grid)
        self.featurizer = LexicalFeaturizer(use_embedding=False)

    def _unit(self, texts: Sequence[str]) -> sparse.csr_matrix:
        return normalize(self.featurizer.text_vectors(texts))

    def fit(self, data: RoutingData) -> "LexicalKNNRouter":
        if len(data) < 2:
            raise ValueError("LexicalKNNRouter needs at least two training queries")
        self.featurizer.fit(data)
        self.scores_ = np.nan_to_num(np.asarray(data.scores, dtype=float), nan=np.nanmean(data.scores))
        self.unit_train_ = self._unit(data.queries)
        self.k_ = min(self.k, len(data)) if self.k else self._tune_k()
        return self

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.k_ is None:
            raise RuntimeError("LexicalKNNRouter.predict_quality before fit")
        return self.scores_[self.top_k(self._unit(data.queries), self.k_)].mean(axis=1)

    def top_k(self, unit, k: int) -> np.ndarray:
        """KNNRouter's neighbour search on sparse rows: the same block-wise product (densified per
        block), partial sort and tie order (most similar first, ties to the lower index)."""
        unit = sparse.csr_matrix(unit)
        out = np.empty((unit.shape[0], k), dtype=np.int64)
        n_train = self.unit_train_.shape[0]
        for start in range(0, unit.shape[0], self.CHUNK):
            similarity = (unit[start : start + self.CHUNK] @ self.unit_train_.T).toarray()
            top = np.argpartition(-similarity, k - 1, axis=1)[:, :k] if k < n_train else \
                np.broadcast_to(np.arange(n_train), similarity.shape).copy()
            rank = np.lexsort((top, -np.take_along_axis(similarity, top, axis=1)), axis=1)
            out[start : start + self.CHUNK] = np.take_along_axis(top, rank, axis=1)
        return out
