"""`routerops gateway keys create|list|revoke|set-budget|spend` on a real SQLite database, through the
CLI's own entry point: what each prints, and what the gateway's store then does with the key."""

from __future__ import annotations

import json

import pytest

from gateway.store import Store, period_start
from cli import main as cli


def run(capsys, *argv: str) -> tuple[int, list[dict], str]:
    try:
        code = cli.main(["gateway", "keys", *argv])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, [json.loads(line) for line in out.out.splitlines() if line.strip()], out.err


@pytest.fixture
def db(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'gateway.db'}"


def settle_one(store: Store, key: str, cost: float, prompt: int, completion: int) -> None:
    """A request the gateway would have made with `key`: reserved, then settled and logged."""
    info = store.lookup(key)
    held = store.reserve(info, cost * 2)
    store.settle(held, cost, {"decision_id": f"d-{cost}", "created_at": "2099-01-01T00:00:00Z", "key_id": info.key_id,
                              "router": "router-x", "router_version": "1", "price_book_version": "b", "query_id": "q",
                              "query": "", "chosen": "w", "worker": "w", "propensity": 1.0, "explanation": {},
                              "status": "ok", "prompt_tokens": prompt, "completion_tokens": completion,
                              "cost_usd": cost})


def test_create_list_set_budget_revoke(db, capsys):
    code, [created], _ = run(capsys, "create", "--budget-usd", "2.5", "--period", "day", "--name", "team-a",
                             "--db-url", db)
    assert code == 0 and created["api_key"].startswith(f"rk-{created['key_id']}-")
    code, listed, _ = run(capsys, "list", "--db-url", db)
    assert code == 0 and [k["key_id"] for k in listed] == [created["key_id"]]
    assert listed[0]["name"] == "team-a" and listed[0]["budget_usd"] == 2.5 and listed[0]["revoked"] is False
    assert "api_key" not in listed[0] and created["api_key"] not in json.dumps(listed)  # never the secret

    code, [changed], _ = run(capsys, "set-budget", created["key_id"], "--budget-usd", "7", "--period", "month",
                             "--db-url", db)
    assert code == 0 and changed == {"key_id": created["key_id"], "budget_usd": 7.0, "period": "month"}
    fresh = Store(db, key_cache_s=0)
    assert fresh.lookup(created["api_key"]).budget_usd == 7.0 and fresh.lookup(created["api_key"]).period == "month"

    code, [revoked], _ = run(capsys, "revoke", created["api_key"], "--db-url", db)  # a pasted whole key names its id
    assert code == 0 and revoked == {"key_id": created["key_id"], "revoked": True}
    assert fresh.lookup(created["api_key"]) is None  # the gateway refuses it (401)
    assert run(capsys, "list", "--db-url", db)[1][0]["revoked"] is True


def test_spend_per_key_and_period_from_the_database(db, capsys):
    store = Store(db)
    key_a, info_a = store.create_key(1.0, "day", "a")
    key_b, info_b = store.create_key(1.0, "total", "b")
    settle_one(store, key_a, 0.001, 100, 10)
    settle_one(store, key_a, 0.002, 50, 5)
    settle_one(store, key_b, 0.004, 7, 3)
    store.close()

    code, rows, _ = run(capsys, "spend", "--db-url", db)
    assert code == 0 and len(rows) == 2
    by_key = {r["key_id"]: r for r in rows}
    a, b = by_key[info_a.key_id], by_key[info_b.key_id]
    assert a["period"] == period_start("day") and a["spent_usd"] == pytest.approx(0.003) and a["held_usd"] == 0
    assert b["period"] == "total" and b["spent_usd"] == pytest.approx(0.004)
    # the decisions are dated 2099: a day's totals count only its own, "total" counts every one
    assert (a["requests"], b["requests"], b["prompt_tokens"], b["completion_tokens"]) == (0, 1, 7, 3)

    code, [only], _ = run(capsys, "spend", "--key", info_a.key_id, "--period", period_start("day"), "--db-url", db)
    assert code == 0 and only["key_id"] == info_a.key_id and only["name"] == "a"


def test_an_unknown_key_is_one_line_exit_2(db, capsys):
    Store(db).create_key(1.0, "day")
    for argv in (("revoke", "abc123"), ("set-budget", "abc123", "--budget-usd", "1"), ("spend", "--key", "abc123")):
        code, _, err = run(capsys, *argv, "--db-url", db)
        assert code == 2 and err.count("\n") == 1 and "no key 'abc123'" in err and "keys list" in err, err


def test_a_negative_budget_is_refused(db, capsys):
    key, info = Store(db).create_key(1.0, "day")
    code, _, err = run(capsys, "set-budget", info.key_id, "--budget-usd", "-1", "--db-url", db)
    assert code == 2 and "--budget-usd" in err


def test_a_database_that_does_not_exist_is_refused_not_created(tmp_path, capsys):
    missing = tmp_path / "typo.db"
    for argv in (("list",), ("spend",), ("revoke", "abc123")):
        code, _, err = run(capsys, *argv, "--db-url", f"sqlite:///{missing}")
        assert code == 2 and "no gateway database here" in err and str(missing) in err, err
    assert not missing.exists()
