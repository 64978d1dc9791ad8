"""Property-based tests (Hypothesis) of the two YAML loaders users hand files to: the price book and the
pool file. Whatever the file holds, the loader returns a checked value or raises InputError naming the
file and the field; never another exception (issue 25). Documents are built from the formats' own keys
with values of every YAML type (and some bytes that are not YAML at all), so most examples get past
the first check and reach the field checks."""

from __future__ import annotations

import datetime as dt
import math
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from routerops.errors import InputError
from routerops.pricing import (
    BOOK_KEYS, PRICE_FIELDS, Pool, PriceBook, WORKER_KINDS, WorkerSpec, load_pool, load_price_book,
)
from routerops.primitives import DEFAULT_PRIMITIVES, PRIMITIVE_KEYS, PRIMITIVE_RUNS

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Any YAML scalar: huge integers, NaN and infinities, dates, text that looks like another type.
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**300, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.dates(), st.text(max_size=12),
    st.sampled_from(["", " ", "2024-13-45", "1e400", "-0", ".nan", "USD", "yes", "~"]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.one_of(st.text(max_size=8), st.integers()), inner, max_size=3), max_leaves=8)


def keyed(keys: tuple[str, ...], extra=values) -> st.SearchStrategy[dict]:
    """A mapping over the format's keys (some left out, some typos), each holding `extra`."""
    return st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=6)), extra, max_size=len(keys) + 1)


prices = st.one_of(keyed(PRICE_FIELDS, st.one_of(st.floats(allow_nan=True), st.integers(), values)), values)
books = st.one_of(
    keyed(BOOK_KEYS),
    st.fixed_dictionaries(
        {"version": st.one_of(st.text(max_size=8), st.integers(), st.dates(), values),
         "effective_date": st.one_of(st.dates(), st.text(max_size=12), values),
         "prices": st.one_of(st.dictionaries(st.text(max_size=6), prices, max_size=3), values)},
        optional={"currency": st.one_of(st.just("USD"), values)}),
)
worker_fields = tuple(WorkerSpec.__dataclass_fields__)
primitive_names = st.sampled_from(sorted(DEFAULT_PRIMITIVES) + ["nope", ""])
workers = st.one_of(
    keyed(worker_fields),
    st.fixed_dictionaries(
        {"name": st.one_of(st.text(min_size=1, max_size=6), values), "kind": st.one_of(st.sampled_from(WORKER_KINDS), values),
         "primitives": st.one_of(st.lists(primitive_names, min_size=1, max_size=3), values)},
        optional={"concurrency": st.one_of(st.integers(), st.floats(allow_nan=True), values),
                  "timeout_s": st.one_of(st.floats(allow_nan=True), st.integers(), values),
                  "max_retries": st.one_of(st.integers(), values), "attributes": values, "generation": values,
                  "endpoint": values, "model": values, "subtask_primitives": st.one_of(st.lists(primitive_names), values)}),
)
vocabularies = st.dictionaries(st.one_of(primitive_names, st.text(max_size=6)), st.one_of(
    keyed(PRIMITIVE_KEYS, st.one_of(st.sampled_from(PRIMITIVE_RUNS), values)), values), max_size=3)
pools = st.one_of(keyed(("name", "primitives", "workers")), st.fixed_dictionaries(
    {"workers": st.one_of(st.lists(workers, min_size=1, max_size=3), values)},
    optional={"name": values, "primitives": vocabularies}))


# Past the recursion limit: PyYAML recurses once per level (0.7 s to parse, so an explicit example).
DEEP = ("[" * 1100 + "]" * 1100).encode()
# Unquoted YAML a user may type, which a dumper never writes: dates that are not dates, integers past a
# float, deep nesting, tags, anchors and merge keys.
raw_tokens = st.one_of(
    st.from_regex(r"\A[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}\Z"), st.from_regex(r"\A-?[0-9]{300,420}\Z"),
    st.sampled_from([".nan", "-.inf", "0x1F", "0o17", "1_000", "~", "!!binary aGk=", "&a 1", "*a", "{<<: 1}",
                     "!!python/name:os.system", "'unclosed", "[1, 2", "{a: 1, a: 2}", "null", "?", ">-\n  x"]),
    st.from_regex(r"\A[ -~]{0,12}\Z"),
)
BOOK_TEMPLATE = """version: {0}
effective_date: {1}
prices:
  a: {{input_per_1m: {2}, output_per_1m: {3}, per_call: {4}}}
  b: {5}
"""
POOL_TEMPLATE = """name: {0}
workers:
  - {{name: {1}, kind: llm, primitives: [answer], concurrency: {2}, timeout_s: {3}, max_retries: {4}}}
  - {{name: tool, kind: python, primitives: [python], attributes: {{x: {5}}}}}
"""


def filled(template: str) -> st.SearchStrategy[bytes]:
    return st.lists(raw_tokens, min_size=6, max_size=6).map(lambda tokens: template.format(*tokens).encode())


def dump(document) -> bytes:
    """YAML text of any document these strategies build (SafeDumper writes NaN, dates, huge ints)."""
    return yaml.safe_dump(document, allow_unicode=True).encode()


def load_written(loader, data: bytes):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "file.yaml"
        path.write_bytes(data)
        try:
            return loader(path)
        except InputError as exc:
            assert str(path) in str(exc) and exc.field  # names the file and the field
            return exc


@pytest.mark.slow
@SETTINGS
@given(st.one_of(books.map(dump), filled(BOOK_TEMPLATE), st.binary(max_size=64), st.text(max_size=64).map(str.encode)))
@example(b"version: v\neffective_date: 2024-01-01\nprices: " + DEEP)
def test_any_price_book_file_loads_or_is_an_input_error(data):
    book = load_written(load_price_book, data)
    if isinstance(book, PriceBook):  # what loaded is usable: every price finite and ≥ 0, a date, a version
        assert isinstance(book.effective_date, dt.date) and book.version
        for price in book.prices.values():
            assert all(math.isfinite(v) and v >= 0 for v in vars(price).values())
            assert math.isfinite(book.cost(next(iter(book.prices)), 1000, 1000))


@pytest.mark.slow
@SETTINGS
@given(st.one_of(pools.map(dump), filled(POOL_TEMPLATE), st.binary(max_size=64)))
@example(b"workers: " + DEEP)
def test_any_pool_file_loads_or_is_an_input_error(data):
    pool = load_written(load_pool, data)
    if isinstance(pool, Pool):  # what loaded can be put in force: limits a semaphore and a client accept
        for worker in pool.workers:
            assert isinstance(worker.name, str) and worker.name
            assert isinstance(worker.concurrency, int) and worker.concurrency >= 1
            assert math.isfinite(worker.timeout_s) and worker.timeout_s > 0
            assert isinstance(worker.max_retries, int) and worker.max_retries >= 0
            assert all(math.isfinite(v) for v in worker.attributes.values())
        assert pool.actions()
