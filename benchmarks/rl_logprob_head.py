"""The RL update's log-probability pass with the LM head on the controller tokens only, against the full
head from the first needed position (the path `models/orchestrator/rl.sequence_logprobs` took before).

Why: an orchestrator episode is one long conversation whose controller turns are a small part of it (the
system prompt, the task and every worker observation sit between them). SmolLM2's head is a 576 × 49,152
matrix; run from the first controller token to the end it scores every observation token too, in the
update's forward and backward pass and in the reference's no-grad pass. Both paths give the same
log-probs and LoRA gradient (tests/models/orchestrator/test_rl.py).

Shape: `--rows` conversations of `--length` tokens (SmolLM2-135M-Instruct with params.yaml's LoRA
targets), controller turns at the `--turns` spans; each path timed `--repeats` times, alternating,
forward + backward (the update) and no-grad forward (the reference), after one unmeasured warm-up pass. Writes
benchmarks/results/rl_logprob_head.json.

    python benchmarks/rl_logprob_head.py [--rows 4] [--length 700] [--threads 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from models.embeddings import cpu_flags  # noqa: E402
from models.orchestrator import rl  # noqa: E402
from routerops.schema import write_json_atomic  # noqa: E402

# Three controller turns as fractions of the conversation (at 700 tokens: 300–340, 450–490, 600–630), the
# system prompt and task before the first, worker observations between them.
TURNS = ((0.43, 0.49), (0.64, 0.70), (0.86, 0.90))


class FullHead(torch.nn.Module):
    """The same model seen through a wrapper without get_decoder: sequence_logprobs takes its full-head
    path (logits from the first needed position to the end)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, **kwargs):
        return self.model(**kwargs)


def batch(rows: int, length: int, turns) -> object:
    ids = torch.randint(1, 40_000, (rows, length), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros_like(ids)
    for start, end in turns:
        mask[:, int(start * length):int(end * length)] = 1
    return type("Batch", (), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mask": mask})()


def timed(model: torch.nn.Module, data, temperature: float = 0.7) -> dict:
    start = time.perf_counter()
    rl.sequence_logprobs(model, data, temperature).sum().backward()
    update = time.perf_counter() - start
    start = time.perf_counter()
    with torch.no_grad():
        rl.sequence_logprobs(model, data, temperature)
    return {"update_s": update, "reference_s": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=700)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "rl_logprob_head.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from peft import LoraConfig, get_peft_model

    from models.orchestrator.config import LLAMA_LINEAR_MODULES, ModelSpec
    from models.orchestrator.lm import load_controller_model

    model, _ = load_controller_model(ModelSpec())
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=list(LLAMA_LINEAR_MODULES)))
    data = batch(args.rows, args.length, TURNS)
    timed(model, data)  # warm-up: first-call allocations are neither path's cost
    model.zero_grad(set_to_none=True)
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"controller_tokens_only": [], "full_head": []}
    for _ in range(args.repeats):
        for name, m in (("controller_tokens_only", model), ("full_head", FullHead(model))):
            runs[name].append(timed(m, data))
            model.zero_grad(set_to_none=True)
    median = {name: {k: statistics.median(r[k] for r in rs) for k in ("update_s", "reference_s")} for name, rs in runs.items()}
    result = {
        "benchmark": "rl_logprob_head", "command": " ".join(["python", "benchmarks/rl_logprob_head.py", *(argv or sys.argv[1:])]),
        "settings": {"rows": args.rows, "length": args.length, "turns": TURNS, "threads": args.threads,
                     "repeats": args.repeats, "controller_tokens": int(data.mask.sum())},
        "runs": runs, "median": median,
        "ratio_full_over_controller_only": {k: median["full_head"][k] / median["controller_tokens_only"][k]
                                            for k in ("update_s", "reference_s")},
        "cpu": cpu_flags(), "load_average_1m": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    write_json_atomic(result, args.out)
    print(median, result["ratio_full_over_controller_only"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
