"""The gateway's database: API keys, per-key budgets, and the decision log (SQLAlchemy Core).

An SQLite file by default; any SQLAlchemy URL (`postgresql+psycopg://...`) switches the backend.

Keys are `rk-<key_id>-<secret>` with a 192-bit random secret; only sha256(key) is stored, so a stolen
database gives no usable key (a fast hash is enough for a high-entropy key: there is no password to
guess). A key verified against the database is remembered in memory, by its hash, for
`key_cache_s` (5 s): revoking a key or changing its budget reaches a running gateway within that time.
Money is kept as integer nano-USD (1e-9 USD): sums of many tiny per-token costs stay exact, and the
budget comparison in the reservation is exact too.

Budgets (per key, per period: hour, day, month or total). Before a call the gateway *reserves* the
call's worst-case cost with one conditional UPDATE

    UPDATE gateway_spend SET reserved = reserved + :worst
     WHERE key_id = :k AND period = :p AND spent + reserved + :worst <= :budget

which the database applies atomically, so concurrent requests cannot together pass the budget.
After the call it *settles*: the reservation is released and the real cost (from the worker's token
counts) is added to `spent`. The reservation bounds every token the worker can bill (gateway/routing.py),
so the cost is normally within it; a worker that bills more (a chat template longer than the bound
allows, a miscounting server) is still charged what it billed, since the money is spent: the excess
is an *overrun*, recorded in `gateway_overruns` (and the decision's explanation). Charging it takes
the key's spend past its budget by at most that overrun (the reservation rule held for everything
else in flight), and the key's next reservation sees it; only requests already in flight at that
moment can add theirs.

One thread per Store runs every database operation, in the order they were asked for (FIFO): the
gateway's event loop never waits on the database, SQLite sees one writer per process, and a read
asked for after a write sees it. The gateway does not wait for a settlement (and its decision-log
row): the answer goes out while the thread writes; until then the reservation still holds the worst
case, so a late settlement only ever under-states what is left. `Store.close()` (the app's shutdown,
and an exit hook) runs every queued write before it returns: nothing queued is lost on shutdown; a
killed process (SIGKILL, power loss) loses the settlements still queued.

Holds. Each reservation is also a row of `gateway_holds` (written in the reservation's transaction,
deleted in its settlement's) with a lease, `hold_lease_s` (an hour by default, far longer than any
request). A hold whose lease has run out belongs to a process that died before settling it: any
gateway sharing the database releases it (`release_expired_holds`, at its first reservation and
then every SWEEP_EVERY_S), so a crash withholds budget for one lease at most, never for good. Whoever deletes
the hold row releases its amount, once: a settlement that finds its hold already swept (a request
that outlived its lease) charges the cost and releases nothing. The statements are built once
(SQLAlchemy compiles them once and caches them), not per call.

Decision log: one row per routed request (`gateway_decisions`, its schema in routerops/decision_log.py
and the README), readable back as bandit feedback (`read_decisions`, there too, below the gateway and
evaluation both): the worker that was called, the
propensity of that choice under the serving policy, its tokens and cost, and a score once graded.
"""

from __future__ import annotations

import asyncio
import atexit
import datetime as dt
import json
import logging
import queue
import secrets
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

import sqlalchemy as sa

# The tables and helpers, importable from here as before (gateway/keys.py, the tests).
from gateway.tables import (NANO, PERIODS, HOLD_LEASE_S, INSERT_IF_ABSENT, KEY_CACHE_S, KEY_PREFIX,  # noqa: F401
                            STATEMENTS, SWEEP_EVERY_S, add_columns, hash_key, holds_table, keys_table,
                            overruns_table, period_start, spend_table, to_nano, to_usd)
from routerops.decision_log import (DECISION_COLUMNS, LATER_DECISION_COLUMNS, decisions_table, metadata, now_iso,
                                    read_decisions)  # noqa: F401 (read_decisions: imported from here too)
from routerops.errors import InputError

log = logging.getLogger(__name__)
@dataclass(frozen=True)
class KeyInfo:
    key_id: str
    name: str
    budget_usd: float
    period: str


@dataclass(frozen=True)
class Reservation:
    key_id: str
    period: str
    nusd: int
    hold_id: str = ""


