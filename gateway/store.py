"""The gateway's database: API keys, per-key budgets, and the decision log (SQLAlchemy Core).

An SQLite file by default; any SQLAlchemy URL (`postgresql+psycopg://...`) switches the backend.

Keys are `rk-<key_id>-<secret>`; only sha256(key) is stored, so a stolen database gives no usable key.
Money is kept as integer nano-USD (1e-9 USD): sums of many tiny per-token costs stay exact, and the
budget comparison in the reservation is exact too.

Budgets (per key, per period: hour, day, month or total). Before a call the gateway *reserves* the
call's worst-case cost with one conditional UPDATE

    UPDATE gateway_spend SET reserved = reserved + :worst
     WHERE key_id = :k AND period = :p AND spent + reserved + :worst <= :budget

which the database applies atomically, so concurrent requests cannot together pass the budget.
After the call it *settles*: the reservation is released and the real cost (from the worker's token
counts, never more than the worst case) is added to `spent`.

Decision log: one row per routed request (`gateway_decisions`, schema in DECISION_COLUMNS below and in
the README), readable back as bandit feedback (`read_decisions`): the worker that was called, the
propensity of that choice under the serving policy, its tokens and cost, and a score once graded.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import secrets
import threading
from dataclasses import dataclass
from typing import Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from routerops.errors import InputError

NANO = 1_000_000_000  # nano-USD per USD
PERIODS = ("hour", "day", "month", "total")
KEY_PREFIX = "rk"

metadata = sa.MetaData()
keys_table = sa.Table(
    "gateway_keys", metadata,
    sa.Column("key_id", sa.String(32), primary_key=True),  # public part of the key, safe to log
    sa.Column("key_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("name", sa.String(200), nullable=False, default=""),
    sa.Column("budget_nusd", sa.BigInteger, nullable=False),
    sa.Column("period", sa.String(16), nullable=False),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.Column("revoked", sa.Boolean, nullable=False, default=False),
)
spend_table = sa.Table(
    "gateway_spend", metadata,
    sa.Column("key_id", sa.String(32), primary_key=True),
    sa.Column("period", sa.String(32), primary_key=True),  # the period's start, e.g. 2026-11-03
    sa.Column("spent_nusd", sa.BigInteger, nullable=False, default=0),
    sa.Column("reserved_nusd", sa.BigInteger, nullable=False, default=0),
)
decisions_table = sa.Table(
    "gateway_decisions", metadata,
    sa.Column("decision_id", sa.String(40), primary_key=True),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.Column("key_id", sa.String(32), nullable=False),
    sa.Column("router", sa.String(200), nullable=False),  # registered name
    sa.Column("router_version", sa.String(32), nullable=False),
    sa.Column("price_book_version", sa.String(100), nullable=False),
    sa.Column("query_id", sa.String(64), nullable=False),
    sa.Column("query", sa.Text, nullable=False),  # "" when the gateway is told not to log texts
    sa.Column("chosen", sa.String(200), nullable=False),  # the router's choice
    sa.Column("worker", sa.String(200), nullable=False),  # who answered ("" if none did)
    sa.Column("propensity", sa.Float, nullable=False),  # P(chosen | query) under the serving policy
    sa.Column("explanation", sa.Text, nullable=False),  # JSON: candidates, budget, λ, attempts
    sa.Column("status", sa.String(32), nullable=False),  # ok | worker_error | client_gone
    sa.Column("prompt_tokens", sa.Integer, nullable=False, default=0),
    sa.Column("completion_tokens", sa.Integer, nullable=False, default=0),
    sa.Column("cost_usd", sa.Float, nullable=False, default=0.0),
    sa.Column("usage_source", sa.String(16), nullable=False, default="worker"),  # worker | estimated
    sa.Column("response", sa.Text, nullable=False, default=""),
    sa.Column("latency_s", sa.Float, nullable=False, default=0.0),
    sa.Column("score", sa.Float, nullable=True),  # filled by POST /v1/decisions/{id}/feedback
)
DECISION_COLUMNS = tuple(c.name for c in decisions_table.columns)
# INSERT ... ON CONFLICT DO NOTHING, where the database has it (see Store._ensure_spend_row).
INSERT_IF_ABSENT = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


def to_nano(usd: float) -> int:
    return int(round(float(usd) * NANO))


def to_usd(nusd: int) -> float:
    return int(nusd) / NANO


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def period_start(period: str, now: dt.datetime | None = None) -> str:
    """The start of the budget period `now` falls in (UTC), as text: the spend row's key."""
    now = now or dt.datetime.now(dt.timezone.utc)
    if period == "hour":
        return now.strftime("%Y-%m-%dT%H")
    if period == "day":
        return now.strftime("%Y-%m-%d")
    if period == "month":
        return now.strftime("%Y-%m")
    return "total"


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


