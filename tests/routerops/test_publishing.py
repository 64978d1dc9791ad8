"""Publishing price books and pools: validated before anything is stored, versioned, the pointer
switched last; what changed in a pool, by worker signature."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from routerops.errors import InputError
from routerops.schema import file_sha256
from routerops.pricing import load_pool
from routerops.publishing import POOL, PRICES, current_version, in_force, pool_changes, publish, worker_signature

REPO = Path(__file__).resolve().parents[2]
BOOK = REPO / "configs/prices/current.yaml"
POOL_FILE = REPO / "configs/pools/embedded-smollm2.yaml"


def edited_book(tmp_path: Path, name: str, version: str, **prices) -> Path:
    book = yaml.safe_load(BOOK.read_text())
    book["version"] = version
    for worker, price in prices.items():
        book["prices"][worker] = price
    path = tmp_path / name
    path.write_text(yaml.safe_dump(book))
    return path


def edited_pool(tmp_path: Path, name: str, edit) -> Path:
    pool = yaml.safe_load(POOL_FILE.read_text())
    edit(pool)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(pool, sort_keys=False))
    return path


def test_price_book_is_versioned_and_switched_in(tmp_path):
    store = tmp_path / "store"
    new = edited_book(tmp_path, "b.yaml", "2027-01-01", sympy={"input_per_1m": 0, "output_per_1m": 0, "per_call": 0.001})
    published, changed = publish(PRICES, new, store, pool_file=POOL_FILE, book_file=BOOK)
    assert changed and published.version == "2027-01-01"
    assert current_version(store, PRICES).path.read_bytes() == new.read_bytes()
    assert in_force(store, PRICES, BOOK) == store / "prices/2027-01-01.yaml"
    assert in_force(store, POOL, POOL_FILE) == POOL_FILE  # nothing published: params' file
    again, changed = publish(PRICES, new, store, pool_file=POOL_FILE, book_file=BOOK)
    assert not changed and again.version == published.version
    history = [json.loads(line) for line in (store / "prices/history.jsonl").read_text().splitlines()]
    assert [h["version"] for h in history] == ["2027-01-01"]


def test_same_version_with_other_content_is_refused_and_nothing_changes(tmp_path):
    store = tmp_path / "store"
    first = edited_book(tmp_path, "a.yaml", "2027-01-01")
    publish(PRICES, first, store, pool_file=POOL_FILE, book_file=BOOK)
    second = edited_book(tmp_path, "b.yaml", "2027-01-01", sympy={"input_per_1m": 0, "output_per_1m": 0, "per_call": 1.0})
    with pytest.raises(InputError, match="version.*already published with other content"):
        publish(PRICES, second, store, pool_file=POOL_FILE, book_file=BOOK)
    assert current_version(store, PRICES).sha256 == file_sha256(first)
    assert (store / "prices/2027-01-01.yaml").read_bytes() == first.read_bytes()


@pytest.mark.parametrize("problem, field", [
    ("unpriced", "prices.sympy"), ("negative", "prices.sympy.per_call"), ("no_version", "version")])
def test_bad_price_book_names_the_field_and_publishes_nothing(tmp_path, problem, field):
    book = yaml.safe_load(BOOK.read_text())
    if problem == "unpriced":
        del book["prices"]["sympy"]
    elif problem == "negative":
        book["prices"]["sympy"]["per_call"] = -1
    else:
        del book["version"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(book))
    store = tmp_path / "store"
    with pytest.raises(InputError) as err:
        publish(PRICES, path, store, pool_file=POOL_FILE, book_file=BOOK)
    assert field in str(err.value)
    assert not (store / "prices").exists()


def test_pool_with_an_unpriced_worker_is_refused(tmp_path):
    def add_unpriced(pool):
        pool["workers"].append({"name": "brand-new", "kind": "sympy", "primitives": ["sympy"]})
    path = edited_pool(tmp_path, "pool.yaml", add_unpriced)
    with pytest.raises(InputError, match="brand-new"):
        publish(POOL, path, tmp_path / "store", pool_file=POOL_FILE, book_file=BOOK)
    assert current_version(tmp_path / "store", POOL) is None


def test_pool_changes_by_signature(tmp_path):
    def drop_sympy_and_retune(pool):
        pool["workers"] = [w for w in pool["workers"] if w["name"] != "sympy"]
        for w in pool["workers"]:
            if w["name"] == "smol-cot":
                w["generation"]["max_tokens"] = 64  # changes what it answers
            if w["name"] == "python":
                w["timeout_s"] = 30  # does not
    old, new = load_pool(POOL_FILE), load_pool(edited_pool(tmp_path, "p.yaml", drop_sympy_and_retune))
    assert pool_changes(old, new) == {"added": [], "removed": ["sympy"], "changed": ["smol-cot"]}
    assert worker_signature(old, "python") == worker_signature(new, "python")
    assert pool_changes(None, old)["added"] == old.names


def test_pool_version_is_its_name_and_content_hash(tmp_path):
    published, _ = publish(POOL, POOL_FILE, tmp_path / "store", pool_file=POOL_FILE, book_file=BOOK)
    assert published.version.startswith("embedded-smollm2-") and len(published.version.split("-")[-1]) == 12

