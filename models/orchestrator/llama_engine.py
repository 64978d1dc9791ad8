"""The llama.cpp side of the RL rollout engine (models/orchestrator/llama_sampler.py), run in a process
of its own: a float32 copy of the base GGUF, the policy's LoRA adapter as the parent last wrote it, G
rows decoded as sequences of one batch, and the draw of each token.

Why a process of its own: llama.cpp's CPU kernels run on OpenMP (the system libgomp), which reads
OMP_WAIT_POLICY once, when it loads. Our torch processes set PASSIVE (idle torch threads must sleep on
two shared cores), and under PASSIVE llama.cpp's threads sleep between the graph's ~900 barriers too:
a decode step at G = 4 took 0.09 s instead of 0.02 s (measured on SmolLM2-135M, two cores). The
engine's process starts without that setting, so libgomp's default applies: spin briefly, then sleep.

KV cache: sequence 0 holds the longest shared prompt prefix seen last (the system prompt with the pool
table, a group's task), kept across calls until the adapter changes; row r decodes in sequence r + 1,
which starts as a copy of sequence 0 (a unified cache shares those cells, it does not copy them).

Protocol (pickle frames over the process's stdin and its original stdout; fd 1 is pointed at stderr
so nothing printed can corrupt a frame): ("open", kwargs), ("adapter", path | None),
("generate", prompts, settings, seed) -> [(token ids, log-probs)], each answered ("ok", value),
("input", message) for input the engine cannot take, or ("error", message)."""

from __future__ import annotations

import ctypes
import os
import pickle
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from routerops.schema import file_sha256

# The base weights' type in the engine: f32 is the trainer's (the default, and evaluation's); f16 decodes
# ~1.4x faster (a decode step at G = 4 is bound by reading the weights), and llama.cpp's f16 matmul
# rounds the activations to f16 too, so its log-probs leave the trainer's by ~1.5e-3 nats a token on
# average, ~1e-2 at most (experiments/llama_engine_precision.py): RL rollouts take it with the truncated
# importance weights of models/orchestrator/rl.py (RLSettings.rollout_weights, tis_cap).
WEIGHTS = {"f32": "LLAMA_FTYPE_ALL_F32", "f16": "LLAMA_FTYPE_MOSTLY_F16"}


def quiet_llama_cpp() -> Any:
    """llama_cpp's low-level bindings, with its C-side log (model loading, graph reserves) kept to errors."""
    import llama_cpp.llama_cpp as lib
    from llama_cpp._logger import set_verbose

    set_verbose(False)
    return lib


def dense_gguf(source: Path, cache_dir: Path, weights: str = "f32", threads: int = 2) -> Path:
    """A float32 (or float16: WEIGHTS says when) copy of the GGUF `source`,
    made once per source file by llama.cpp's quantiser (requantising allowed: dequantising Q4_1 is exact
    in float32) and reused; written beside its final name and renamed, so an interrupted conversion
    leaves nothing that looks finished."""
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such GGUF file")
    if weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r} is not one of {sorted(WEIGHTS)}")
    out = Path(cache_dir) / f"{source.stem}.{file_sha256(source)[:16]}.{weights}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    lib = quiet_llama_cpp()
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, WEIGHTS[weights])
    params.allow_requantize = True
    params.pure = True
    params.nthread = threads
    partial = out.with_name(out.name + f".partial-{os.getpid()}")
    if lib.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params)) != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"{source}: llama.cpp could not re-write this GGUF as {weights}")
    os.replace(partial, out)
    return out


def common_prefix(rows: list[list[int]]) -> list[int]:
    """The longest token prefix every row shares."""
    first, n = rows[0], min(len(r) for r in rows)
    for i in range(n):
        if any(r[i] != first[i] for r in rows):
            return list(first[:i])
    return list(first[:n])


