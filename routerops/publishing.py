"""Publishing a price book or a worker pool: validate, version, store — the start of every retrain
on a price or pool change (`routerops prices publish FILE`, `routerops pool publish FILE`).

A publish store is a folder with one sub-folder per kind (`prices/`, `pool/`): every published
version as `<version>.yaml` (the file's exact bytes), an append-only `history.jsonl`, and
`current.json`, the pointer to the version in force. The pointer is written last and atomically, so a
publish that fails at any point leaves the previous version in force and nothing half-written.

A file is checked against the other kind's version in force before it is stored: a price book must
price every worker of the pool, a pool may only contain workers the price book prices. Bad input
raises InputError naming the file and the field; nothing is published.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from routerops import schema
from routerops.errors import InputError
from routerops.market import resolve_book, resolve_market, resolve_pool
from routerops.pricing import Pool, check_pool_priced

PRICES, POOL = "prices", "pool"
KINDS = (PRICES, POOL)
EVENT_PREFIX = "routerops"  # the Prefect events a publish emits (services/prefect_server.py)
CURRENT = "current.json"
HISTORY = "history.jsonl"


@dataclass(frozen=True)
class Published:
    """One published version of a price book or a pool."""

    kind: str
    version: str
    sha256: str
    path: Path  # the stored copy: <store>/<kind>/<version>.yaml
    source: str  # the file it was published from
    published_at: str

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "path": str(self.path)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Published":
        return cls(**{**raw, "path": Path(raw["path"])})


def current_version(store: Path, kind: str) -> Published | None:
    """The version of `kind` in force, or None when nothing was published yet."""
    pointer = Path(store) / kind / CURRENT
    if not pointer.is_file():
        return None
    published = Published.from_dict(json.loads(pointer.read_text()))
    # The stored copy beside the pointer, wherever the store was published from or is read from now.
    return dataclasses.replace(published, path=Path(store) / kind / f"{published.version}.yaml")


def in_force(store: Path, kind: str, fallback: Path) -> Path:
    """The file of `kind` in force: the published one, else `fallback` (params.yaml's file)."""
    published = current_version(store, kind)
    return published.path if published else Path(fallback)


def pool_version(pool: Pool, sha256: str) -> str:
    """A pool file has no version field: its name plus the first 12 hex digits of its content hash."""
    return f"{pool.name}-{sha256[:12]}"


def versions(book_file: Path, pool_file: Path) -> dict[str, str]:
    """The versions a run records of the price book and pool it used (tags, registry decisions)."""
    return resolve_market(pool_file, book_file).versions()


def publish(kind: str, src: str | Path, store: str | Path, *, pool_file: Path, book_file: Path) -> tuple[Published, bool]:
    """Validate `src`, store it as the new version of `kind` in force; (published, changed).

    `pool_file` / `book_file` are the other kind's file in force (see `in_force`): a price book is
    checked against the pool, a pool against the price book. Publishing the version already in force
    again changes nothing (changed=False) and should trigger nothing.
    """
    if kind not in KINDS:
        raise InputError("publish", "kind", f"expected one of {KINDS}, got {kind!r}")
    src, store = Path(src), Path(store)
    sha = schema.file_sha256(src) if src.is_file() else ""
    if kind == PRICES:
        book = resolve_book(src).book  # raises InputError naming the field
        check_pool_priced(resolve_pool(pool_file), book, src)
        version = book.version
    else:
        pool = resolve_pool(src)
        check_pool_priced(pool, resolve_book(book_file).book, book_file)
        version = pool_version(pool, sha)
    check_version_name(src, version)
    stored = store / kind / f"{version}.yaml"
    if stored.is_file() and schema.file_sha256(stored) != sha:
        raise InputError(src, "version", f"{kind} version {version!r} was already published with other "
                         f"content ({stored}); give the changed file a new version")
    now = current_version(store, kind)
    if now is not None and now.version == version:
        return now, False
    copy_atomic(src, stored)
    published = Published(kind, version, sha, stored, str(src), dt.datetime.now(dt.timezone.utc).isoformat())
    append_history(store / kind / HISTORY, published)
    schema.write_json_atomic(published.to_dict(), store / kind / CURRENT)  # last: the switch itself
    return published, True


def check_version_name(src: Path, version: str) -> None:
    """Versions name files in the store: no path separators or leading dots."""
    if not version or "/" in version or "\\" in version or version.startswith("."):
        raise InputError(src, "version", f"{version!r} cannot name a published file (no '/', '\\' or leading '.')")


def copy_atomic(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as fh:
        fh.write(src.read_bytes())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, dst)


def append_history(path: Path, published: Published) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write(json.dumps(published.to_dict(), sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


# ---------------------------------------------------------------- what changed in a pool


# Spec fields that do not change what a worker answers: how many calls run at once, how long to wait,
# how often to retry, and the numeric attributes routers read as features.
NOT_OUTCOME_FIELDS = ("concurrency", "timeout_s", "max_retries", "attributes")


def worker_signature(pool: Pool, name: str) -> str:
    """Everything that decides a worker's outcomes: its spec and the primitives it runs. Two pools in
    which a worker has the same signature give it the same episodes, so they are collected once."""
    spec = pool.worker(name)
    fields = {k: v for k, v in dataclasses.asdict(spec).items() if k not in NOT_OUTCOME_FIELDS}
    used = sorted({*spec.primitives, *spec.subtask_primitives})
    body = {"spec": fields, "primitives": {p: dataclasses.asdict(pool.primitive(p)) for p in used}}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def pool_changes(old: Pool | None, new: Pool) -> dict[str, list[str]]:
    """Workers added, removed and changed (same name, different signature) from `old` to `new`."""
    if old is None:
        return {"added": list(new.names), "removed": [], "changed": []}
    common = [n for n in new.names if n in old.names]
    return {"added": [n for n in new.names if n not in old.names],
            "removed": [n for n in old.names if n not in new.names],
            "changed": [n for n in common if worker_signature(old, n) != worker_signature(new, n)]}


def published_event_name(kind: str) -> str:
    """`routerops.prices.published` / `routerops.pool.published`: what the retrain triggers expect."""
    return f"{EVENT_PREFIX}.{kind}.published"
