"""Rollout engine: runs (task, policy) episodes against priced workers and logs trajectories.

An episode follows MTRouter §3.1: at each turn the policy picks one (worker, primitive) or STOP; the
episode ends when the environment (or the policy) says it is done, the turn limit is reached, or
the per-episode budget B admits no further call (eq. 1: sum_t c_t <= B). The budget is enforced
before a call: only actions whose worst-case cost still fits are offered to the policy, so the
logged cost can never exceed B.

`collect` runs many episodes concurrently and is resumable: each finished episode is appended to a
journal (one JSON line per episode, fsynced), a rerun skips what the journal holds, and the final
Parquet tables hold exactly the planned episodes.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd
from tqdm.auto import tqdm

from routerops import schema
from routerops.errors import InputError, RouteropsError
from routerops.policies import episode_rng, is_stop
from routerops.pricing import PriceBook, WorkerSpec
from routerops.types import (
    Action, EpisodeState, Environment, Payload, Policy, Task, TurnRecord, Worker, WorkerResult,
)
from routerops.workers import run_closing

JOURNAL_NAME = "journal.jsonl"
# Chat-template tokens a message may add around its content (role markers, separators), and the
# assistant header the server appends; generous for ChatML-style templates.
TEMPLATE_TOKENS_PER_MESSAGE = 16
TEMPLATE_TOKENS_PER_REQUEST = 16
# Run-level settings a journaled episode must share with the rerun that wants to reuse it.
RESUME_KEYS = ("policy_version", "budget_usd", "turn_limit", "price_book_version")


# ---------------------------------------------------------------- budget: worst-case cost of a call


def max_completion_tokens(spec: WorkerSpec) -> int:
    """The completion cap the call is made with; tool workers produce no billed completion."""
    if spec.kind != "llm":
        return 0
    cap = spec.generation.get("max_tokens")
    if not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0:
        raise InputError("pool", f"workers[{spec.name}].generation.max_tokens", "LLM workers need a positive "
                         "integer cap, or no budget could be enforced before a call")
    return cap


def prompt_token_bound(payload: Payload, system: str = "") -> int:
    """Upper bound on the prompt tokens the server will count for `payload`.

    Byte-level BPE and byte-fallback tokenizers never emit fewer than one byte per token, so the
    UTF-8 length of the text bounds its token count; the template adds a bounded number per message.
    """
    if isinstance(payload, str):
        return len(payload.encode()) + TEMPLATE_TOKENS_PER_REQUEST
    texts = [m.get("content", "") for m in payload]
    if system and not any(m.get("role") == "system" for m in payload):
        texts.append(system)  # the worker prepends its configured system prompt
    content = sum(len(t.encode()) for t in texts)
    return content + TEMPLATE_TOKENS_PER_MESSAGE * len(texts) + TEMPLATE_TOKENS_PER_REQUEST


def worst_case_cost(spec: WorkerSpec, payload: Payload, book: PriceBook) -> float:
    """Most a call could cost under `book`: every prompt token at the dearer of the cached and
    uncached rates, and the full completion cap."""
    prompt = prompt_token_bound(payload, str(spec.generation.get("system", "")))
    completion = max_completion_tokens(spec)
    return max(book.cost(spec.name, prompt, completion, 0), book.cost(spec.name, prompt, completion, prompt))


# ---------------------------------------------------------------- one episode


def worker_actions(workers: Mapping[str, Worker]) -> list[Action]:
    """Every (worker, primitive) the workers offer, in pool order."""
    return [Action(name, primitive) for name, w in workers.items() for primitive in spec_of(w).primitives]


def spec_of(worker: Worker) -> WorkerSpec:
    spec = getattr(worker, "spec", None)
    if not isinstance(spec, WorkerSpec):
        raise RouteropsError(f"worker {worker.name!r} carries no WorkerSpec (.spec); the engine needs its "
                             "primitives and generation cap")
    return spec


def affordable_actions(
    state: EpisodeState, actions: Sequence[Action], workers: Mapping[str, Worker], env: Environment,
    book: PriceBook,
) -> tuple[list[Action], dict[str, Payload]]:
    """The actions whose worst-case cost still fits the budget, and the payload of each primitive."""
    payloads: dict[str, Payload] = {}
    offered = []
    for action in actions:
        if action.primitive not in payloads:
            payloads[action.primitive] = env.request(state, action.primitive)
        cost = worst_case_cost(spec_of(workers[action.worker]), payloads[action.primitive], book)
        if state.spent_usd + cost <= state.budget_usd:
            offered.append(action)
    return offered, payloads


async def call_worker(worker: Worker, payload: Payload, max_tokens: int | None) -> WorkerResult:
    """The worker's result; an exception escaping its own retries becomes the result's error."""
    started = time.perf_counter()
    try:
        return await worker.call(payload, max_tokens=max_tokens)
    except Exception as exc:  # network stacks raise many types; the episode records the message
        elapsed = time.perf_counter() - started
        return WorkerResult(text="", latency_s=elapsed, error=f"{type(exc).__name__}: {exc}")


def message_text(payload: Payload) -> str:
    return payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)


async def play_turn(
    state: EpisodeState, action: Action, payload: Payload, worker: Worker, env: Environment, book: PriceBook,
    actor: str,
) -> str:
    """Make one call, record the turn, update the state; returns the worker's error ("" if none)."""
    spec = spec_of(worker)
    result = await call_worker(worker, payload, max_completion_tokens(spec) if spec.kind == "llm" else None)
    cost = book.cost(spec.name, result.prompt_tokens, result.completion_tokens, result.cached_tokens)
    errors: list[dict[str, Any]] = [{"rule": "worker_error", "severity": "high"}] if result.error else []
    observation = ""  # a failed call is never shown to the environment, so it shows nothing back
    if not result.error:
        seen = await asyncio.to_thread(env.observe, state, action.primitive, result.text)
        errors, observation, state.done = list(seen.errors), seen.observation, seen.done
        state.observation = observation
        if seen.answer is not None:
            state.answer = seen.answer
    state.spent_usd += cost
    state.turns.append(TurnRecord(
        turn_index=len(state.turns), actor=actor, worker=action.worker, primitive=action.primitive,
        message=message_text(payload), response=result.text, prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens, cached_tokens=result.cached_tokens,
        latency_s=result.latency_s, cost_usd=cost, errors=errors, propensity=action.propensity,
        observation=observation,
    ))
    return result.error


