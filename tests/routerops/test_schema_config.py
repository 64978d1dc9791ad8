from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from routerops import schema
from routerops.config import load_params
from routerops.errors import InputError

REPO = Path(__file__).resolve().parents[2]


def test_episode_id_is_deterministic_and_distinct():
    a = schema.episode_id("run", "task", "policy", 1)
    assert a == schema.episode_id("run", "task", "policy", 1)
    assert len({a, schema.episode_id("run", "task", "policy", 2), schema.episode_id("run", "t2", "policy", 1)}) == 3


def test_tables_round_trip_with_schema_version(tmp_path):
    frame = schema.empty_frame("turns")
    path = schema.write_table(frame, tmp_path / "turns.parquet", "turns")
    meta = pq.read_schema(path).metadata
    assert meta[b"routerops_schema_version"] == schema.SCHEMA_VERSION.encode()
    assert list(schema.read_table(path, "turns").columns) == schema.TURN_SCHEMA.names


def test_reading_another_schema_version_names_the_field(tmp_path):
    path = tmp_path / "old.parquet"
    pq.write_table(pa.table({"episode_id": ["x"]}), path)
    with pytest.raises(InputError, match="routerops_schema_version"):
        schema.read_table(path, "episodes")


def test_a_failed_write_leaves_the_old_file(tmp_path):
    path = schema.write_table(schema.empty_frame("episodes"), tmp_path / "e.parquet", "episodes")
    before = path.read_bytes()
    with pytest.raises(InputError):
        schema.write_table(pd.DataFrame({"episode_id": ["x"]}), path, "episodes")
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["e.parquet"]


def test_params_file_loads_into_typed_sections():
    params = load_params(REPO / "params.yaml")
    assert params.collect.turn_limit >= 1 and params.reprice.price_book.endswith(".yaml")


def test_unknown_params_key_is_rejected(tmp_path):
    data = yaml.safe_load((REPO / "params.yaml").read_text())
    data["collect"]["budjet_usd"] = 1.0
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match="collect.budjet_usd"):
        load_params(tmp_path / "params.yaml")