class BudgetRefused(Exception):
    """The key's remaining budget does not cover the call's worst-case cost."""


class Store:
    """Keys, budgets and decisions in one database; every operation runs on the store's own thread
    (see the module docstring), so a Store is safe to share between threads and event loops."""

    def __init__(self, url: str, key_cache_s: float = KEY_CACHE_S, hold_lease_s: float = HOLD_LEASE_S):
        if not isinstance(url, str) or "://" not in url:
            raise InputError("gateway config", "db_url", f"expected an SQLAlchemy URL such as sqlite:///gateway.db, "
                                                          f"got {url!r}")
        args = {"connect_args": {"timeout": 30, "check_same_thread": False}} if url.startswith("sqlite") else {}
        self.engine = sa.create_engine(url, **args)
        if url.startswith("sqlite"):
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        for attempt in range(5):  # several processes (`gateway serve --workers N`) may create the tables at once
            try:
                metadata.create_all(self.engine)
                break
            except sa.exc.DBAPIError:
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
        add_columns(self.engine, decisions_table, LATER_DECISION_COLUMNS)
        self.key_cache_s = key_cache_s
        if not hold_lease_s > 0:
            raise InputError("gateway config", "hold_lease_s", f"expected a number > 0, got {hold_lease_s!r}")
        self.hold_lease_s = float(hold_lease_s)
        self._next_sweep = 0.0  # time.monotonic() of the next look for expired holds (0: the first reservation)
        self._keys: dict[str, tuple[KeyInfo, float]] = {}  # sha256 → (verified record, until when)
        self._spend_rows: set[tuple[str, str]] = set()  # (key, period) rows known to exist
        self._ops: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        atexit.register(_close_store, weakref.ref(self))  # at exit: run what is queued
        weakref.finalize(self, self._ops.put, None).atexit = False  # collected: let its thread end

    # ---------------------------------------------------------------- the database thread

    def submit(self, fn: Callable[[sa.Connection], Any]) -> Future:
        """Run `fn(connection)` in one transaction on the store's thread, after every operation asked
        for before it; the future holds its result."""
        future: Future = Future()
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=_serve, args=(self.engine, self._ops),
                                                name="gateway-store", daemon=True)
                self._thread.start()
            self._ops.put((fn, future))
        return future

    def run(self, fn: Callable[[sa.Connection], Any]) -> Any:
        return self.submit(fn).result()

    async def arun(self, fn: Callable[[sa.Connection], Any]) -> Any:
        return await asyncio.wrap_future(self.submit(fn))

    def close(self) -> None:
        """Run every queued operation, then stop the thread (a later operation starts a new one)."""
        with self._thread_lock:
            thread, self._thread = self._thread, None
            if thread is not None and thread.is_alive():
                self._ops.put(None)
                thread.join()

    # ---------------------------------------------------------------- keys

    def create_key(self, budget_usd: float, period: str, name: str = "") -> tuple[str, KeyInfo]:
        """A new key and its record; the key itself is returned once and never stored."""
        if period not in PERIODS:
            raise InputError("command line", "--period", f"{period!r} is not one of {PERIODS}")
        if not (isinstance(budget_usd, (int, float)) and budget_usd >= 0 and budget_usd < 1e9):
            raise InputError("command line", "--budget-usd", f"expected a number ≥ 0, got {budget_usd!r}")
        key_id = secrets.token_hex(6)
        key = f"{KEY_PREFIX}-{key_id}-{secrets.token_urlsafe(24)}"
        self.run(lambda conn: conn.execute(keys_table.insert().values(
            key_id=key_id, key_sha256=hash_key(key), name=name, budget_nusd=to_nano(budget_usd), period=period,
            created_at=dt.datetime.now(dt.timezone.utc).isoformat(), revoked=False)))
        return key, KeyInfo(key_id, name, float(budget_usd), period)

    def lookup(self, key: str) -> KeyInfo | None:
        """The key's record, or None for an unknown or revoked key (compared by hash only)."""
        digest = hash_key(key)
        return self._cached_key(digest) or self._remember(digest, self.run(lambda conn: _lookup(conn, digest)))

    async def alookup(self, key: str) -> KeyInfo | None:
        """lookup() for the event loop: a key verified in the last key_cache_s costs one sha256."""
        digest = hash_key(key)
        return self._cached_key(digest) or self._remember(digest, await self.arun(lambda conn: _lookup(conn, digest)))

    def _cached_key(self, digest: str) -> KeyInfo | None:
        held = self._keys.get(digest)
        return held[0] if held is not None and held[1] > time.monotonic() else None

    def _remember(self, digest: str, info: KeyInfo | None) -> KeyInfo | None:
        if info is not None and self.key_cache_s > 0:  # only verified keys; an unknown key is asked every time
            if len(self._keys) > 100_000:
                self._keys.clear()
            self._keys[digest] = (info, time.monotonic() + self.key_cache_s)
        return info

    # ---------------------------------------------------------------- budgets

    def remaining_usd(self, key: KeyInfo) -> float:
        """Budget left in the current period, net of what is reserved by calls in flight."""
        return self.run(self._remaining(key))

    async def aremaining_usd(self, key: KeyInfo) -> float:
        return await self.arun(self._remaining(key))

    @staticmethod
    def _remaining(key: KeyInfo) -> Callable[[sa.Connection], float]:
        args = {"b_key": key.key_id, "b_period": period_start(key.period)}

        def remaining(conn: sa.Connection) -> float:
            row = conn.execute(STATEMENTS["spend"], args).first()
            used = 0 if row is None else row.spent_nusd + row.reserved_nusd
            return max(to_usd(to_nano(key.budget_usd) - used), 0.0)
        return remaining

    def spend(self, key_id: str, period: str) -> tuple[float, float]:
        """(spent, reserved) USD of a key in one period (its start, e.g. "2026-11-03")."""
        row = self.run(lambda conn: conn.execute(STATEMENTS["spend"], {"b_key": key_id, "b_period": period}).first())
        return (0.0, 0.0) if row is None else (to_usd(row.spent_nusd), to_usd(row.reserved_nusd))

    def reserve(self, key: KeyInfo, worst_usd: float) -> Reservation:
        """Hold `worst_usd` of the key's budget, or raise BudgetRefused; atomic (see module docstring)."""
        held, reserve = self._reserve(key, worst_usd)
        return self._reserved(held, self.run(reserve))

    async def areserve(self, key: KeyInfo, worst_usd: float) -> Reservation:
        held, reserve = self._reserve(key, worst_usd)
        return self._reserved(held, await self.arun(reserve))

    def _reserve(self, key: KeyInfo, worst_usd: float) -> tuple[Reservation, Callable[[sa.Connection], int]]:
        self._sweep_if_due()
        held = Reservation(key.key_id, period_start(key.period), to_nano(worst_usd), secrets.token_hex(16))
        args = {"b_key": held.key_id, "b_period": held.period, "b_amount": held.nusd,
                "b_budget": to_nano(key.budget_usd)}
        hold = {"hold_id": held.hold_id, "key_id": held.key_id, "period": held.period, "nusd": held.nusd,
                "expires_at": time.time() + self.hold_lease_s}
        known = (held.key_id, held.period) in self._spend_rows

        def reserve(conn: sa.Connection) -> int:
            if not known:
                self._ensure_spend_row(conn, held.key_id, held.period)
            rowcount = conn.execute(STATEMENTS["hold"], args).rowcount
            if rowcount == 1:
                conn.execute(STATEMENTS["open_hold"], hold)
            return rowcount
        return held, reserve

    def _reserved(self, held: Reservation, rowcount: int) -> Reservation:
        if rowcount != 1:
            raise BudgetRefused(held.period)
        self._spend_rows.add((held.key_id, held.period))  # committed: the row exists from now on
        return held

    def resize(self, held: Reservation, worst_usd: float, budget_usd: float) -> Reservation:
        """Change a reservation's amount (a fallback worker may cost more), under the same rule."""
        return self._resized(held, worst_usd, self.run(self._resize(held, worst_usd, budget_usd)))

    async def aresize(self, held: Reservation, worst_usd: float, budget_usd: float) -> Reservation:
        return self._resized(held, worst_usd, await self.arun(self._resize(held, worst_usd, budget_usd)))

    def _resize(self, held: Reservation, worst_usd: float, budget_usd: float) -> Callable[[sa.Connection], int]:
        new_nusd = to_nano(worst_usd)
        hold = {"b_hold": held.hold_id, "b_nusd": new_nusd, "b_expires": time.time() + self.hold_lease_s}

        def resize(conn: sa.Connection) -> int:
            # The hold's UPDATE comes first: it locks the row, so a sweep on another replica waits for this
            # transaction. A hold already swept (the request outlived its lease) holds nothing: reserve
            # all of the new amount again.
            kept = conn.execute(STATEMENTS["resize_hold"], hold).rowcount == 1
            args = {"b_key": held.key_id, "b_period": held.period, "b_budget": to_nano(budget_usd),
                    "b_amount": new_nusd - held.nusd if kept else new_nusd}
            rowcount = conn.execute(STATEMENTS["hold"], args).rowcount
            if rowcount != 1 and kept:  # refused: the hold keeps its old amount
                conn.execute(STATEMENTS["resize_hold"], {**hold, "b_nusd": held.nusd})
            elif rowcount == 1 and not kept:
                conn.execute(STATEMENTS["open_hold"], {"hold_id": held.hold_id, "key_id": held.key_id,
                                                       "period": held.period, "nusd": new_nusd,
                                                       "expires_at": hold["b_expires"]})
            return rowcount
        return resize

    @staticmethod
    def _resized(held: Reservation, worst_usd: float, rowcount: int) -> Reservation:
        if rowcount != 1:
            raise BudgetRefused(held.period)
        return Reservation(held.key_id, held.period, to_nano(worst_usd), held.hold_id)

    def settle(self, held: Reservation, cost_usd: float, decision: dict[str, Any] | None = None) -> None:
        """Release the reservation and charge the real cost, even above what was reserved (an
        overrun, recorded in gateway_overruns: module docstring). `decision` is logged in the same
        transaction (one commit per request end)."""
        self.settle_later(held, cost_usd, decision).result()

    def settle_later(self, held: Reservation, cost_usd: float, decision: dict[str, Any] | None = None) -> Future:
        """settle(), queued: returns at once; the store's thread writes it before any operation
        asked for later (so a later reservation or read sees it), and close() waits for it."""
        charge = to_nano(cost_usd)
        args = {"b_key": held.key_id, "b_period": held.period, "b_amount": held.nusd, "b_charge": charge}
        row = _decision_row(decision) if decision is not None else None
        overrun = None
        if charge > held.nusd:
            overrun = {"hold_id": held.hold_id or secrets.token_hex(16), "key_id": held.key_id, "period": held.period,
                       "decision_id": (decision or {}).get("decision_id", ""), "reserved_nusd": held.nusd,
                       "charged_nusd": charge, "created_at": dt.datetime.now(dt.timezone.utc).isoformat()}

        def settle(conn: sa.Connection) -> None:
            # Whoever deletes the hold releases its amount (module docstring: a swept hold is not released twice).
            closed = not held.hold_id or conn.execute(STATEMENTS["close_hold"], {"b_hold": held.hold_id}).rowcount == 1
            conn.execute(STATEMENTS["settle" if closed else "charge"], args)
            if overrun is not None:
                conn.execute(STATEMENTS["overrun"], overrun)
            if row is not None:
                conn.execute(STATEMENTS["log"], row)
        future = self.submit(settle)
        future.add_done_callback(_log_failure)
        return future

    def release_expired_holds(self, now: float | None = None) -> int:
        """Release every hold whose lease has run out by `now` (Unix time; default: now): a process
        that died before settling it. The number released. Safe with several gateways on one database:
        each hold is released by the one that deletes its row."""
        return self.run(lambda conn: _release_expired(conn, now))

    def _sweep_if_due(self) -> None:
        """Queue a sweep of expired holds every SWEEP_EVERY_S (not waited for: it runs on the store's thread)."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_EVERY_S
            self.submit(_release_expired).add_done_callback(_log_failure)

    @staticmethod
    def _ensure_spend_row(conn: sa.Connection, key_id: str, period: str) -> None:
        """The period's spend row, created once. Several gateway processes may open a period at the same
        moment; the process lock cannot see the others, and a check-then-insert lets two of them insert
        (on Postgres the second fails with a unique violation: tests/services/test_postgres.py found it),
        so the insert itself yields to a row that is already there."""
        row = {"key_id": key_id, "period": period, "spent_nusd": 0, "reserved_nusd": 0}
        if conn.dialect.name in INSERT_IF_ABSENT:
            conn.execute(INSERT_IF_ABSENT[conn.dialect.name](spend_table).values(**row).on_conflict_do_nothing())
            return
        exists = conn.execute(sa.select(spend_table.c.key_id).where(
            spend_table.c.key_id == key_id, spend_table.c.period == period)).first()
        if exists is None:
            conn.execute(spend_table.insert().values(**row))

    # ---------------------------------------------------------------- decisions

    def decision(self, decision_id: str) -> dict[str, Any] | None:
        row = self.run(lambda conn: conn.execute(sa.select(decisions_table).where(
            decisions_table.c.decision_id == decision_id)).first())
        if row is None:
            return None
        record = dict(row._mapping)
        record["explanation"] = json.loads(record["explanation"])
        return record

    def overruns(self, key_id: str | None = None) -> list[dict[str, Any]]:
        """The recorded overruns (a key's, or all), oldest first, amounts in USD."""
        query = sa.select(overruns_table).order_by(overruns_table.c.created_at)
        if key_id is not None:
            query = query.where(overruns_table.c.key_id == key_id)
        rows = self.run(lambda conn: conn.execute(query).all())
        return [{**dict(r._mapping), "reserved_usd": to_usd(r.reserved_nusd), "charged_usd": to_usd(r.charged_nusd),
                 "overrun_usd": to_usd(r.charged_nusd - r.reserved_nusd)} for r in rows]

    def record_score(self, decision_id: str, score: float) -> bool:
        """Grade a logged decision (1/0 or a score in [0, 1]); False if there is no such decision."""
        graded_at = now_iso()
        return self.run(lambda conn: conn.execute(decisions_table.update().where(
            decisions_table.c.decision_id == decision_id).values(score=float(score), graded_at=graded_at)).rowcount) == 1


def _serve(engine: sa.Engine, ops: queue.SimpleQueue) -> None:
    """A store's thread: each operation in its own transaction, in order, until the None from close()."""
    while (op := ops.get()) is not None:
        fn, future = op
        if not future.set_running_or_notify_cancel():
            continue
        try:
            with engine.begin() as conn:
                result = fn(conn)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(exc)
        else:
            future.set_result(result)


def _release_expired(conn: sa.Connection, now: float | None = None) -> int:
    now = time.time() if now is None else now
    # In one order everywhere: replicas sweeping together lock the rows in the same sequence (no deadlock).
    expired = conn.execute(sa.select(holds_table).where(holds_table.c.expires_at < now)
                           .order_by(holds_table.c.hold_id)).all()
    released = 0
    for hold in expired:
        if conn.execute(STATEMENTS["close_hold"], {"b_hold": hold.hold_id}).rowcount == 1:
            conn.execute(STATEMENTS["settle"], {"b_key": hold.key_id, "b_period": hold.period, "b_amount": hold.nusd,
                                                "b_charge": 0})
            released += 1
    if released:
        log.warning("released %d expired budget holds (a gateway stopped before settling them)", released)
    return released


def _lookup(conn: sa.Connection, digest: str) -> KeyInfo | None:
    row = conn.execute(STATEMENTS["lookup"], {"b_hash": digest}).first()
    if row is None or row.revoked:
        return None
    return KeyInfo(row.key_id, row.name, to_usd(row.budget_nusd), row.period)


def _log_failure(future: Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("could not settle a reservation / log a decision: %s", future.exception())


def _close_store(ref: weakref.ref) -> None:
    store = ref()
    if store is not None:
        store.close()


def _decision_row(record: dict[str, Any]) -> dict[str, Any]:
    row = {k: record[k] for k in DECISION_COLUMNS if k in record}
    row["explanation"] = json.dumps(record.get("explanation", {}), sort_keys=True)
    # Postgres refuses NUL in text, and a refused row would take the settlement's transaction with it
    return {k: v.replace("\x00", "\ufffd") if isinstance(v, str) else v for k, v in row.items()}


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    """WAL: readers never wait for the writer; synchronous=NORMAL: a commit does not fsync (WAL
    checkpoints do), which survives a crash of the gateway, not of the machine's power; measured by
    benchmarks/gateway_overhead.py, three fsyncs per request capped the gateway far below 50 req/s."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
