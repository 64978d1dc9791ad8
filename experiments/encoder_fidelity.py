"""How close each history-encoder backend's vectors are to the fp32 torch ones (cosine), on the first
200 GSM8K test questions (needs ../shared/data, or --data), against each backend's documented
guarantee (BACKENDS[b].min_cosine), with the CPU it ran on (int8 kernels differ with AVX2 / AVX-512 /
VNNI). Writes experiments/results/encoder_fidelity.json; exit code 1 when a backend breaks its guarantee.

    python experiments/encoder_fidelity.py [--data ../shared/data] [--n 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from models.embeddings import BACKENDS, ENCODER_BACKENDS, SentenceEncoder, cpu_flags  # noqa: E402


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "encoder_fidelity.json")
    args = parser.parse_args(argv)
    lines = (args.data / "gsm8k" / "test.jsonl").read_text().splitlines()[: args.n]
    texts = [json.loads(line)["question"] for line in lines]
    result = {"benchmark": "encoder_fidelity", "texts": len(texts), "reference": "torch fp32",
              "max_seq_length": 512, "cpu": cpu_flags(), "backends": {}}
    reference = SentenceEncoder(use_cache=False, backend="torch", max_seq_length=512).encode(texts)
    for backend in ENCODER_BACKENDS[1:]:
        encoder = SentenceEncoder(use_cache=False, backend=backend, max_seq_length=512)
        start = time.perf_counter()
        cos = cosines(reference, encoder.encode(texts))
        seconds = time.perf_counter() - start
        bound = BACKENDS[backend].min_cosine
        result["backends"][backend] = {"cosine_mean": round(float(cos.mean()), 5), "cosine_min": round(float(cos.min()), 5),
                                       "min_cosine_guaranteed": bound, "holds": bool(cos.min() >= bound),
                                       "ms_per_text": round(1000 * seconds / len(texts), 1)}
        print(f"{backend:12s} cosine to torch fp32: mean {cos.mean():.4f}  min {cos.min():.4f}  (guaranteed ≥ {bound})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(b["holds"] for b in result["backends"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