def choose(state: EpisodeState, policy: Policy, offered: list[Action], all_actions: list[Action],
           rng: random.Random) -> tuple[Action, str]:
    """The policy's choice among the affordable actions, and the end reason if it is STOP."""
    before = rng.getstate()
    action = policy.act(state, offered, rng)
    if not is_stop(action):
        if (action.worker, action.primitive) not in {(a.worker, a.primitive) for a in offered}:
            raise RouteropsError(
                f"policy {policy.name} chose {action.worker}/{action.primitive}, which was not offered")
        return action, ""
    if len(offered) == len(all_actions):
        return action, schema.END_DONE
    # Replay the same draw with every action affordable: if the policy would then have made a
    # call, it was the budget, not the policy, that ended the episode.
    after = rng.getstate()
    rng.setstate(before)
    wanted = policy.act(state, all_actions, rng)
    rng.setstate(after)
    return action, schema.END_DONE if is_stop(wanted) else schema.END_BUDGET


async def play(state: EpisodeState, policy: Policy, env: Environment, workers: Mapping[str, Worker],
               book: PriceBook, rng: random.Random) -> tuple[str, str]:
    """The turn loop; returns (ended_by, error)."""
    all_actions = worker_actions(workers)
    while True:
        if state.done:
            return schema.END_DONE, ""
        if len(state.turns) >= state.turn_limit:
            return schema.END_TURN_LIMIT, ""
        offered, payloads = affordable_actions(state, all_actions, workers, env, book)
        action, ended_by = choose(state, policy, offered, all_actions, rng)
        if is_stop(action):
            return ended_by, ""
        error = await play_turn(state, action, payloads[action.primitive], workers[action.worker], env, book,
                                policy.name)
        if error:
            return schema.END_ERROR, error


