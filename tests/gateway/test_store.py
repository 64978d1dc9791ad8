"""Keys and budgets on a real SQLite database: hashed keys, atomic reservations under thread races,
settlement capped at the reservation, the cache of verified keys, settlements queued off the request
path and all written by close(), holds of a killed process released when their lease runs out, and
the `routerops gateway keys create` command."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.store import BudgetRefused, Store, period_start, read_decisions
from cli.main import main


def test_keys_are_stored_hashed_and_looked_up_by_hash(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'gw.db'}")
    key, info = store.create_key(0.25, "month", name="team-a")
    assert key.startswith(f"rk-{info.key_id}-") and store.lookup(key) == info
    assert store.lookup(key + "x") is None and store.lookup("") is None
    raw = sqlite3.connect(tmp_path / "gw.db").execute("select * from gateway_keys").fetchall()
    assert key not in repr(raw) and key.split("-", 2)[2] not in repr(raw)


def test_threads_racing_for_a_budget_never_reserve_more_than_it(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'gw.db'}")
    _, key = store.create_key(10 * 3e-6, "day")

    def grab(_):
        try:
            held = store.reserve(key, 3e-6)
        except BudgetRefused:
            return False
        store.settle(held, 2e-6)  # the real cost is below the worst case
        return True

    with ThreadPoolExecutor(8) as pool:
        granted = sum(pool.map(grab, range(40)))
    spent, reserved = store.spend(key.key_id, period_start("day"))
    assert reserved == 0 and spent == pytest.approx(2e-6 * granted) and spent <= 10 * 3e-6
    assert granted >= 10  # settled calls free what they did not use, so more than ten fit


def test_settlement_charges_what_the_worker_billed_above_the_reservation_and_records_the_overrun(tmp_path):
    # Issue 25: capping the charge at the reservation hid what the worker billed (a reservation that
    # missed a message's image part charged $1.13e-5 for 20,012 prompt tokens). The money is spent:
    # it is charged, and the overrun recorded.
    store = Store(f"sqlite:///{tmp_path / 'gw.db'}")
    _, key = store.create_key(1e-3, "total")
    store.settle(store.reserve(key, 1e-4), 5e-4, {"decision_id": "d1", "created_at": "now", "key_id": key.key_id,
                                                   "router": "r", "router_version": "1", "price_book_version": "b",
                                                   "query_id": "q", "query": "", "chosen": "w", "worker": "w",
                                                   "propensity": 1.0, "status": "ok"})
    assert store.spend(key.key_id, "total") == (pytest.approx(5e-4), 0.0)
    assert store.remaining_usd(key) == pytest.approx(5e-4)
    [overrun] = store.overruns(key.key_id)
    assert overrun["decision_id"] == "d1" and overrun["overrun_usd"] == pytest.approx(4e-4)
    # past the budget by that overrun at most: the next reservation is refused
    store.settle(store.reserve(key, 5e-4), 9e-4)
    assert store.spend(key.key_id, "total")[0] == pytest.approx(1.4e-3)
    with pytest.raises(BudgetRefused):
        store.reserve(key, 1e-9)
    assert store.remaining_usd(key) == 0.0 and len(store.overruns()) == 2


def test_keys_create_command_prints_the_key_once(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'gw.db'}"
    assert main(["gateway", "keys", "create", "--budget-usd", "0.5", "--period", "day", "--db-url", url]) == 0
    printed = json.loads(capsys.readouterr().out)
    info = Store(url).lookup(printed["api_key"])
    assert info.budget_usd == 0.5 and info.period == "day" and info.key_id == printed["key_id"]
    assert main(["gateway", "keys", "create", "--budget-usd", "-1", "--db-url", url]) == 2
    assert "--budget-usd" in capsys.readouterr().err


def test_a_verified_key_is_cached_for_key_cache_s_and_an_unknown_one_never(tmp_path):
    url = f"sqlite:///{tmp_path / 'gw.db'}"
    cached, uncached = Store(url), Store(url, key_cache_s=0)
    key, info = cached.create_key(1.0, "day")
    assert cached.lookup(key) == info and uncached.lookup(key) == info
    with sqlite3.connect(tmp_path / "gw.db") as raw:
        raw.execute("update gateway_keys set revoked = 1")
    assert uncached.lookup(key) is None  # revocation is seen at once without the cache ...
    assert cached.lookup(key) == info  # ... and within key_cache_s with it
    cached._keys.clear()  # what the passing of key_cache_s does
    assert cached.lookup(key) is None


def test_queued_settlements_are_written_in_order_and_all_of_them_by_close(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'gw.db'}")
    _, key = store.create_key(1.0, "total")
    held = [store.reserve(key, 1e-3) for _ in range(50)]
    gate = threading.Event()
    store.submit(lambda conn: gate.wait(30))  # the store's thread is busy: settlements queue up
    futures = [store.settle_later(h, 5e-4, {"decision_id": f"d{i}", "created_at": "now", "key_id": key.key_id,
                                              "router": "r", "router_version": "1", "price_book_version": "p",
                                              "query_id": "q", "query": "", "chosen": "w", "worker": "w",
                                              "propensity": 1.0, "explanation": {}, "status": "ok"})
               for i, h in enumerate(held)]
    assert not any(f.done() for f in futures)
    gate.set()
    store.close()
    assert all(f.done() and f.exception() is None for f in futures)
    assert store.spend(key.key_id, "total") == (pytest.approx(50 * 5e-4), 0.0)  # a new thread serves after close
    assert len(read_decisions(f"sqlite:///{tmp_path / 'gw.db'}", graded_only=False)) == 50


KILLED_GATEWAY = """
import os, signal, sys
from gateway.store import Store
store = Store(sys.argv[1])
store.reserve(store.lookup(sys.argv[2]), 4e-4)  # a call in flight ...
os.kill(os.getpid(), signal.SIGKILL)  # ... when the process is killed: no settlement, no shutdown
"""


def test_a_killed_gateways_hold_is_released_when_its_lease_runs_out(tmp_path):
    url = f"sqlite:///{tmp_path / 'gw.db'}"
    store = Store(url)
    key, info = store.create_key(1e-3, "total")
    root = Path(__file__).resolve().parents[2]
    killed = subprocess.run([sys.executable, "-c", KILLED_GATEWAY, url, key], cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert store.spend(info.key_id, "total") == (0.0, pytest.approx(4e-4))  # withheld by the dead process
    assert store.release_expired_holds() == 0  # its lease (an hour) has not run out
    assert store.remaining_usd(info) == pytest.approx(6e-4)
    assert store.release_expired_holds(now=time.time() + store.hold_lease_s + 1) == 1
    assert store.spend(info.key_id, "total") == (0.0, 0.0) and store.remaining_usd(info) == pytest.approx(1e-3)
    assert store.release_expired_holds(now=time.time() + store.hold_lease_s + 1) == 0  # released once


def test_a_request_that_outlives_its_lease_is_charged_but_released_only_once(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'gw.db'}")
    _, key = store.create_key(1e-3, "total")
    held = store.reserve(key, 2e-4)
    assert store.release_expired_holds(now=time.time() + store.hold_lease_s + 1) == 1  # swept while in flight
    assert store.spend(key.key_id, "total") == (0.0, 0.0)
    held = store.resize(held, 3e-4, key.budget_usd)  # a fallback: the swept hold is reserved afresh, in full
    assert store.spend(key.key_id, "total") == (0.0, pytest.approx(3e-4))
    store.settle(held, 1e-4)
    assert store.spend(key.key_id, "total") == (pytest.approx(1e-4), 0.0)
    other = store.reserve(key, 2e-4)
    assert store.release_expired_holds(now=time.time() + store.hold_lease_s + 1) == 1
    store.settle(other, 5e-5)  # its hold was swept: the cost is charged, nothing is released twice
    assert store.spend(key.key_id, "total") == (pytest.approx(1.5e-4), 0.0)


def test_a_refused_resize_leaves_the_reservation_and_its_hold_as_they_were(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'gw.db'}")
    _, key = store.create_key(3e-4, "total")
    held = store.reserve(key, 2e-4)
    with pytest.raises(BudgetRefused):
        store.resize(held, 4e-4, key.budget_usd)  # a fallback worker dearer than what is left
    assert store.spend(key.key_id, "total") == (0.0, pytest.approx(2e-4))
    store.settle(held, 1e-4)  # settles the hold it still has, at its old amount
    assert store.spend(key.key_id, "total") == (pytest.approx(1e-4), 0.0)
    assert store.release_expired_holds(now=time.time() + store.hold_lease_s + 1) == 0  # no hold left behind


def test_a_decision_log_made_before_graded_at_and_embedding_gets_them(tmp_path):
    """An older gateway's database: the new columns are added at start, and grading stamps graded_at."""
    import sqlalchemy as sa

    from gateway.store import Store, read_decisions

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE gateway_decisions (decision_id VARCHAR(40) PRIMARY KEY, created_at "
                             "VARCHAR(32) NOT NULL, key_id VARCHAR(32) NOT NULL, router VARCHAR(200) NOT NULL, "
                             "router_version VARCHAR(32) NOT NULL, price_book_version VARCHAR(100) NOT NULL, "
                             "query_id VARCHAR(64) NOT NULL, query TEXT NOT NULL, chosen VARCHAR(200) NOT NULL, "
                             "worker VARCHAR(200) NOT NULL, propensity FLOAT NOT NULL, explanation TEXT NOT NULL, "
                             "status VARCHAR(32) NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER "
                             "NOT NULL, cost_usd FLOAT NOT NULL, usage_source VARCHAR(16) NOT NULL, response TEXT NOT "
                             "NULL, latency_s FLOAT NOT NULL, score FLOAT)"))
        conn.execute(sa.text("INSERT INTO gateway_decisions VALUES ('d1', '2026-11-01T00:00:00Z', 'k', 'r', '1', 'b', "
                             "'q', '', 'w', 'w', 1.0, '{}', 'ok', 1, 1, 0.0, 'worker', '', 0.0, NULL)"))
    engine.dispose()
    store = Store(url)
    Store(url)  # a second start finds them there
    assert store.record_score("d1", 1.0)
    store.close()
    row = read_decisions(url).iloc[0]
    assert row.embedding == "" and row.graded_at.startswith("20") and row.score == 1.0
