"""Synthetic controller conversations in the paper's trajectory grammar (004 App. F.1), for benchmarks
and tests of SFT that need realistic shapes without a teacher run: a system prompt listing the pool's
(worker, primitive) pairs and prices (App. F.2), an arithmetic task, then assistant turns with
<plan>/<subtask>/<route>, user turns with <obs> blocks, <verify> and one <final_answer>.

The four behaviour modes come in the proportions of the paper's SFT corpus (Tab. 14): lazy 15.6%,
oneshot 49.5%, continuation 30.4%, decomp_repair 4.4%. Observations are computed, not invented: each
subtask's worker "returns" the true partial result, except in a repair, where the aggregator's first
total is wrong and <verify> catches it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from routerops.orchestra.controller import Message
from routerops.pricing import Pool, PriceBook

MODES = {"lazy": 0.156, "oneshot": 0.495, "continuation": 0.304, "decomp_repair": 0.044}  # Tab. 14


def system_prompt(pool: Pool, book: PriceBook) -> str:
    """The F.2 router prompt with the pool's catalogue injected."""
    rows = []
    for worker in pool.workers:
        price = book.prices.get(worker.name)
        cost = (f"${price.input_per_1m:g} in / ${price.output_per_1m:g} out per 1M tokens, ${price.per_call:g} per call"
                if price else "unpriced")
        rows.append(f"- {worker.name}: skills {', '.join(worker.primitives)}; {cost}")
    return (
        "You are Uno-Orchestra, an agentic router that solves a user task by either answering directly or by "
        "emitting a directed acyclic graph of subtasks and dispatching each to a (worker model, skill) pair "
        "drawn from the pool below.\n"
        "Modes: lazy: emit a single <final_answer> when the task is single-step and within your own capability; "
        "decompose: emit a <plan> of subtasks with explicit depends_on edges, then one <route> per subtask.\n"
        "Worker pool:\n" + "\n".join(rows) + "\n"
        "Rules: every <route> must pick a (model, skill) pair from the pool. After every <obs> block emit a "
        "<verify>; if it fails emit <replan/> and start a new round. Terminate with exactly one <final_answer>. "
        "Prefer the cheapest worker competent on the skill a subtask needs.")


@dataclass(frozen=True)
class Part:
    name: str  # a depot
    expression: str  # what it holds, e.g. "23 + 48"
    value: int


DEPOTS = ("north", "south", "east", "west", "harbour")


def arithmetic_task(rng: random.Random) -> tuple[str, list[Part], int]:
    """A word problem over 2-4 independent parts (parallel subtasks) whose total is the answer."""
    parts = []
    for name in rng.sample(DEPOTS, rng.randint(2, 4)):
        a, b = rng.randint(10, 400), rng.randint(2, 60)
        multiply = rng.random() < 0.4
        b = b % 12 + 2 if multiply else b
        parts.append(Part(name, f"{a} × {b}" if multiply else f"{a} + {b}", a * b if multiply else a + b))
    listing = ", ".join(f"the {p.name} depot holds {p.expression}" for p in parts)
    question = f"{len(parts)} depots report their crates: {listing}. How many crates are there in all?"
    return question, parts, sum(p.value for p in parts)


def route(subtask: int, worker: str, skill: str, instruction: str) -> str:
    return f'<route subtask="{subtask}" model="{worker}" skill="{skill}">\n{instruction}\n</route>'


def plan(round_: int, subtasks: list[tuple[int, str, str]]) -> str:
    body = "\n".join(f'<subtask id="{k}" depends_on="{deps}">\n  {text}\n</subtask>' for k, deps, text in subtasks)
    return f'<plan round="{round_}">\n{body}\n</plan>'


def observation(subtask: int, worker: str, value: int) -> str:
    returned = f"Step by step, the result is {value}.\nAnswer: {value}" if "cot" in worker else f"Answer: {value}"
    return f'<obs subtask="{subtask}"> {returned} </obs>'