def nucleus_logprobs(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """log-probabilities of the distribution tokens are drawn from, row by row: softmax(logits / T),
    restricted to the smallest set of most likely tokens whose mass reaches top_p and renormalised
    there (−inf outside); T = 0 is greedy, reported with the plain softmax. The numpy twin of
    models/orchestrator/sampler.py's `nucleus_logprobs` (tests hold them equal)."""
    z = logits.astype(np.float64) / (temperature if temperature > 0 else 1.0)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    if temperature > 0 and top_p < 1.0:
        order = np.argsort(-logp, axis=-1, kind="stable")
        sorted_p = np.exp(np.take_along_axis(logp, order, axis=-1))
        drop_sorted = np.cumsum(sorted_p, axis=-1) - sorted_p >= top_p  # keeps the first token always
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        kept = np.where(drop, -np.inf, logp)
        logp = kept - np.log(np.exp(kept).sum(axis=-1, keepdims=True))
    return logp


def draw(logp: np.ndarray, temperature: float, rng: np.random.Generator) -> np.ndarray:
    """One token per row: the argmax when greedy, else an inverse-CDF draw from exp(logp)."""
    if temperature <= 0:
        return logp.argmax(axis=-1)
    cdf = np.cumsum(np.exp(logp), axis=-1)
    u = rng.random(len(logp)) * cdf[:, -1]
    return np.minimum((cdf < u[:, None]).sum(axis=-1), logp.shape[-1] - 1)


class LlamaEngine:
    """The llama.cpp model, context and batch of one engine process (module docstring)."""

    def __init__(self, gguf: str, work_dir: str, rows: int, context: int, threads: int, eos: list[int],
                 weights: str = "f32"):
        import llama_cpp._internals as internals

        self.lib = lib = quiet_llama_cpp()
        self.base = dense_gguf(Path(gguf), Path(work_dir), weights, threads)
        self.model = internals.LlamaModel(path_model=str(self.base), params=lib.llama_model_default_params(),
                                          verbose=False)
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = context, 512, 512
        params.n_seq_max = rows + 1
        params.n_threads = params.n_threads_batch = threads
        # float32 keys and values, and attention without llama.cpp's flash kernel, which rounds the query
        # to float16 on a CPU: with either, log-probs drift from the trainer's by ~1e-2 nats on SmolLM2;
        # without, ~3e-5 (tests/models/orchestrator/test_llama_sampler.py).
        params.type_k = params.type_v = lib.GGML_TYPE_F32
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.kv_unified = True
        self.context = internals.LlamaContext(model=self.model, params=params, verbose=False)
        self.rows, self.n_ctx, self.n_batch, self.eos = rows, context, 512, set(eos)
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model.model))
        self.batch = lib.llama_batch_init(self.n_batch, 0, rows + 1)
        self.adapter = None
        self.stored: list[int] = []  # the prompt prefix sequence 0 holds under the current adapter

    @property
    def memory(self):
        return self.lib.llama_get_memory(self.context.ctx)

    def set_adapter(self, path: str | None) -> None:
        """Apply the LoRA adapter file at `path` (None: the base model); the cache is of old weights."""
        lib, old = self.lib, self.adapter
        if path is not None:
            self.adapter = lib.llama_adapter_lora_init(self.model.model, str(path).encode())
            if not self.adapter:
                raise RuntimeError(f"{path}: llama.cpp refused this LoRA adapter")
            rc = lib.llama_set_adapters_lora(self.context.ctx, (lib.llama_adapter_lora_p_ctypes * 1)(self.adapter), 1,
                                             (ctypes.c_float * 1)(1.0))
        else:
            self.adapter = None
            rc = lib.llama_set_adapters_lora(self.context.ctx, None, 0, None)
        if rc != 0:
            raise RuntimeError(f"llama.cpp could not set the LoRA adapter (code {rc})")
        if old is not None:
            lib.llama_adapter_lora_free(old)
        lib.llama_memory_clear(self.memory, True)
        self.stored = []

    def decode(self, items: list[tuple[int, int, int, bool]]) -> list[np.ndarray]:
        """Decode (token, position, sequence, wants logits) items, n_batch at a time; the logits wanted."""
        out = []
        for start in range(0, len(items), self.n_batch):
            chunk, batch = items[start:start + self.n_batch], self.batch
            batch.n_tokens = len(chunk)
            for i, (token, position, seq, wanted) in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, position, 1
                batch.seq_id[i][0], batch.logits[i] = seq, wanted
            rc = self.lib.llama_decode(self.context.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed (code {rc}) with a {self.n_ctx}-token cache")
            for i, item in enumerate(chunk):
                if item[3]:
                    logits = self.lib.llama_get_logits_ith(self.context.ctx, i)
                    out.append(np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).copy())
        return out

    def load_prefix(self, upto: list[int]) -> None:
        """Sequence 0 holds exactly `upto`: what it shares with the stored prefix stays, the rest is run."""
        keep = len(common_prefix([self.stored, upto])) if self.stored and upto else 0
        self.lib.llama_memory_seq_rm(self.memory, 0, keep, -1)
        self.decode([(tok, pos, 0, False) for pos, tok in enumerate(upto[keep:], start=keep)])
        self.stored = list(upto)

    def cells_needed(self, prompts: list[list[int]], max_new: int) -> int:
        shared = len(common_prefix(prompts))
        return max(shared, len(self.stored)) + sum(len(p) - shared + 1 + max_new for p in prompts)

    def generate(self, prompts: list[list[int]], settings: dict, seed: int) -> list[tuple[list[int], list[float]]]:
        """Each prompt's drawn tokens (to end-of-turn or max_new_tokens) and their log-probabilities.
        settings: temperature, top_p, max_new_tokens, min_new_tokens (end-of-turn masked until then)."""
        max_new = settings["max_new_tokens"]
        if len(prompts) > self.rows or (len(prompts) > 1 and self.cells_needed(prompts, max_new) > self.n_ctx):
            half = (len(prompts) + 1) // 2  # a batch the cache cannot hold runs as two
            return self.generate(prompts[:half], settings, seed) + self.generate(prompts[half:], settings, seed + 7_919)
        if self.cells_needed(prompts, max_new) > self.n_ctx:
            raise ValueError(f"{len(prompts[0])} prompt tokens and {max_new} new ones exceed the sampler's "
                             f"{self.n_ctx}-token context")
        upto = common_prefix(prompts)[:-1]  # each row keeps ≥ 1 token of its own: its logits start the turn
        self.load_prefix(upto)
        items = []
        for r, prompt in enumerate(prompts):
            self.lib.llama_memory_seq_rm(self.memory, r + 1, -1, -1)
            self.lib.llama_memory_seq_cp(self.memory, 0, r + 1, -1, -1)
            items += [(tok, pos, r + 1, pos == len(prompt) - 1)
                      for pos, tok in enumerate(prompt[len(upto):], start=len(upto))]
        logits = np.stack(self.decode(items))
        rng = np.random.default_rng(seed)
        eos = np.array(sorted(self.eos))
        out: list[tuple[list[int], list[float]]] = [([], []) for _ in prompts]
        alive = list(range(len(prompts)))
        for drawn in range(max_new):
            if drawn < settings["min_new_tokens"]:
                logits[:, eos] = -np.inf
            logp = nucleus_logprobs(logits, settings["temperature"], settings["top_p"])
            tokens = draw(logp, settings["temperature"], rng)
            for i, row in enumerate(alive):
                out[row][0].append(int(tokens[i]))
                out[row][1].append(float(logp[i, tokens[i]]))
            alive = [row for i, row in enumerate(alive) if int(tokens[i]) not in self.eos]
            if not alive or drawn + 1 == max_new:
                break
            step = [(out[row][0][-1], len(prompts[row]) + len(out[row][0]) - 1, row + 1, True) for row in alive]
            logits = np.stack(self.decode(step))
        for r in range(len(prompts)):
            self.lib.llama_memory_seq_rm(self.memory, r + 1, -1, -1)
        return out

    def close(self) -> None:
        if self.batch is not None:
            self.lib.llama_batch_free(self.batch)
            self.batch = None
        if self.adapter is not None:
            self.lib.llama_set_adapters_lora(self.context.ctx, None, 0, None)
            self.lib.llama_adapter_lora_free(self.adapter)
            self.adapter = None
        self.context.close()
        self.model.close()


def serve() -> None:
    """The engine process's loop (module docstring: protocol)."""
    frames_in, frames_out = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a library prints goes to stderr, not into a frame
    engine: LlamaEngine | None = None
    while True:
        try:
            message = pickle.load(frames_in)
        except EOFError:
            break
        kind, *args = message
        try:
            if kind == "open":
                engine = LlamaEngine(**args[0])
                reply: Any = engine.n_ctx
            elif engine is None:
                raise RuntimeError("the engine is not open")
            elif kind == "adapter":
                reply = engine.set_adapter(args[0])
            elif kind == "generate":
                reply = engine.generate(*args)
            else:
                raise ValueError(f"unknown request {kind!r}")
            pickle.dump(("ok", reply), frames_out)
        except ValueError as exc:  # bad input (a prompt the cache cannot hold): the parent's InputError
            pickle.dump(("input", str(exc)), frames_out)
        except Exception as exc:  # the parent raises it with this text; the engine stays up
            traceback.print_exc(file=sys.stderr)
            pickle.dump(("error", f"{type(exc).__name__}: {exc}"), frames_out)
        frames_out.flush()
    if engine is not None:
        engine.close()


if __name__ == "__main__":
    serve()
