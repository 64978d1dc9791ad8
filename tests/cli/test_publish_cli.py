"""`routerops prices|pool publish`: exit code 2 naming the field on bad input, nothing published;
without a Prefect server the file is still published and the command says no retrain ran."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from routerops.publishing import PRICES, current_version

REPO = Path(__file__).resolve().parents[2]
BOOK = REPO / "configs/prices/current.yaml"
POOL_FILE = REPO / "configs/pools/embedded-smollm2.yaml"


def edited_book(tmp_path: Path, name: str, version: str) -> Path:
    book = yaml.safe_load(BOOK.read_text())
    book["version"] = version
    path = tmp_path / name
    path.write_text(yaml.safe_dump(book))
    return path


@pytest.mark.slow
def test_cli_publish_without_a_server_stores_the_file_and_says_no_retrain_ran(tmp_path, monkeypatch, capsys):
    from cli.main import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"pool": {"file": str(POOL_FILE)},
                                                          "prices": {"evaluation": str(BOOK)}}))
    good = edited_book(tmp_path, "good.yaml", "2027-02-01")
    assert main(["prices", "publish", str(good), "--root", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "no event emitted, no retrain triggered" in printed
    # The next step it prints is the one the docs give (issue 40: it said `python -m flows.retrain`).
    next_step = re.search(r"\(run `([^`]+)`\)", printed).group(1)
    assert next_step == "make retrain" and f"\n{next_step} " in (REPO / "docs/operations/retrain.md").read_text()
    assert current_version(tmp_path / "data/published", PRICES).version == "2027-02-01"

    bad = yaml.safe_load(good.read_text())
    bad["prices"]["sympy"]["per_call"] = "cheap"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    assert main(["prices", "publish", str(tmp_path / "bad.yaml"), "--root", str(tmp_path)]) == 2
    assert "prices.sympy.per_call" in capsys.readouterr().err
    assert current_version(tmp_path / "data/published", PRICES).version == "2027-02-01"  # unchanged
