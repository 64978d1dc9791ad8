"""What the benchmarks and experiments measure with, shared so no script imports another.

`PeakRSS` samples this process's resident memory with its children's (the llama.cpp rollout engine is
a child), `library_versions` records the training stack a timing was taken on, and `prompt_messages` /
`fit_prompt` build the controller prompt of a chosen token length that benchmarks/rl_step.py and
experiments/llama_engine_precision.py both time and score.
"""

from __future__ import annotations

import threading
from importlib import metadata

import psutil

SYSTEM = ("You are the controller. Route each subtask to one (model, skill) pair: smol-direct/answer or "
          "python/python. Write <plan>, <route>, <verify> and one <final_answer>.")
FILLER = ("A warehouse ships crates north and south; each truck carries a fixed load, and the ledger lists "
          "every delivery by day, route and weight, with notes on delays and returns.").split()


class PeakRSS:
    """Peak resident memory of this process and its children (e.g. the llama.cpp rollout engine) while
    running, sampled every 50 ms."""

    def __init__(self):
        self.peak = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self):
        process = psutil.Process()
        while not self.done.wait(0.05):
            total = process.memory_info().rss
            for child in process.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:  # it ended between the listing and the reading
                    pass
            self.peak = max(self.peak, total)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def library_versions() -> dict[str, str]:
    """The installed versions of the training stack a timing depends on."""
    return {name: metadata.version(name) for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets")}



def prompt_messages(words: int) -> list[dict[str, str]]:
    """The benchmark's prompt: a controller system message and a task of `words` filler words."""
    task = " ".join(FILLER[i % len(FILLER)] for i in range(words))
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{task}\nHow many crates went north in all?"}]


def fit_prompt(count_tokens, target: int) -> tuple[list[dict[str, str]], int]:
    """The longest prompt_messages(w) whose templated length (count_tokens(messages)) is ≤ target, and
    that length. Word granularity: the result is within a token or two of the target."""
    low, high = 0, target
    while low < high:  # the largest w with count_tokens(prompt_messages(w)) ≤ target
        mid = (low + high + 1) // 2
        if count_tokens(prompt_messages(mid)) <= target:
            low = mid
        else:
            high = mid - 1
    messages = prompt_messages(low)
    return messages, count_tokens(messages)
