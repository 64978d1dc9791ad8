from __future__ import annotations

import pandas as pd
import pytest
import yaml

from routerops.errors import InputError
from routerops.pricing import check_pool_priced, derive_costs, load_pool, load_price_book

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path, name, data) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def book_data(**price):
    return {"version": "v1", "effective_date": "2026-01-01",
            "prices": {"a": {"input_per_1m": 1.0, "output_per_1m": 2.0, "cached_input_per_1m": 0.5,
                             "per_call": 0.001, **price}}}


def test_cost_is_uncached_plus_cached_plus_output_plus_fee(tmp_path):
    book = load_price_book(write(tmp_path, "b.yaml", book_data()))
    # 1000 prompt tokens of which 400 cached: 600 × $1/M + 400 × $0.5/M + 100 × $2/M + $0.001
    assert book.cost("a", 1000, 100, 400) == pytest.approx(600e-6 + 200e-6 + 200e-6 + 0.001)


def test_derive_costs_matches_the_scalar_rule(tmp_path):
    book = load_price_book(write(tmp_path, "b.yaml", book_data()))
    turns = pd.DataFrame({"worker": ["a", "a"], "prompt_tokens": [10, 0], "completion_tokens": [5, 0],
                          "cached_tokens": [3, 0]})
    expected = [book.cost("a", 10, 5, 3), book.cost("a", 0, 0, 0)]
    assert derive_costs(turns, book).tolist() == pytest.approx(expected)


@pytest.mark.parametrize("change, field", [
    ({"output_per_1m": -1}, "prices.a.output_per_1m"),
    ({"per_call": "free"}, "prices.a.per_call"),
    ({"surge": 2.0}, "prices.a.surge"),
    ({"input_per_1m": float("nan")}, "prices.a.input_per_1m"),
])
def test_bad_prices_name_the_field(tmp_path, change, field):
    path = write(tmp_path, "b.yaml", book_data(**change))
    with pytest.raises(InputError) as err:
        load_price_book(path)
    assert err.value.field == field and str(path) in str(err.value)


def test_bad_effective_date_is_named(tmp_path):
    data = book_data()
    data["effective_date"] = "soon"
    with pytest.raises(InputError, match="effective_date"):
        load_price_book(write(tmp_path, "b.yaml", data))


def test_embedded_pool_is_fully_priced_by_both_books():
    pool = load_pool(REPO / "configs/pools/embedded-smollm2.yaml")
    for book in ("collection-2026-11.yaml", "current.yaml"):
        check_pool_priced(pool, load_price_book(REPO / "configs/prices" / book))
    assert ("smol-cot", "answer") in pool.actions() and ("sympy", "sympy") in pool.actions()


def test_unpriced_worker_is_an_error(tmp_path):
    pool = load_pool(REPO / "configs/pools/embedded-smollm2.yaml")
    book = load_price_book(write(tmp_path, "b.yaml", book_data()))
    with pytest.raises(InputError, match="prices.smol-direct"):
        check_pool_priced(pool, book)


@pytest.mark.parametrize("mutate, field", [
    (lambda w: w.update(kind="robot"), "workers[0].kind"),
    (lambda w: w.pop("primitives"), "workers[0].primitives"),
    (lambda w: w["attributes"].update(params_b="big"), "workers[0].attributes.params_b"),
])
def test_bad_pool_names_the_field(tmp_path, mutate, field):
    data = yaml.safe_load((REPO / "configs/pools/embedded-smollm2.yaml").read_text())
    mutate(data["workers"][0])
    with pytest.raises(InputError) as err:
        load_pool(write(tmp_path, "pool.yaml", data))
    assert err.value.field == field


def test_duplicate_worker_is_rejected(tmp_path):
    data = yaml.safe_load((REPO / "configs/pools/embedded-smollm2.yaml").read_text())
    data["workers"].append(dict(data["workers"][0]))
    with pytest.raises(InputError, match="duplicate"):
        load_pool(write(tmp_path, "pool.yaml", data))
