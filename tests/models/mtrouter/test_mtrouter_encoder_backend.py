"""The history encoder's backends (models.embeddings.ENCODER_BACKENDS) on the real bundled MiniLM:
each stays close to the fp32 torch embeddings, each has its own encoder id (so caches never mix),
and the ONNX export is cached on disk, reused, and rebuilt when the cached file is damaged."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

from models.embeddings import BACKENDS, ENCODER_BACKENDS, SentenceEncoder, bundled_minilm_path, onnx_export_path
from models.mtrouter.config import MTRouterConfig
from models.mtrouter.history import SentenceTextEncoder, build_text_encoder
from routerops.errors import InputError

TEXTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
    "[Task]\nBoil water.\n[Turn 1]\nAgent: look around\nObservation: You see a stove, a pot and a sink. " * 6,
    "ok",
]
@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("routerops-cache")


@pytest.fixture(scope="module")
def reference():
    """fp32 torch vectors: the backends' ground truth."""
    return SentenceEncoder(use_cache=False, max_seq_length=512).encode(TEXTS)


def test_encoder_ids_differ_per_backend_and_torch_keeps_its_old_id():
    ids = {b: SentenceTextEncoder(max_tokens=512, bf16=False, backend=b).encoder_id for b in ENCODER_BACKENDS}
    assert len(set(ids.values())) == len(ENCODER_BACKENDS)
    assert ids["torch"] == "sentence-transformers/all-MiniLM-L6-v2|max_seq=512"  # caches written before backends
    assert ids["onnx-int8"].startswith("sentence-transformers/all-MiniLM-L6-v2|onnx-int8@3")  # 7-bit weights


def test_unknown_backend_is_rejected():
    with pytest.raises(InputError, match="encoder_backend"):
        MTRouterConfig(encoder_backend="tensorrt").validate()
    with pytest.raises(InputError, match="backend"):
        SentenceEncoder(use_cache=False, backend="tensorrt")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnx", "onnx-int8", "torch-int8"])
def test_backend_embeddings_stay_close_to_torch_fp32(backend, reference, cache_dir):
    with warnings.catch_warnings(record=True) as raised:  # the first onnx backend exports the graph here
        warnings.simplefilter("always")
        vecs = SentenceEncoder(cache_dir=cache_dir, use_cache=False, backend=backend, max_seq_length=512).encode(TEXTS)
    # No tracer warnings about Python values traced as constants (issue 40: three in `make demo`'s output).
    assert not [w for w in raised if w.category.__name__ == "TracerWarning"], [str(w.message) for w in raised]
    assert vecs.shape == reference.shape and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    cosine = (vecs * reference).sum(axis=1)
    # The tolerance is the backend's documented guarantee (models.embeddings.BACKENDS), the same on
    # AVX2-only and VNNI CPUs, not a number tuned on one machine.
    assert cosine.min() >= BACKENDS[backend].min_cosine, cosine


@pytest.mark.slow
def test_router_encoder_uses_the_configured_backend(cache_dir, monkeypatch):
    monkeypatch.setenv("ROUTEROPS_CACHE_DIR", str(cache_dir))
    cfg = MTRouterConfig(encoder_kind="sentence", max_history_tokens=512, disk_cache=False)
    encoder = build_text_encoder(cfg)
    assert cfg.encoder_backend in encoder.encoder_id and not encoder.bf16
    vecs = encoder.encode(TEXTS[:2])
    assert vecs.shape == (2, encoder.dim) == (2, 384)
    # int8 activations are quantised per call: each text is embedded alone, so batching a short
    # text with a long one does not change its vector
    assert np.array_equal(encoder.encode(TEXTS[3:4])[0], encoder.encode(TEXTS[2:4])[1])


@pytest.mark.slow
def test_export_is_cached_and_a_damaged_file_is_rebuilt(cache_dir, caplog):
    root = cache_dir / "onnx"
    path = onnx_export_path(bundled_minilm_path(), int8=True, cache_root=root)
    before = path.stat()
    again = onnx_export_path(bundled_minilm_path(), int8=True, cache_root=root)
    assert again == path and (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a partial file, as an interrupted copy would leave
    with caplog.at_level(logging.WARNING):
        rebuilt = onnx_export_path(bundled_minilm_path(), int8=True, cache_root=root)
    # Quantised again, without ONNX Runtime's static-quantisation hint on the root logger (issue 26).
    assert not [r for r in caplog.records if "pre-processing before quantization" in r.getMessage()]
    assert rebuilt == path and path.stat().st_size == before.st_size
    assert path.with_name(path.name + ".sha256").is_file()
    assert not list(path.parent.glob("*.tmp*"))  # no temporary files left behind

    path.with_name(path.name + ".sha256").unlink()  # no checksum: not trusted, rebuilt
    onnx_export_path(bundled_minilm_path(), int8=True, cache_root=root)
    assert path.with_name(path.name + ".sha256").is_file()
    vecs = SentenceEncoder(cache_dir=cache_dir, use_cache=False, backend="onnx-int8", max_seq_length=512).encode(TEXTS)
    assert np.isfinite(vecs).all()
