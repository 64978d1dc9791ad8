"""The gateway's budget tables and their statements (gateway/store.py runs them; its docstring says why
each is as it is): API keys (only the key's sha256), spend per key and period, the holds of requests in
flight and the overruns, money as integer nano-USD. The decision log's table is in
routerops/decision_log.py, on the same `metadata`."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from routerops.decision_log import decisions_table, metadata

NANO = 1_000_000_000  # nano-USD per USD
PERIODS = ("hour", "day", "month", "total")
KEY_PREFIX = "rk"

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
holds_table = sa.Table(
    "gateway_holds", metadata,
    sa.Column("hold_id", sa.String(32), primary_key=True),
    sa.Column("key_id", sa.String(32), nullable=False),
    sa.Column("period", sa.String(32), nullable=False),
    sa.Column("nusd", sa.BigInteger, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False, index=True),  # Unix time: the lease's end
)
overruns_table = sa.Table(
    "gateway_overruns", metadata,  # settlements that charged more than their reservation (module docstring)
    sa.Column("hold_id", sa.String(32), primary_key=True),
    sa.Column("decision_id", sa.String(40), nullable=False),
    sa.Column("key_id", sa.String(32), nullable=False),
    sa.Column("period", sa.String(32), nullable=False),
    sa.Column("reserved_nusd", sa.BigInteger, nullable=False),
    sa.Column("charged_nusd", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.String(32), nullable=False),
)
# INSERT ... ON CONFLICT DO NOTHING, where the database has it (see Store._ensure_spend_row).
INSERT_IF_ABSENT = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}
KEY_CACHE_S = 5.0
HOLD_LEASE_S = 3600.0  # a reservation not settled within this is a dead process's (module docstring)
SWEEP_EVERY_S = 60.0  # how often a serving gateway looks for expired holds


def _statements() -> dict[str, Any]:
    """The per-request statements, built once with bound parameters (b_*): building a statement is
    most of SQLAlchemy's cost per call, and a prebuilt one hits its compiled cache."""
    key, period = sa.bindparam("b_key"), sa.bindparam("b_period")
    amount, budget = sa.bindparam("b_amount", type_=sa.BigInteger), sa.bindparam("b_budget", type_=sa.BigInteger)
    charge = sa.bindparam("b_charge", type_=sa.BigInteger)
    row = (spend_table.c.key_id == key) & (spend_table.c.period == period)
    fits = spend_table.c.spent_nusd + spend_table.c.reserved_nusd + amount <= budget
    return {
        "lookup": sa.select(keys_table).where(keys_table.c.key_sha256 == sa.bindparam("b_hash")),
        "spend": sa.select(spend_table.c.spent_nusd, spend_table.c.reserved_nusd).where(row),
        # reserve and resize: one conditional UPDATE, atomic in the database (module docstring)
        "hold": spend_table.update().where(row, fits).values(reserved_nusd=spend_table.c.reserved_nusd + amount),
        "settle": spend_table.update().where(row).values(reserved_nusd=spend_table.c.reserved_nusd - amount,
                                                         spent_nusd=spend_table.c.spent_nusd + charge),
        "charge": spend_table.update().where(row).values(spent_nusd=spend_table.c.spent_nusd + charge),
        "open_hold": holds_table.insert(),
        "resize_hold": holds_table.update().where(holds_table.c.hold_id == sa.bindparam("b_hold")).values(
            nusd=sa.bindparam("b_nusd", type_=sa.BigInteger), expires_at=sa.bindparam("b_expires")),
        "close_hold": holds_table.delete().where(holds_table.c.hold_id == sa.bindparam("b_hold")),
        "log": decisions_table.insert(),
        "overrun": overruns_table.insert(),
    }


STATEMENTS = _statements()


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


def add_columns(engine: sa.Engine, table: sa.Table, names: tuple[str, ...]) -> None:
    """ALTER TABLE ... ADD COLUMN for each of `names` the database's table lacks (made by an older release)."""
    present = {c["name"] for c in sa.inspect(engine).get_columns(table.name)}
    for name in names:
        if name in present:
            continue
        column = table.c[name]
        default = column.default.arg if column.default is not None else None
        ddl = f"ALTER TABLE {table.name} ADD COLUMN {name} {column.type.compile(engine.dialect)}"
        if default is not None:
            ddl += f" NOT NULL DEFAULT '{default}'"
        try:
            with engine.begin() as conn:  # one transaction each: a failed ALTER aborts only its own
                conn.execute(sa.text(ddl))
        except sa.exc.DBAPIError:
            # Another replica starting on the same database added it first.
            if name not in {c["name"] for c in sa.inspect(engine).get_columns(table.name)}:
                raise
