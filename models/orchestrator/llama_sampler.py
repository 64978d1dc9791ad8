"""The RL stage's rollouts through llama.cpp (orchestra.controller.engine: llama_cpp): the policy's LoRA
adapter written as a GGUF adapter after every update and applied by llama.cpp on a float32 copy of the
base GGUF, G rows decoded as one batch, in an engine process of its own (models/orchestrator/
llama_engine.py, which says why a process).

Why (issue 23; `benchmarks/rl_step.py` measures it beside the torch sampler and TRL): a decode step of
SmolLM2-135M at G = 4 is bound by reading the weights. Torch's float32 matmuls on two cores take
~0.1 s per step (FastSampler, models/orchestrator/sampler.py); llama.cpp's kernels take ~0.02 s for
the same float32 weights.

Same numbers as the trainer (the ratio of 004 eq. 7 / App. B.3 compares the distribution the tokens
were drawn from):
- **the same base weights**: the GGUF the trainer's transformers folder was dequantised from
  (models/orchestrator/lm.py: `base_model_folder`), re-written once by llama.cpp's own quantiser as
  ALL_F32, not decoded from Q4_1 with 8-bit activations;
- **the same adapter**: every LoRA pair of the policy's active adapter, with PEFT's scaling folded
  into B (so llama.cpp's scale is 1 whatever convention, α/r or rsLoRA, the adapter uses), written
  with the `gguf` package. The GGUF stores q and k rows in llama.cpp's rotary order, which
  transformers' GGUF loader undoes (`reverse_permute`); B's rows of q_proj and k_proj are permuted
  the same way so that B·A lands on the rows it trained;
- **float32 keys and values** in the KV cache (llama.cpp's default is float16), and attention without
  the flash kernel (on a CPU it rounds the query to float16);
- tokens drawn, and their log-probabilities taken, from softmax(logits / T) over the top-p nucleus,
  as FastSampler does (numpy there, torch here; tests hold the two equal).

What is left is float32 rounding in another order, bounded in tests/models/orchestrator/
test_llama_sampler.py. The trainer still recomputes the old log-probs (RolloutBatch: ρ = 1 exactly at
the update of a synchronous loop); the sampler's measure the drift and weigh it (RLSettings.tis_cap).

`weights="f16"` (RLSettings.rollout_weights) trades that exactness for speed: float16 base weights,
which llama.cpp multiplies with float16-rounded activations, ~1.4x the tokens/s and ~1.5e-3 nats a
token from the trainer on average (experiments/llama_engine_precision.py; the test bounds it too). The
update then corrects the sampling distribution's drift with truncated importance weights."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.orchestrator.config import GenerationSettings
from models.orchestrator.lm import LMController, eos_token_ids, turn_length
from models.orchestrator.sampler import FastSampler, active_adapter, base_of
from routerops.errors import InputError
from routerops.orchestra.controller import ControllerTurn, Message

# Projection of a transformers Llama layer -> llama.cpp's tensor name inside block i.
LLAMA_TENSORS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}


def rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q/k projection (or of its LoRA B) in the order llama.cpp's GGUF stores them: within each
    head, the two rotary halves interleaved (the inverse of transformers' GGUF `reverse_permute`)."""
    per = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, per, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def lora_tensors(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """llama.cpp's LoRA tensors (`blk.i.<name>.weight.lora_a|lora_b`) of `model`'s active adapter:
    A as trained, B times PEFT's scaling (so the adapter's own scale is 1), q/k rows in rotary order."""
    from peft.tuners.lora import LoraLayer

    adapter = active_adapter(model)
    config = base_of(model).config
    heads = {"attn_q": config.num_attention_heads,
             "attn_k": getattr(config, "num_key_value_heads", None) or config.num_attention_heads}
    tensors: dict[str, np.ndarray] = {}
    for name, module in base_of(model).named_modules():
        if not isinstance(module, LoraLayer) or adapter not in module.lora_A:
            continue
        parts = name.split(".")
        if "layers" not in parts:
            raise InputError(name, "<adapter>", "LoRA outside the decoder layers has no llama.cpp adapter tensor")
        block = int(parts[parts.index("layers") + 1])
        projection = ".".join(parts[parts.index("layers") + 2:])
        if projection not in LLAMA_TENSORS:
            raise InputError(name, "<adapter>", f"LoRA on {projection!r} is not one of {sorted(LLAMA_TENSORS)}")
        if module.use_dora.get(adapter, False):
            raise InputError(name, "<adapter>", "DoRA adapters have no llama.cpp form")
        target = LLAMA_TENSORS[projection]
        a = module.lora_A[adapter].weight.detach().float().cpu().numpy()
        b = (module.lora_B[adapter].weight.detach().float() * module.scaling[adapter]).cpu().numpy()
        if target in heads:
            b = rotary_rows(b, heads[target])
        tensors[f"blk.{block}.{target}.weight.lora_a"] = np.ascontiguousarray(a)
        tensors[f"blk.{block}.{target}.weight.lora_b"] = np.ascontiguousarray(b)
    return tensors


def write_lora_gguf(tensors: dict[str, np.ndarray], path: Path) -> Path:
    """A llama.cpp LoRA adapter file (general.type adapter, adapter.type lora, alpha 0 = scale as given)."""
    import gguf

    logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)  # a line per file otherwise: one per RL step
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), arch="llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 0.0)
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(partial, path)
    return path