class BudgetRefused(Exception):
    """The key's remaining budget does not cover the call's worst-case cost."""


class Store:
    """Keys, budgets and decisions in one database (thread-safe: SQLAlchemy pools connections)."""

    def __init__(self, url: str):
        if not isinstance(url, str) or "://" not in url:
            raise InputError("gateway config", "db_url", f"expected an SQLAlchemy URL such as sqlite:///gateway.db, "
                                                          f"got {url!r}")
        args = {"connect_args": {"timeout": 30, "check_same_thread": False}} if url.startswith("sqlite") else {}
        self.engine = sa.create_engine(url, **args)
        if url.startswith("sqlite"):
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        self._lock = threading.Lock()  # SQLite: one writer at a time in this process (no busy retries)
        metadata.create_all(self.engine)

    # ---------------------------------------------------------------- keys

    def create_key(self, budget_usd: float, period: str, name: str = "") -> tuple[str, KeyInfo]:
        """A new key and its record; the key itself is returned once and never stored."""
        if period not in PERIODS:
            raise InputError("command line", "--period", f"{period!r} is not one of {PERIODS}")
        if not (isinstance(budget_usd, (int, float)) and budget_usd >= 0 and budget_usd < 1e9):
            raise InputError("command line", "--budget-usd", f"expected a number ≥ 0, got {budget_usd!r}")
        key_id = secrets.token_hex(6)
        key = f"{KEY_PREFIX}-{key_id}-{secrets.token_urlsafe(24)}"
        with self.engine.begin() as conn:
            conn.execute(keys_table.insert().values(
                key_id=key_id, key_sha256=hash_key(key), name=name, budget_nusd=to_nano(budget_usd), period=period,
                created_at=dt.datetime.now(dt.timezone.utc).isoformat(), revoked=False))
        return key, KeyInfo(key_id, name, float(budget_usd), period)

    def lookup(self, key: str) -> KeyInfo | None:
        """The key's record, or None for an unknown or revoked key (compared by hash only)."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(keys_table).where(keys_table.c.key_sha256 == hash_key(key))).first()
        if row is None or row.revoked:
            return None
        return KeyInfo(row.key_id, row.name, to_usd(row.budget_nusd), row.period)

    # ---------------------------------------------------------------- budgets

    def remaining_usd(self, key: KeyInfo) -> float:
        """Budget left in the current period, net of what is reserved by calls in flight."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(spend_table).where(
                spend_table.c.key_id == key.key_id, spend_table.c.period == period_start(key.period))).first()
        used = 0 if row is None else row.spent_nusd + row.reserved_nusd
        return max(to_usd(to_nano(key.budget_usd) - used), 0.0)

    def spend(self, key_id: str, period: str) -> tuple[float, float]:
        """(spent, reserved) USD of a key in one period (its start, e.g. "2026-11-03")."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(spend_table).where(
                spend_table.c.key_id == key_id, spend_table.c.period == period)).first()
        return (0.0, 0.0) if row is None else (to_usd(row.spent_nusd), to_usd(row.reserved_nusd))

    def reserve(self, key: KeyInfo, worst_usd: float) -> Reservation:
        """Hold `worst_usd` of the key's budget, or raise BudgetRefused; atomic (see module docstring)."""
        period, worst = period_start(key.period), to_nano(worst_usd)
        with self._lock, self.engine.begin() as conn:
            self._ensure_spend_row(conn, key.key_id, period)
            done = conn.execute(spend_table.update().where(
                spend_table.c.key_id == key.key_id, spend_table.c.period == period,
                spend_table.c.spent_nusd + spend_table.c.reserved_nusd + worst <= to_nano(key.budget_usd),
            ).values(reserved_nusd=spend_table.c.reserved_nusd + worst))
        if done.rowcount != 1:
            raise BudgetRefused(period)
        return Reservation(key.key_id, period, worst)

    def resize(self, held: Reservation, worst_usd: float, budget_usd: float) -> Reservation:
        """Change a reservation's amount (a fallback worker may cost more), under the same rule."""
        worst = to_nano(worst_usd)
        delta = worst - held.nusd
        with self._lock, self.engine.begin() as conn:
            done = conn.execute(spend_table.update().where(
                spend_table.c.key_id == held.key_id, spend_table.c.period == held.period,
                spend_table.c.spent_nusd + spend_table.c.reserved_nusd + delta <= to_nano(budget_usd),
            ).values(reserved_nusd=spend_table.c.reserved_nusd + delta))
        if done.rowcount != 1:
            raise BudgetRefused(held.period)
        return Reservation(held.key_id, held.period, worst)

    def settle(self, held: Reservation, cost_usd: float, decision: dict[str, Any] | None = None) -> None:
        """Release the reservation and charge the real cost, capped at what was reserved: the cap
        is what makes the reservation a guarantee (a worker over-reporting tokens cannot overspend).
        `decision` is logged in the same transaction (one commit per request end)."""
        charge = min(to_nano(cost_usd), held.nusd)
        with self._lock, self.engine.begin() as conn:
            conn.execute(spend_table.update().where(
                spend_table.c.key_id == held.key_id, spend_table.c.period == held.period,
            ).values(reserved_nusd=spend_table.c.reserved_nusd - held.nusd,
                     spent_nusd=spend_table.c.spent_nusd + charge))
            if decision is not None:
                conn.execute(decisions_table.insert().values(**_decision_row(decision)))

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
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(decisions_table).where(
                decisions_table.c.decision_id == decision_id)).first()
        if row is None:
            return None
        record = dict(row._mapping)
        record["explanation"] = json.loads(record["explanation"])
        return record

    def record_score(self, decision_id: str, score: float) -> bool:
        """Grade a logged decision (1/0 or a score in [0, 1]); False if there is no such decision."""
        with self._lock, self.engine.begin() as conn:
            done = conn.execute(decisions_table.update().where(
                decisions_table.c.decision_id == decision_id).values(score=float(score)))
        return done.rowcount == 1