def turn(role: str, content: str) -> Message:
    return {"role": role, "content": content}


def continuation_turns(rng: random.Random, parts: list[Part], pairs: list[tuple[str, str]]) -> list[Message]:
    """One subtask per round, each conditioned on the previous observation (a running total)."""
    messages, total = [], 0
    for k, part in enumerate(parts, start=1):
        total += part.value
        worker, skill = rng.choice(pairs)
        verify = "<verify>\nthe running total is consistent so far\n</verify>\n" if k > 1 else ""
        step = f"add the {part.name} depot's crates ({part.expression}) to the running total"
        messages.append(turn("assistant", verify + plan(k, [(k, str(k - 1) if k > 1 else "", step)]) + "\n"
                             + route(k, worker, skill, f"Running total {total - part.value}; add {part.expression}.")))
        messages.append(turn("user", observation(k, worker, total)))
    return messages


def oneshot_turns(rng: random.Random, parts: list[Part], pairs: list[tuple[str, str]], repair: bool) -> list[Message]:
    """One plan: the parts in parallel and an aggregator that depends on all of them. With `repair`, the
    aggregator returns a wrong total, <verify> catches it and round 2 recomputes it."""
    ids = list(range(1, len(parts) + 1))
    agg = len(parts) + 1
    chosen = [rng.choice(pairs) for _ in range(agg)]
    subtasks = [(k, "", f"count the {p.name} depot's crates: {p.expression}") for k, p in zip(ids, parts)]
    subtasks.append((agg, ",".join(map(str, ids)), "add the depot counts"))
    routes = [route(k, w, s, f"Compute {p.expression}.") for k, p, (w, s) in zip(ids, parts, chosen)]
    sum_text = " + ".join(str(p.value) for p in parts)
    routes.append(route(agg, *chosen[-1], f"Compute {sum_text}."))
    total = sum(p.value for p in parts)
    returned = total + rng.randint(1, 9) * 10 if repair else total
    obs = [observation(k, w, p.value) for k, p, (w, _) in zip(ids, parts, chosen)]
    obs.append(observation(agg, chosen[-1][0], returned))
    messages = [turn("assistant", plan(1, subtasks) + "\n" + "\n".join(routes)), turn("user", "\n".join(obs))]
    if repair:
        worker, skill = rng.choice(pairs)
        messages.append(turn("assistant", f"<verify>\nsubtask {agg} returned {returned}, but {sum_text} is not "
                             f"{returned}\n<replan/>\n</verify>\n" + plan(2, [(agg + 1, str(agg), "recompute the total")])
                             + "\n" + route(agg + 1, worker, skill, f"Compute {sum_text} carefully.")))
        messages.append(turn("user", observation(agg + 1, worker, total)))
    return messages


def conversation(rng: random.Random, pool: Pool, book: PriceBook, mode: str) -> list[Message]:
    question, parts, answer = arithmetic_task(rng)
    pairs = [(w.name, p) for w in pool.workers for p in w.primitives]
    messages = [turn("system", system_prompt(pool, book)), turn("user", question)]
    final = f"<final_answer> {answer} </final_answer>"
    if mode == "lazy":
        return messages + [turn("assistant", final)]
    if mode == "continuation":
        messages += continuation_turns(rng, parts, pairs)
    else:
        messages += oneshot_turns(rng, parts, pairs, repair=mode == "decomp_repair")
    return messages + [turn("assistant", "<verify>\nall subtasks resolved\n</verify>\n" + final)]


def synthetic_conversations(n: int, pool: Pool, book: PriceBook, seed: int = 0) -> list[dict]:
    """n JSONL-ready rows {"task_id", "mode", "messages"}, modes drawn in Tab. 14's proportions."""
    rng = random.Random(seed)
    modes = rng.choices(list(MODES), weights=list(MODES.values()), k=n)
    return [{"task_id": f"synthetic-{seed}-{i}", "mode": mode, "messages": conversation(rng, pool, book, mode)}
            for i, mode in enumerate(modes)]