def stop_engine(process: subprocess.Popen) -> None:
    """Close the engine's input (it frees llama.cpp and exits) and reap it."""
    if process.poll() is None:
        try:
            process.stdin.close()
            process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()


class LlamaCppSampler:
    """The Controller contract (routerops.orchestra.controller) over a llama.cpp engine process; a
    drop-in for FastSampler in the RL stage (module docstring). `sync()` after each optimiser step
    writes the policy's current adapter and has the engine apply it. Counters (`tokens`, `seconds`)
    give throughput. No `steer` hook: it is Python code in this process (evaluation uses FastSampler)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, settings: GenerationSettings, gguf: Path,
                 name: str = "lm", version: str = "1", work_dir: Path | None = None, context: int = 8192,
                 threads: int | None = None, weights: str = "f32"):
        self.policy = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.name = name
        self.version = version
        self.eos = eos_token_ids(base_of(model), tokenizer)
        self.work_dir = Path(work_dir) if work_dir is not None else Path(gguf).parent
        self.calls = 0
        self.min_new_tokens = 0  # as FastSampler's: benchmarks force equal lengths with it
        self.steer = None
        self.tokens = 0
        self.seconds = 0.0
        self.lock = threading.Lock()
        # The engine's process must not inherit OMP_WAIT_POLICY=PASSIVE (llama_engine.py says why).
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        self.process = subprocess.Popen([sys.executable, "-m", "models.orchestrator.llama_engine"], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root)
        weakref.finalize(self, stop_engine, self.process)
        self.n_ctx = self.request("open", {"gguf": str(gguf), "work_dir": str(self.work_dir),
                                           "rows": max(1, settings.batch_size), "context": context,
                                           "threads": threads or max(1, torch.get_num_threads()), "eos": list(self.eos),
                                           "weights": weights})
        self.sync()

    def request(self, kind: str, *args: Any) -> Any:
        """One request to the engine process and its answer (its error raised here)."""
        try:
            pickle.dump((kind, *args), self.process.stdin)
            self.process.stdin.flush()
            status, value = pickle.load(self.process.stdout)
        except (EOFError, BrokenPipeError) as exc:
            raise RuntimeError(f"the llama.cpp engine process ended (exit code {self.process.poll()}); "
                               "its error is on stderr") from exc
        if status == "input":
            raise InputError("<conversation>", "<prompt>", value)
        if status == "error":
            raise RuntimeError(f"llama.cpp engine: {value}")
        return value

    def close(self) -> None:
        stop_engine(self.process)

    respond = LMController.respond

    def sync(self) -> None:
        """Write the policy's active adapter as a GGUF LoRA and have the engine apply it (no adapter:
        the base model)."""
        with self.lock:
            tensors = lora_tensors(self.policy) if active_adapter(self.policy) else {}
            if not tensors:
                self.request("adapter", None)
                return
            self.work_dir.mkdir(parents=True, exist_ok=True)
            path = write_lora_gguf(tensors, self.work_dir / f"policy-{os.getpid()}-{id(self)}.lora.gguf")
            try:
                self.request("adapter", str(path))
            finally:
                path.unlink(missing_ok=True)

    encode = FastSampler.encode  # the chat template's ids, as the torch sampler and the trainer see them

    def generate_batch(self, conversations: Sequence[list[Message]], seed: int) -> list[ControllerTurn]:
        if self.steer is not None:
            raise NotImplementedError("a steered controller runs on engine fast (the hook is Python code)")
        started = time.perf_counter()
        prompts = self.encode(conversations)
        settings = {"temperature": self.settings.temperature, "top_p": self.settings.top_p,
                    "max_new_tokens": self.settings.max_new_tokens, "min_new_tokens": self.min_new_tokens}
        drawn = self.request("generate", prompts, settings, int(seed))
        eos_set = set(self.eos)
        turns = []
        for prompt, (generated, logprobs) in zip(prompts, drawn):
            n = turn_length(generated, eos_set)
            ids = generated[:n]
            self.tokens += n
            turns.append(ControllerTurn(
                text=self.tokenizer.decode(ids, skip_special_tokens=True), prompt_tokens=len(prompt),
                completion_tokens=n, token_logprobs=tuple(logprobs[:n]), token_ids=tuple(ids)))
        self.seconds += time.perf_counter() - started
        return turns
