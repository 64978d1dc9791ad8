"""How a sentence-encoder backend computes its vectors: what each backend guarantees (`BACKENDS`),
torch-int8's dynamic quantisation, and the ONNX Runtime backend (a cached, verified ONNX export of
the sentence-transformers model, optionally int8, and the session that runs it).

models/embeddings.py's `SentenceEncoder` chooses a backend and caches the vectors; everything here is
importable from there too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.pretrained import one_load_at_a_time

# Bump when the fp32 export recipe changes: it is in the export cache key and, through
# BackendSpec.recipe, in the model id of non-torch backends, so neither old exports nor old vectors
# are reused.
BACKEND_RECIPE = 2


@dataclass(frozen=True)
class BackendSpec:
    """What a backend guarantees, measured rather than assumed (experiments/encoder_fidelity.py).

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
    # experiments/encoder_fidelity.py); pre-processing would change the vectors the caches hold.
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
