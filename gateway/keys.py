"""Managing keys in the gateway's database (`routerops gateway keys list|revoke|set-budget|spend`).

Each command reads or changes the tables of gateway/store.py directly; a running gateway sees a
revocation or a new budget within its key cache's 5 s (gateway/store.py). Spend is read from
`gateway_spend` (one row per key and period: spent, and still held by requests in flight) and
`gateway_decisions` (requests and tokens), so it is what the gateway charged, under the price book it
served with. Output is JSON lines on stdout (one object per key, or per key and period), for scripts
and `jq`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from gateway.store import PERIODS, Store, decisions_table, keys_table, period_start, spend_table, to_nano, to_usd
from routerops.errors import InputError


def list_keys(store: Store) -> list[dict[str, Any]]:
    """Every key (never its secret): id, name, budget, period, created, revoked, and the current period's spend."""
    rows = store.run(lambda conn: conn.execute(sa.select(keys_table).order_by(keys_table.c.created_at)).all())
    out = []
    for row in rows:
        current = period_start(row.period)
        spent, held = store.spend(row.key_id, current)
        out.append({"key_id": row.key_id, "name": row.name, "budget_usd": to_usd(row.budget_nusd),
                    "period": row.period, "created_at": row.created_at, "revoked": bool(row.revoked),
                    "current_period": current, "spent_usd": spent, "held_usd": held})
    return out


def key_row(store: Store, key_id: str) -> Any:
    """The key's row, or InputError naming the id and how to find the right one."""
    key_id = key_id.removeprefix("rk-").split("-")[0]  # a pasted whole key still names its id; its secret is unused
    row = store.run(lambda conn: conn.execute(sa.select(keys_table).where(keys_table.c.key_id == key_id)).first())
    if row is None:
        raise InputError(store.engine.url.render_as_string(hide_password=True), "key_id",
                         f"no key {key_id!r} in this database: `routerops gateway keys list` shows the ids")
    return row


def revoke_key(store: Store, key_id: str) -> dict[str, Any]:
    row = key_row(store, key_id)
    store.run(lambda conn: conn.execute(keys_table.update().where(keys_table.c.key_id == row.key_id)
                                        .values(revoked=True)))
    return {"key_id": row.key_id, "revoked": True}


def set_budget(store: Store, key_id: str, budget_usd: float, period: str | None = None) -> dict[str, Any]:
    if not (budget_usd >= 0 and budget_usd < 1e9):
        raise InputError("command line", "--budget-usd", f"expected a number ≥ 0, got {budget_usd!r}")
    if period is not None and period not in PERIODS:
        raise InputError("command line", "--period", f"{period!r} is not one of {PERIODS}")
    row = key_row(store, key_id)
    values = {"budget_nusd": to_nano(budget_usd), **({"period": period} if period else {})}
    store.run(lambda conn: conn.execute(keys_table.update().where(keys_table.c.key_id == row.key_id).values(**values)))
    return {"key_id": row.key_id, "budget_usd": float(budget_usd), "period": period or row.period}


def spend(store: Store, key_id: str | None = None, period: str | None = None) -> list[dict[str, Any]]:
    """USD spent and held per key and period, with the requests and tokens the decision log holds for
    that period (decisions are matched to a period by their UTC time's prefix: 2026-12-07 for a day)."""
    if key_id is not None:
        key_id = key_row(store, key_id).key_id
    query = sa.select(spend_table, keys_table.c.name).join(keys_table, keys_table.c.key_id == spend_table.c.key_id)
    if key_id is not None:
        query = query.where(spend_table.c.key_id == key_id)
    if period is not None:
        query = query.where(spend_table.c.period == period)
    rows = store.run(lambda conn: conn.execute(query.order_by(spend_table.c.key_id, spend_table.c.period)).all())
    return [{"key_id": r.key_id, "name": r.name, "period": r.period, "spent_usd": to_usd(r.spent_nusd),
             "held_usd": to_usd(r.reserved_nusd), **decision_totals(store, r.key_id, r.period)} for r in rows]


def decision_totals(store: Store, key_id: str, period: str) -> dict[str, int]:
    d = decisions_table.c
    query = sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(d.prompt_tokens), 0),
                      sa.func.coalesce(sa.func.sum(d.completion_tokens), 0)).where(d.key_id == key_id, d.worker != "")
    if period != "total":  # a period's start is a prefix of the ISO times inside it
        query = query.where(d.created_at.startswith(period))
    n, prompt, completion = store.run(lambda conn: conn.execute(query).one())
    return {"requests": int(n), "prompt_tokens": int(prompt), "completion_tokens": int(completion)}


def print_lines(records: list[dict[str, Any]]) -> None:
    for record in records:
        print(json.dumps(record))


def existing_store(url: str) -> Store:
    """The gateway's store, refusing an SQLite file that does not exist (a mistyped --db-url would
    otherwise list no key from a new, empty database)."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:") \
            and not Path(parsed.database).is_file():
        raise InputError(parsed.database, "--db-url", "no gateway database here: give the --db-url (or `database:`) "
                         "the gateway serves with; `keys create` or the gateway's first start creates it")
    return Store(url)


def list_keys_command(args: argparse.Namespace) -> None:
    print_lines(list_keys(existing_store(args.db_url)))


def revoke_key_command(args: argparse.Namespace) -> None:
    print_lines([revoke_key(existing_store(args.db_url), args.key_id)])


def set_budget_command(args: argparse.Namespace) -> None:
    print_lines([set_budget(existing_store(args.db_url), args.key_id, args.budget_usd, args.period)])


def spend_command(args: argparse.Namespace) -> None:
    print_lines(spend(existing_store(args.db_url), args.key_id, args.period))