async def run_episode(
    task: Task, policy: Policy, env: Environment, workers: Mapping[str, Worker], book: PriceBook,
    budget_usd: float, turn_limit: int, run_id: str, seed: int,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Play one episode; returns its episodes-table row and its turns-table rows."""
    eid = schema.episode_id(run_id, task.task_id, policy.name, seed)
    state = EpisodeState(task=task, budget_usd=budget_usd, turn_limit=turn_limit)
    # reset / observe / close may block (simulators, sandboxes): they run in threads so the other
    # episodes' calls go on; score stays on this thread (verifiers' SIGALRM timeouts need the main one).
    try:
        await asyncio.to_thread(env.reset, state)
        rng = episode_rng(getattr(policy, "seed", 0), eid)
        ended_by, error = await play(state, policy, env, workers, book, rng)
        score = float(env.score(state))
    finally:
        await asyncio.to_thread(env.close, state)  # runs to the end even if this task is cancelled
    success = score >= float(getattr(env, "success_threshold", 1.0))
    episode = episode_row(eid, run_id, task, policy, seed, state, book, ended_by, error, score, success)
    return episode, [turn_row(eid, t) for t in state.turns]


def episode_row(eid: str, run_id: str, task: Task, policy: Policy, seed: int, state: EpisodeState,
                book: PriceBook, ended_by: str, error: str, score: float, success: bool) -> dict[str, Any]:
    return {
        "episode_id": eid, "run_id": run_id, "task_id": task.task_id, "suite": task.suite, "split": task.split,
        "policy": policy.name, "policy_version": str(policy.version), "seed": int(seed),
        "budget_usd": float(state.budget_usd), "turn_limit": int(state.turn_limit),
        "price_book_version": book.version, "final_answer": state.answer or "", "score": score,
        "success": bool(success), "turns": len(state.turns),
        "prompt_tokens": sum(t.prompt_tokens for t in state.turns),
        "completion_tokens": sum(t.completion_tokens for t in state.turns),
        "cached_tokens": sum(t.cached_tokens for t in state.turns),
        "cost_usd": sum(t.cost_usd for t in state.turns), "ended_by": ended_by, "error": error,
        "mode": "", "conversation": "",  # orchestrator columns: a flat router has neither
    }


def turn_row(eid: str, turn: TurnRecord) -> dict[str, Any]:
    row = asdict(turn)
    row.update(episode_id=eid, depends_on=json.dumps(turn.depends_on), errors=json.dumps(turn.errors))
    return row


# ---------------------------------------------------------------- journal


def read_journal(path: Path) -> dict[str, dict[str, Any]]:
    """Finished episodes by id. A torn last line (killed mid-write) is cut off so appends stay
    line-aligned; a corrupt line anywhere else is an error."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    entries: dict[str, dict[str, Any]] = {}
    good_end, start = 0, 0
    while start < len(data):
        newline = data.find(b"\n", start)
        end = len(data) if newline < 0 else newline + 1
        try:
            entry = upgrade_journal_entry(json.loads(data[start:end]))
            entries.setdefault(entry["episode"]["episode_id"], entry)
        except (ValueError, KeyError, TypeError) as exc:
            if end < len(data):
                line = data.count(b"\n", 0, start) + 1
                raise InputError(path, f"line {line}", f"corrupt journal entry: {exc}") from exc
            break  # torn tail
        good_end = start = end
    if good_end < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(good_end)
    return entries


def upgrade_journal_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A journal line written before schema version 2 has turns without `observation`, one written
    before version 3 an episode without `mode` and `conversation`; like
    schema.read_table on a version-1 file, it gets "" (never logged), so a collection begun by the
    old code resumes and its tables still hold every column."""
    for turn in entry["turns"]:
        turn.setdefault("observation", "")
    for column, value in schema.LATER_COLUMNS["episodes"].items():  # written before schema version 3
        entry["episode"].setdefault(column, value)
    return entry


def append_journal(fh, episode: dict[str, Any], turns: list[dict[str, Any]]) -> None:
    """One line per episode, on disk before the episode counts as finished."""
    fh.write((json.dumps({"episode": episode, "turns": turns}) + "\n").encode())
    fh.flush()
    os.fsync(fh.fileno())


def check_resumable(path: Path, entry: dict[str, Any], planned: dict[str, Any]) -> None:
    """A journaled episode may stand in for a planned one only if it ran under the same settings."""
    for key in RESUME_KEYS:
        if entry["episode"][key] != planned[key]:
            raise InputError(path, key, f"journal has {entry['episode'][key]!r}, this run asks "
                             f"{planned[key]!r}; collect into a new out_dir or under a new run_id")


# ---------------------------------------------------------------- collection


def check_settings(budget_usd: float, turn_limit: int, concurrency: int) -> None:
    if not budget_usd >= 0:  # also rejects NaN
        raise InputError("collect settings", "budget_usd", f"expected a non-negative number, got {budget_usd!r}")
    for field, value in (("turn_limit", turn_limit), ("concurrency", concurrency)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError("collect settings", field, f"expected a positive integer, got {value!r}")


def plan_episodes(
    tasks: Iterable[Task], policies: Sequence[Policy], run_id: str, seed: int
) -> list[tuple[str, Task, Policy]]:
    """(episode id, task, policy) for every pair; a pair planned twice would share an id."""
    plan, seen = [], set()
    for task in tasks:
        for policy in policies:
            eid = schema.episode_id(run_id, task.task_id, policy.name, seed)
            if eid in seen:
                raise InputError("tasks", "task_id", f"episode ({task.task_id!r}, {policy.name!r}) planned "
                                 "twice: task ids and policy names must be unique")
            seen.add(eid)
            plan.append((eid, task, policy))
    return plan


async def collect(
    tasks: Sequence[Task], policies: Sequence[Policy], env: Environment, workers: Mapping[str, Worker],
    book: PriceBook, budget_usd: float, turn_limit: int, out_dir: str | Path, run_id: str, seed: int,
    concurrency: int, progress: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every planned (task, policy) episode not yet journaled, `concurrency` at a time, then write
    out_dir/episodes.parquet and out_dir/turns.parquet holding exactly the planned episodes."""
    check_settings(budget_usd, turn_limit, concurrency)
    plan = plan_episodes(tasks, policies, run_id, seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done = await run_planned(plan, env, workers, book, budget_usd, turn_limit, out_dir / JOURNAL_NAME, run_id,
                             seed, concurrency, progress)
    return write_tables([done[eid] for eid, _, _ in plan], out_dir)


async def run_planned(
    plan: Sequence[tuple[str, Task, Policy]], env: Environment, workers: Mapping[str, Worker], book: PriceBook,
    budget_usd: float, turn_limit: int, journal_path: Path, run_id: str, seed: int, concurrency: int,
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Run the planned episodes `journal_path` lacks, appending each as it finishes; returns the
    journal's entries by id. Split from `collect` so a shard (routerops.shards) runs any subset of a
    plan, which is no longer a tasks x policies product."""
    check_settings(budget_usd, turn_limit, concurrency)
    done = read_journal(journal_path)
    settings = {"budget_usd": float(budget_usd), "turn_limit": int(turn_limit), "price_book_version": book.version}
    for eid, _, policy in plan:
        if eid in done:
            check_resumable(journal_path, done[eid], {**settings, "policy_version": str(policy.version)})
    todo = [(task, policy) for eid, task, policy in plan if eid not in done]
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(plan), initial=len(plan) - len(todo), desc="episodes", disable=not progress)

    writing = asyncio.Lock()  # one append at a time, so lines never interleave

    async def run_one(task: Task, policy: Policy, journal) -> None:
        async with gate:
            episode, turns = await run_episode(
                task, policy, env, workers, book, budget_usd, turn_limit, run_id, seed)
        async with writing:  # fsync in a thread: the other episodes' calls go on meanwhile
            await asyncio.to_thread(append_journal, journal, episode, turns)
        done[episode["episode_id"]] = {"episode": episode, "turns": turns}
        bar.update(1)

    try:
        with open(journal_path, "ab") as journal:
            async with asyncio.TaskGroup() as group:
                for task, policy in todo:
                    group.create_task(run_one(task, policy, journal))
    finally:
        bar.close()
    return done


def write_tables(entries: list[dict[str, Any]], out_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Episodes in the order given (plan order), turns by episode then turn index; each file replaced
    atomically."""
    episodes = pd.DataFrame([e["episode"] for e in entries], columns=schema.EPISODE_SCHEMA.names)
    turns = pd.DataFrame([t for e in entries for t in e["turns"]], columns=schema.TURN_SCHEMA.names)
    schema.write_table(episodes, out_dir / "episodes.parquet", "episodes")
    schema.write_table(turns, out_dir / "turns.parquet", "turns")
    return episodes, turns


def collect_sync(*args: Any, **kwargs: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`collect` for callers without an event loop (Prefect tasks, DVC stages, the CLI); the workers'
    HTTP clients are closed on the collection's own loop before it ends."""
    workers = kwargs["workers"] if "workers" in kwargs else args[3]
    return run_closing(collect(*args, **kwargs), workers.values())
