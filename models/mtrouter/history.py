"""History serialisation, token-budget truncation and the frozen history encoder φ (MTRouter §3.2).

    h_t = [q, ⟨u_0, o_1⟩, …, ⟨u_{t−1}, o_t⟩]                                       (eq. 2)

The task block q is always kept; the most recent interaction context fills the remaining token
budget and the oldest context is dropped first (the boundary pair keeps its most recent tokens).
Tokens are counted with the encoder's own tokenizer. Embeddings are cached by a content hash of
(encoder id, serialised text), so a history seen before — the same task at turn 0 across every
candidate, or a replayed trajectory — is never embedded twice.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from models.embeddings import EmbeddingCache, SentenceEncoder, bundled_minilm_path, default_cache_dir
from models.mtrouter.config import MTRouterConfig

TASK_HEADER = "[Task]\n"
SPECIAL_TOKENS = 2  # [CLS] … [SEP] (or <s> … </s>) the encoder adds around the text


@dataclass(frozen=True)
class Interaction:
    """⟨u_i, o_{i+1}⟩: what the selected model did at turn i and what the environment showed next."""

    action: str
    observation: str = ""


class TextEncoder(Protocol):
    """A frozen text encoder: a stable id, its width, token counting and a batch encode."""

    encoder_id: str
    dim: int
    max_tokens: int

    def count_tokens(self, text: str) -> int: ...

    def tail(self, text: str, n_tokens: int) -> str:
        """The shortest suffix of `text` holding its last `n_tokens` tokens."""
        ...

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


# ---------------------------------------------------------------- serialisation and truncation


def task_block(task: str) -> str:
    return TASK_HEADER + task.strip()


def pair_block(index: int, interaction: Interaction) -> str:
    """One ⟨u_i, o_{i+1}⟩ of eq. 2, numbered so the encoder sees the order of turns."""
    return f"[Turn {index + 1}] Action: {interaction.action.strip()}\nObservation: {interaction.observation.strip()}"


def select_interactions(interactions: Sequence[Interaction], mode: str) -> list[tuple[int, Interaction]]:
    """Which pairs the router may see: all (eq. 2), the latest only, or none (Table 4 ablations)."""
    numbered = list(enumerate(interactions))
    if mode == "full":
        return numbered
    if mode == "current_turn":
        return numbered[-1:]
    if mode == "query_only":
        return []
    raise ValueError(f"unknown history mode {mode!r}")


def truncate_history(task: str, blocks: Sequence[str], budget: int, encoder: TextEncoder) -> str:
    """Task block + the newest blocks that fit `budget` tokens; oldest context is cut first (§3.2).

    The task block is kept whole even when it alone exceeds the budget; the context then gets no
    room, and the encoder's own length limit cuts the task's end, never its start.
    """
    head = task_block(task)
    room = budget - encoder.count_tokens(head)
    kept: list[str] = []
    for block in reversed(blocks):  # newest first
        if room <= 0:
            break
        cost = encoder.count_tokens(block) + 1  # + the newline that joins it
        if cost <= room:
            kept.append(block)
            room -= cost
        else:
            kept.append(encoder.tail(block, room - 1))  # the boundary pair keeps its newest tokens
            break
    return "\n".join([head, *reversed([k for k in kept if k])])


def serialise_history(task: str, interactions: Sequence[Interaction], encoder: TextEncoder,
                      cfg: MTRouterConfig, mode: str | None = None) -> str:
    """The text φ embeds for h_t under the history mode (default cfg's) and the token budget."""
    blocks = [pair_block(i, it) for i, it in select_interactions(interactions, mode or cfg.history_mode)]
    budget = min(cfg.max_history_tokens, encoder.max_tokens) - SPECIAL_TOKENS
    return truncate_history(task, blocks, budget, encoder)


# ---------------------------------------------------------------- interactions from logged turns


def observation_from_message(message: str) -> str:
    """The last user message of a chat payload, or the raw text for tool payloads: the task block q
    of a turn-0 request, and the fallback observation for turn rows logged without an `observation`
    (before turns schema v2 the observation o_i reached the log only inside turn i's request)."""
    try:
        payload = json.loads(message)
    except (json.JSONDecodeError, TypeError):
        return str(message or "")
    if isinstance(payload, list):
        users = [m.get("content", "") for m in payload if isinstance(m, Mapping) and m.get("role") == "user"]
        return str(users[-1]) if users else ""
    return str(message)


def _field(turn: Any, name: str, default: Any = None) -> Any:
    if isinstance(turn, Mapping):
        return turn.get(name, default)
    return getattr(turn, name, default)


def interactions_from_turns(turns: Sequence[Any], current_observation: str | None = None) -> list[Interaction]:
    """⟨u_i, o_{i+1}⟩ for the turns before t, from TurnRecords or turns-table rows.

    u_i is turn i's response. o_{i+1} is turn i's logged `observation` (turns schema v2): what
    env.observe returned after the reply, the text EpisodeState.observation holds at routing time,
    so training and routing see the same h_t (eq. 2). A logged string is authoritative, "" included:
    - "" means the environment said nothing. In QA that is the truth (turn i+1's request repeats
      the task with a summary of earlier replies: no observation), as after a failed call.
    - Version-1 tables read through routerops.schema carry "" (never logged). Parsing the next
      request instead would put ScienceWorld's whole templated prompt (task, earlier steps, score)
      where o_{i+1} belongs: a history the router never sees at routing time.
    Only turns without the field (None, NaN, rows built without the column) fall back to the last
    user message of turn i+1's request, and the latest such turn to `current_observation`.
    """
    pairs = []
    for i, turn in enumerate(turns):
        logged = _field(turn, "observation")
        if isinstance(logged, str):
            observation = logged
        elif i + 1 < len(turns):
            observation = observation_from_message(_field(turns[i + 1], "message"))
        else:
            observation = current_observation or ""
        pairs.append(Interaction(str(_field(turn, "response") or ""), observation))
    return pairs


# ---------------------------------------------------------------- frozen encoders


class SentenceTextEncoder:
    """A sentence-transformers model (default: the bundled all-MiniLM-L6-v2) via models.embeddings.

    The tokenizer loads at once (truncation counts tokens); the model only on the first cache miss.
    """

    def __init__(self, model_path: str = "", max_tokens: int = 8192, device: str = "cpu", bf16: bool = True,
                 backend: str = "torch"):
        from transformers import AutoConfig, AutoTokenizer

        path = str(model_path or bundled_minilm_path())
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        limit = int(getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", 512))
        self.max_tokens = min(int(max_tokens), limit)
        # No disk cache in SentenceEncoder: its key ignores the sequence length we raise here, so a
        # text embedded elsewhere at 256 tokens could be served for a 512-token request.
        self._sentence = SentenceEncoder(model_path or None, use_cache=False, device=device, backend=backend,
                                         max_seq_length=self.max_tokens)
        # bf16 autocast applies to the fp32 torch backend only (int8 / ONNX graphs ignore it).
        self.bf16 = bf16 and backend == "torch" and device == "cpu" and cpu_has_native_bf16()
        # The backend is in the model id (SentenceEncoder), so embedding caches never mix backends.
        self.encoder_id = f"{self._sentence.model_id}|max_seq={self.max_tokens}" + ("|bf16" if self.bf16 else "")
        self._dim: int | None = None

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self._sentence.dim)
        return self._dim

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def tail(self, text: str, n_tokens: int) -> str:
        if n_tokens <= 0:
            return ""
        offsets = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        return text if len(offsets) <= n_tokens else text[offsets[-n_tokens][0]:]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            return np.asarray(self._sentence.encode(list(texts)), dtype=np.float32)


def cpu_has_native_bf16() -> bool:
    """bf16 matmuls run natively (AVX512-BF16 / AMX): MiniLM then embeds a 512-token history ~1.6×
    faster, with cosine 0.99997 to the fp32 vectors. Elsewhere bf16 would be emulated, and slower."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


_TOKEN = re.compile(r"\w+|[^\w\s]")


class HashingTextEncoder:
    """sklearn HashingVectorizer over word/punctuation 1-2-grams: frozen, instant, no weights.

    Beside the sentence encoder in the default "sentence+hashing" φ; alone, for fast unit tests.
    """

    def __init__(self, dim: int = 256, max_tokens: int = 8192):
        from sklearn.feature_extraction.text import HashingVectorizer

        self.dim = int(dim)
        self.max_tokens = int(max_tokens)
        self.encoder_id = f"hashing|dim={self.dim}"
        self._vectorizer = HashingVectorizer(n_features=self.dim, token_pattern=None, tokenizer=_TOKEN.findall,
                                             lowercase=True, ngram_range=(1, 2), norm="l2", alternate_sign=True)

    def count_tokens(self, text: str) -> int:
        return len(_TOKEN.findall(text))

    def tail(self, text: str, n_tokens: int) -> str:
        if n_tokens <= 0:
            return ""
        starts = [m.start() for m in _TOKEN.finditer(text)]
        return text if len(starts) <= n_tokens else text[starts[-n_tokens]:]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self._vectorizer.transform(list(texts)).toarray().astype(np.float32)


class ConcatTextEncoder:
    """[φ_1(h); φ_2(h)]: e.g. a sentence embedding (meaning) beside hashed n-grams (the literal
    quantities and operators that signal how many steps a task takes). Tokens are counted, and the
    budget set, by the first encoder, so both see the same truncated text."""

    def __init__(self, *encoders: TextEncoder):
        self.encoders = encoders
        self.encoder_id = "+".join(e.encoder_id for e in encoders)
        self.max_tokens = encoders[0].max_tokens

    @property
    def dim(self) -> int:
        return sum(int(e.dim) for e in self.encoders)

    def count_tokens(self, text: str) -> int:
        return self.encoders[0].count_tokens(text)

    def tail(self, text: str, n_tokens: int) -> str:
        return self.encoders[0].tail(text, n_tokens)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.concatenate([np.asarray(e.encode(texts), dtype=np.float32) for e in self.encoders], axis=1)


def build_text_encoder(cfg: MTRouterConfig, device: str = "cpu") -> TextEncoder:
    if cfg.encoder_kind == "hashing":
        return HashingTextEncoder(cfg.hashing_dim, cfg.max_history_tokens)
    backend = cfg.encoder_backend if device == "cpu" else "torch"  # ONNX / int8 graphs are CPU-only
    sentence = SentenceTextEncoder(cfg.encoder_path, cfg.max_history_tokens, device, cfg.encoder_bf16, backend)
    if cfg.encoder_kind == "sentence":
        return sentence
    return ConcatTextEncoder(sentence, HashingTextEncoder(cfg.hashing_dim, sentence.max_tokens))


# ---------------------------------------------------------------- history encoder with a content-hash cache


class HistoryEncoder:
    """z_x = φ(h_t): serialise, truncate, embed — each distinct text embedded once.

    Two cache levels keyed by sha256(encoder id, text): an in-memory LRU (routing latency) and,
    when `disk_cache_dir` is given, a SQLite file shared by runs and processes (cross-fitting
    builds a fresh router per fold; none of them re-embeds a text another has seen).
    """

    def __init__(self, text_encoder: TextEncoder, cfg: MTRouterConfig, disk_cache_dir: str | Path | None = None):
        self.text_encoder = text_encoder
        self.cfg = cfg
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._disk = None
        if disk_cache_dir is not None:
            self._disk = EmbeddingCache(Path(disk_cache_dir) / "mtrouter_histories.sqlite")
        self.hits = 0
        self.misses = 0

    @property
    def dim(self) -> int:
        return int(self.text_encoder.dim)

    def serialise(self, task: str, interactions: Sequence[Interaction] = (), mode: str | None = None) -> str:
        """`mode` overrides the encoder's history mode: routers sharing one encoder (and its cache)
        may differ in what they let the router see (Table 4's history ablations)."""
        return serialise_history(task, interactions, self.text_encoder, self.cfg, mode)

    def content_key(self, text: str) -> str:
        return hashlib.sha256(f"{self.text_encoder.encoder_id}\x00{text}".encode()).hexdigest()

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) float32 embeddings of already-serialised texts, through the caches."""
        keys = [self.content_key(t) for t in texts]
        found = {k: self._cache[k] for k in keys if k in self._cache}
        self.hits += sum(1 for k in keys if k in found)
        missing = list(dict.fromkeys(k for k in keys if k not in found))
        if missing and self._disk is not None:
            found.update(self._disk.get_many(missing))
            missing = [k for k in missing if k not in found]
        self.misses += len(missing)
        if missing:
            text_of = dict(zip(keys, texts))
            fresh = np.asarray(self.text_encoder.encode([text_of[k] for k in missing]), dtype=np.float32)
            new = dict(zip(missing, fresh))
            if self._disk is not None:
                self._disk.put_many(new)
            found.update(new)
        for key in dict.fromkeys(keys):
            self._remember(key, found[key])
        return np.stack([found[k] for k in keys]).astype(np.float32, copy=False)

    def encode(self, task: str, interactions: Sequence[Interaction] = ()) -> np.ndarray:
        """(d,) embedding of one history."""
        return self.encode_texts([self.serialise(task, interactions)])[0]

    def _remember(self, key: str, vec: np.ndarray) -> None:
        self._cache[key] = vec
        self._cache.move_to_end(key)
        while len(self._cache) > self.cfg.cache_size:
            self._cache.popitem(last=False)


def build_history_encoder(cfg: MTRouterConfig, text_encoder: TextEncoder | None = None,
                          device: str = "cpu") -> HistoryEncoder:
    """The configured encoder; sentence encoders persist embeddings under models.embeddings'
    cache directory ($ROUTEROPS_CACHE_DIR) when cfg.disk_cache is on."""
    text_encoder = text_encoder or build_text_encoder(cfg, device)
    return HistoryEncoder(text_encoder, cfg, default_cache_dir() if cfg.disk_cache else None)
