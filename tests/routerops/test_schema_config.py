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


def one_turn(**values) -> pd.DataFrame:
    row = {"episode_id": "e", "turn_index": 0, "actor": "p", "worker": "w", "primitive": "answer", "subtask_id": "",
           "depends_on": "[]", "message": "look", "response": "Action: look around", "prompt_tokens": 3,
           "completion_tokens": 4, "cached_tokens": 0, "latency_s": 0.1, "cost_usd": 0.0, "errors": "[]",
           "propensity": 1.0}
    return pd.DataFrame([{**row, **values}])


def write_with_version(frame: pd.DataFrame, kind: str, version: str, path: Path) -> Path:
    """A file as another schema version wrote it: the columns of `frame`, that version's metadata."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    pq.write_table(table.replace_schema_metadata({"routerops_schema_version": version, "table": kind}), path)
    return path


def test_the_observation_column_round_trips(tmp_path):
    frame = one_turn(observation="This room is called the kitchen.")
    turns = schema.read_table(schema.write_table(frame, tmp_path / "turns.parquet", "turns"), "turns")
    assert turns["observation"].tolist() == ["This room is called the kitchen."]
    with pytest.raises(InputError, match="observation"):  # writers must say what the environment showed
        schema.write_table(one_turn(), tmp_path / "other.parquet", "turns")


def test_a_version_1_turns_file_reads_with_empty_observations(tmp_path):
    path = write_with_version(one_turn(), "turns", "1", tmp_path / "v1.parquet")
    turns = schema.read_table(path, "turns")
    assert list(turns.columns) == schema.TURN_SCHEMA.names
    assert turns["observation"].tolist() == [""] and turns["response"].tolist() == ["Action: look around"]
    episodes = write_with_version(schema.empty_frame("episodes"), "episodes", "1", tmp_path / "e1.parquet")
    assert list(schema.read_table(episodes, "episodes").columns) == schema.EPISODE_SCHEMA.names


def test_a_version_2_episodes_file_reads_with_empty_orchestrator_columns(tmp_path):
    types = {f.name: f.type for f in schema.EPISODE_SCHEMA}
    row = {c: 0 if pa.types.is_integer(t) else 0.0 if pa.types.is_floating(t) else False if pa.types.is_boolean(t)
           else "x" for c, t in types.items() if c not in ("mode", "conversation")}
    path = write_with_version(pd.DataFrame([row]), "episodes", "2", tmp_path / "e2.parquet")
    episodes = schema.read_table(path, "episodes")
    assert list(episodes.columns) == schema.EPISODE_SCHEMA.names
    assert episodes[["mode", "conversation"]].iloc[0].tolist() == ["", ""]


@pytest.mark.parametrize("version", ["", "0", "4"])
def test_reading_another_schema_version_names_the_field(tmp_path, version):
    path = tmp_path / "old.parquet"
    table = pa.table({"episode_id": ["x"]})
    pq.write_table(table.replace_schema_metadata({"routerops_schema_version": version} if version else None), path)
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
    assert params.collect.turn_limit >= 1 and params.prices.evaluation.endswith(".yaml")


def test_unknown_params_key_is_rejected(tmp_path):
    data = yaml.safe_load((REPO / "params.yaml").read_text())
    data["collect"]["budjet_usd"] = 1.0
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match="collect.budjet_usd"):
        load_params(tmp_path / "params.yaml")
