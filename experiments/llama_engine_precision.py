"""What the llama.cpp rollout engine's base-weight type costs in agreement and buys in speed
(models/orchestrator/llama_engine.py: f32, the stage's, or f16).

For each weight type, in one run:
- agreement: a random LoRA policy (B ~ N(0, 0.02²), as tests/models/orchestrator/test_sampler.py)
  samples 8 conversations at T = 1 through LlamaCppSampler; RLTrainer recomputes the log-probs of the
  same tokens (unmerged adapter, float32, full attention); max and mean |Δ| per token;
- speed: G = 4 completions of one 256-token prompt (benchmarks/rl_step.py's), each forced to 64
  tokens, the adapter re-synced before each call as the stage does; median seconds of 3 calls after
  a warm-up, controller tokens/s.
Writes experiments/results/llama_engine_precision.json.

    python experiments/llama_engine_precision.py [--weights f32 f16] [--calls 3] [--threads 2] [--group 4] [--tokens 64]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

log = logging.getLogger("llama_engine_precision")

QUESTIONS = ["What is 17 + 25?", "Compute 123 * 456, then add 7.", "What is the gcd of 84 and 36?",
             "How many primes are below 30?"]
SYSTEM = "You route tasks. Reply with XML only: <final_answer>ANSWER</final_answer>, or a <plan> with <route>s."


def conversations() -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS] * 2


def random_policy(trainer, seed: int, scale: float = 0.02) -> None:
    """LoRA's B starts at 0 (a no-op adapter); a random B makes the policy differ from the base."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)


def agreement(trainer, sampler) -> dict[str, float]:
    """max and mean |sampler log-prob − trainer log-prob| over the sampled tokens the trainer re-tokenises
    to the same ids."""
    from models.orchestrator.rl import RolloutBatch

    talks = conversations()
    turns = sampler.respond(talks)
    full = [c + [{"role": "assistant", "content": t.text}] for c, t in zip(talks, turns)]
    batch = RolloutBatch.from_conversations(trainer.tokenizer, full, [[1.0]] * len(full), turns=[[t] for t in turns])
    diff = (trainer.logprobs(batch) - batch.old_logprobs).abs()[batch.old_known]
    return {"tokens": int(diff.numel()), "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean())}


def speed(trainer, sampler, prompt, group: int, tokens: int, calls: int) -> dict:
    sampler.min_new_tokens = tokens
    seconds = []
    for n in range(calls + 1):
        started = time.perf_counter()
        sampler.sync()
        sampler.respond([prompt] * group)
        if n:  # the first call is the warm-up
            seconds.append(time.perf_counter() - started)
    sampler.min_new_tokens = 0
    median = statistics.median(seconds)
    return {"seconds": [round(s, 3) for s in seconds], "median_seconds": round(median, 3),
            "tokens_per_second": round(group * tokens / median, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", nargs="+", default=["f32", "f16"], choices=["f32", "f16"])
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--group", type=int, default=4, help="completions per timed call (G)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each timed completion is forced to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "llama_engine_precision.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import torch

    from models.orchestrator.config import GenerationSettings, ModelSpec
    from models.orchestrator.llama_sampler import LlamaCppSampler
    from models.orchestrator.lm import base_gguf, base_model_folder
    from models.orchestrator.rl import RLSettings, RLTrainer
    from routerops.measure import fit_prompt

    torch.set_num_threads(args.threads)
    spec = ModelSpec()
    folder = base_model_folder(spec)
    trainer = RLTrainer.create(RLSettings(), folder)
    random_policy(trainer, args.seed)
    prompt, prompt_tokens = fit_prompt(lambda m: len(trainer.tokenizer.apply_chat_template(
        m, tokenize=True, add_generation_prompt=True, return_dict=False)), 256)
    results = {}
    for weights in args.weights:
        settings = GenerationSettings(temperature=1.0, max_new_tokens=64, batch_size=8, seed=args.seed)
        sampler = LlamaCppSampler(trainer.model, trainer.tokenizer, settings, base_gguf(spec), work_dir=folder.parent,
                                  threads=args.threads, weights=weights)
        try:
            results[weights] = {**agreement(trainer, sampler),
                                **speed(trainer, sampler, prompt, args.group, args.tokens, args.calls)}
        finally:
            sampler.close()
        log.info("%s: %s", weights, results[weights])
    record = {"benchmark": "llama_engine_precision",
              "command": "python experiments/llama_engine_precision.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "model": spec.name, "prompt_tokens": prompt_tokens, "group_size": args.group, "completion_tokens": args.tokens,
              "threads": args.threads, "results": results,
              "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
