"""The Market (issue 41 item 2): the pool and the collection and evaluation books, each read once per
content, with the versions a run records."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from routerops.config import load_params
from routerops.errors import InputError
from routerops.layout import Layout
from routerops.market import resolve_book, resolve_market
from routerops.publishing import versions

REPO = Path(__file__).resolve().parents[2]


def test_a_book_is_read_once_per_content_and_again_when_edited(tmp_path):
    book = tmp_path / "book.yaml"
    shutil.copy(REPO / "configs/prices/current.yaml", book)
    first, again = resolve_book(book), resolve_book(book)
    assert first is again  # one load for every stage of a flow
    raw = yaml.safe_load(book.read_text())
    raw["version"] = "2099-01-01"
    book.write_text(yaml.safe_dump(raw))
    edited = resolve_book(book)
    assert edited is not first and edited.version == "2099-01-01" and edited.sha256 != first.sha256


def test_the_main_market_records_the_versions_the_registry_recorded_before():
    params, layout = load_params(REPO / "params.yaml"), Layout(REPO)
    market = params.market(layout)
    assert market.versions() == versions(layout.resolve(params.prices.evaluation), layout.resolve(params.pool.file))
    assert market.collection.file == layout.resolve(params.prices.collection)
    assert market.priced("collection").version != market.priced("evaluation").version


def test_a_worker_without_a_price_is_refused_naming_the_book_and_the_worker(tmp_path):
    raw = yaml.safe_load((REPO / "configs/prices/current.yaml").read_text())
    dropped = resolve_market(REPO / "configs/pool.yaml", REPO / "configs/prices/current.yaml").pool.workers[0].name
    del raw["prices"][dropped]
    book = tmp_path / "book.yaml"
    book.write_text(yaml.safe_dump(raw))
    market = resolve_market(REPO / "configs/pool.yaml", REPO / "configs/prices/current.yaml", book)
    market.priced("collection")  # the collection book prices every worker
    with pytest.raises(InputError, match=f"book.yaml: field 'prices.{dropped}'"):
        market.priced("evaluation")
