"""Sharded collection: one plan split across workers (processes or machines), exactly once.

A plan (routerops.rollout.plan_episodes) is split into N shards by a stable hash of the episode id,
so every worker that is handed the same plan and N computes the same split without talking to the
others. Each shard is collected by the journaled engine (rollout.run_planned) into its own folder,
`out_dir/shard-K-of-N/journal.jsonl`, under an exclusive lock on `out_dir/shard-K-of-N/lock`:

- a worker killed mid-shard leaves a journal of finished episodes (at most a torn last line, which
  read_journal cuts off); whoever reruns the shard resumes from it, so no finished episode runs twice;
- two workers handed the same shard at once (a scheduler that thought the first one dead) never run
  it side by side: the second waits for the lock, then finds the episodes journaled;
- `merge_shards` reads every shard's journal and writes the tables only if their union is exactly
  the plan: a missing episode names its shard, an episode in two shards is an error.

The lock is `flock(2)`, released by the kernel when its holder dies; across machines the out_dir
must be on a file system whose flock every node honours (NFSv4 and Lustre do; plain NFSv3 does not).
With N = 1 the single shard is out_dir itself, so an unsharded collection keeps its journal where it
always was.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from routerops.errors import InputError, RouteropsError
from routerops.pricing import PriceBook
from routerops.rollout import JOURNAL_NAME, check_resumable, read_journal, run_planned, write_tables
from routerops.types import Environment, Policy, Task, Worker

LOCK_NAME = "lock"
LOCK_POLL_S = 0.2

Plan = Sequence[tuple[str, Task, Policy]]


class ShardBusyError(RouteropsError):
    """Another worker held a shard's lock for longer than this worker would wait."""


def check_shard_count(n_shards: int) -> None:
    if isinstance(n_shards, bool) or not isinstance(n_shards, int) or n_shards < 1:
        raise InputError("collect settings", "shards", f"expected a positive integer, got {n_shards!r}")


def shard_key(episode_id: str) -> str:
    """Where an episode sorts when the plan is dealt into shards. sha256, not hash(): Python salts
    str hashes per process, and every worker must compute the same split."""
    return hashlib.sha256(episode_id.encode()).hexdigest()


def split_plan(plan: Plan, n_shards: int) -> list[list[tuple[str, Task, Policy]]]:
    """The plan dealt round-robin into `n_shards` shards in shard_key order: deterministic, disjoint,
    together exactly the plan, sizes differing by at most one (so none is empty while the plan has
    at least n_shards episodes). Within a shard, episodes keep their plan order."""
    check_shard_count(n_shards)
    position = {eid: i for i, eid in enumerate(sorted((eid for eid, _, _ in plan), key=shard_key))}
    shards: list[list[tuple[str, Task, Policy]]] = [[] for _ in range(n_shards)]
    for item in plan:
        shards[position[item[0]] % n_shards].append(item)
    return shards


def shard_dir(out_dir: str | Path, shard: int, n_shards: int) -> Path:
    """The shard's folder. The shard count is in the name: a split into another N is another split,
    so its journals never mix with this one's."""
    out_dir = Path(out_dir)
    return out_dir if n_shards == 1 else out_dir / f"shard-{shard}-of-{n_shards}"


@contextlib.contextmanager
def shard_lock(folder: Path, wait_s: float) -> Iterator[None]:
    """Hold the shard's exclusive lock; waits up to `wait_s` for a holder to finish or die."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    with open(path, "a+") as fh:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    fh.seek(0)
                    raise ShardBusyError(f"{path}: held by {fh.read().strip() or 'another worker'} for over "
                                         f"{wait_s:.0f}s; is a worker stuck on this shard?") from None
                time.sleep(LOCK_POLL_S)
        # Who holds it, for the message above and for people looking at a stuck collection.
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}) + "\n")
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def lock_holder(out_dir: str | Path, shard: int, n_shards: int) -> dict[str, Any]:
    """The host and pid that last took the shard's lock ({} if none has)."""
    path = shard_dir(out_dir, shard, n_shards) / LOCK_NAME
    text = path.read_text().strip() if path.exists() else ""
    return json.loads(text) if text else {}


async def collect_shard(
    plan: Plan, shard: int, n_shards: int, env: Environment, workers: Mapping[str, Worker], book: PriceBook,
    budget_usd: float, turn_limit: int, out_dir: str | Path, run_id: str, seed: int, concurrency: int,
    lock_wait_s: float = 3600.0, progress: bool = True,
) -> int:
    """Collect shard `shard` of `n_shards` of the plan into its own journal; returns its episode
    count. Safe to run again, anywhere the out_dir is reachable: it resumes from the journal."""
    check_shard_count(n_shards)
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < n_shards:
        raise InputError("collect settings", "shard", f"expected 0 <= shard < {n_shards}, got {shard!r}")
    mine = split_plan(plan, n_shards)[shard]
    folder = shard_dir(out_dir, shard, n_shards)
    with shard_lock(folder, lock_wait_s):
        await run_planned(mine, env, workers, book, budget_usd, turn_limit, folder / JOURNAL_NAME, run_id, seed,
                          concurrency, progress)
    return len(mine)


def merge_shards(
    plan: Plan, n_shards: int, out_dir: str | Path, book: PriceBook, budget_usd: float, turn_limit: int,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The shards' journals as out_dir/episodes.parquet and turns.parquet, in plan order; only when
    together they hold exactly the planned episodes, each in the one shard the split gave it."""
    out_dir = Path(out_dir)
    parts = split_plan(plan, n_shards)
    assigned = {eid: shard for shard, part in enumerate(parts) for eid, _, _ in part}
    settings = {"budget_usd": float(budget_usd), "turn_limit": int(turn_limit), "price_book_version": book.version}
    entries: dict[str, dict[str, Any]] = {}
    for shard, part in enumerate(parts):
        journal = shard_dir(out_dir, shard, n_shards) / JOURNAL_NAME
        found = read_journal(journal)
        check_only_own_episodes(journal, found, assigned, shard, n_shards)
        missing = [eid for eid, _, _ in part if eid not in found]
        if missing:
            raise InputError(journal, "episode_id", f"shard {shard} of {n_shards} lacks {len(missing)} of its "
                             f"{len(part)} planned episodes (first {missing[0]}); rerun that shard")
        for eid, _, policy in part:
            check_resumable(journal, found[eid], {**settings, "policy_version": str(policy.version)})
            entries[eid] = found[eid]
    return write_tables([entries[eid] for eid, _, _ in plan], out_dir)


def check_only_own_episodes(journal: Path, found: Mapping[str, Any], assigned: Mapping[str, int], shard: int,
                            n_shards: int) -> None:
    """A journal holding a planned episode the split gives to another shard means some worker split
    the plan differently: that episode may be in two journals, so the merge refuses rather than pick
    one. (Entries of other runs, not in the plan, are ignored, as an unsharded rerun ignores them.)"""
    for eid in found:
        if eid in assigned and assigned[eid] != shard:
            raise InputError(journal, "episode_id", f"episode {eid} is journaled by shard {shard} of {n_shards}, "
                             f"but the split gives it to shard {assigned[eid]}: the plan was not split the same "
                             "way everywhere")
