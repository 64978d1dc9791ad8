"""SFT throughput of the LM controller on this CPU: LoRA on SmolLM2-135M-Instruct (params.yaml's
orchestra section) over synthetic controller conversations in the paper's grammar (004 App. F.1: plans,
routes, <obs> blocks, verify, final answer; modes in Tab. 14's proportions; models/orchestrator/synthetic.py),
for a fixed number of optimiser steps.

Reports controller (assistant, trained) tokens and all tokens per second, step times, the peak RSS while
training, and the CPU and load it ran under. `--steps × --batch-size` must be a multiple of `--n`: every
conversation is then seen the same number of times, so the token counts are exact, not estimated.
Writes benchmarks/results/sft_throughput.json.

    python benchmarks/sft_throughput.py [--n 32] [--steps 32] [--batch-size 2] [--max-seq-len 1024] [--threads 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning (set before torch loads): on two cores shared with other
# work, spinning threads slowed generation 8× (tests/models/orchestrator/conftest.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from models.embeddings import cpu_flags  # noqa: E402
from stages.orchestra.config import lm_config, load_run  # noqa: E402
from models.orchestrator.lm import base_model_folder  # noqa: E402
from models.orchestrator.sft import train_sft  # noqa: E402
from models.orchestrator.synthetic import synthetic_conversations  # noqa: E402
from routerops.pricing import load_pool, load_price_book  # noqa: E402

log = logging.getLogger("sft_throughput")


class StepTimer(TrainerCallback):
    """Wall time of every optimiser step (forward, backward, optimiser), nothing between steps."""

    def __init__(self):
        self.seconds: list[float] = []
        self.started = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self.started)


from routerops.measure import PeakRSS  # noqa: E402
from routerops.measure import library_versions as versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32, help="synthetic conversations")
    parser.add_argument("--steps", type=int, default=32, help="optimiser steps")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the machine has 2 shared cores)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sft_throughput.json")
    args = parser.parse_args(argv)
    if args.n < 1 or args.steps < 1 or (args.steps * args.batch_size) % args.n:
        parser.error("--steps × --batch-size must be a positive multiple of --n (exact token counts)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)

    config = lm_config(load_run(args.params), args.params)
    sft = dataclasses.replace(config.sft, max_steps=args.steps, batch_size=args.batch_size, warmup_steps=0,
                              max_seq_len=args.max_seq_len, save_steps=args.steps, seed=args.seed)
    config = dataclasses.replace(config, sft=sft)
    base_model_folder(config.model)  # dequantise the GGUF now if needed, outside the measurement
    rows = synthetic_conversations(args.n, load_pool(REPO / "configs/pool.yaml"),
                                   load_price_book(REPO / "configs/prices/current.yaml"), seed=args.seed)
    timer = StepTimer()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "conversations.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with PeakRSS() as rss:
            result = train_sft(config, data, Path(tmp) / "sft", resume=False, callbacks=[timer])
    if result.data["trained_conversations"] != args.n:
        raise SystemExit(f"{args.n - result.data['trained_conversations']} conversations had no assistant token within "
                         f"--max-seq-len {args.max_seq_len}; raise it so the token counts stay exact")
    epochs = args.steps * args.batch_size // args.n
    assistant_tokens, tokens = epochs * result.data["assistant_tokens"], epochs * result.data["tokens"]
    step_s = sum(timer.seconds)
    steady = timer.seconds[1:] or timer.seconds  # the first step also warms up kernels and allocators
    modes = {m: sum(r["mode"] == m for r in rows) for m in sorted({r["mode"] for r in rows})}
    record = {
        "benchmark": "sft_throughput",
        "command": "python benchmarks/sft_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": config.model.name, "method": f"LoRA r={sft.lora_r} on {', '.join(sft.lora_target_modules)}",
        "precision": sft.precision, "device": sft.device, "torch_threads": args.threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "data": {"conversations": args.n, "modes": modes, "epochs": epochs, **result.data},
        "steps": args.steps, "batch_size": args.batch_size, "max_seq_len": args.max_seq_len,
        "tokens_trained": {"assistant": assistant_tokens, "total": tokens,
                           "trl_num_tokens": result.loss_curve[-1].get("num_tokens")},
        "throughput": {
            "assistant_tokens_per_s": round(assistant_tokens / step_s, 2),
            "total_tokens_per_s": round(tokens / step_s, 2),
            "assistant_tokens_per_s_wall": round(assistant_tokens / result.train_seconds, 2),
            "total_tokens_per_s_wall": round(tokens / result.train_seconds, 2),
        },
        "step_seconds": {"mean": round(statistics.mean(timer.seconds), 2),
                         "median_after_first": round(statistics.median(steady), 2),
                         "min": round(min(timer.seconds), 2), "max": round(max(timer.seconds), 2),
                         "first": round(timer.seconds[0], 2), "all": [round(s, 2) for s in timer.seconds]},
        "train_seconds": result.train_seconds,
        "loss": {"first": result.loss_curve[0]["loss"], "last": result.loss_curve[-1]["loss"]},
        "memory_mib": {"peak_rss_training": round(rss.peak / 2**20, 1),
                       "peak_rss_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)},
        "load_average_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        "cpu": cpu_flags(),
        "machine": {"python": platform.python_version(), "platform": platform.platform(), **versions()},
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    log.info("%.1f controller tokens/s, %.1f tokens/s, median step %.1f s, peak RSS %.0f MiB; wrote %s",
             record["throughput"]["assistant_tokens_per_s"], record["throughput"]["total_tokens_per_s"],
             record["step_seconds"]["median_after_first"], record["memory_mib"]["peak_rss_training"], args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