def _decision_row(record: dict[str, Any]) -> dict[str, Any]:
    row = {k: record[k] for k in DECISION_COLUMNS if k in record}
    row["explanation"] = json.dumps(record.get("explanation", {}), sort_keys=True)
    return row


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    """WAL: readers never wait for the writer; synchronous=NORMAL: a commit does not fsync (WAL
    checkpoints do), which survives a crash of the gateway, not of the machine's power; measured by
    benchmarks/gateway_overhead.py, three fsyncs per request capped the gateway far below 50 req/s."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def read_decisions(url: str, graded_only: bool = False) -> pd.DataFrame:
    """The decision log as bandit feedback: one row per routed request, with the logged-outcome
    columns (docs/replay_format.md: dataset, query_id, query, worker, score, prompt_tokens,
    completion_tokens, response) plus `propensity`, `chosen`, `router_version`, `decision_id`.
    Only one worker per query is observed, so it is not a complete grid: an off-policy estimate
    (e.g. inverse propensity weighting) reads it, not `load_logged_outcomes`."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        frame = pd.read_sql(sa.select(decisions_table).where(decisions_table.c.worker != ""), conn)
    engine.dispose()
    frame.insert(0, "dataset", "gateway")
    if graded_only:
        frame = frame[frame.score.notna()].reset_index(drop=True)
    return frame
