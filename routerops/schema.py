"""Trajectory data model: an episodes table and a turns table (Parquet, versioned schema).

One schema covers a single-turn query (one turn) and a multi-turn episode (design.md, "Data
model"). Costs in these tables are always derived from tokens under the price book whose version
the episode records (`routerops.pricing.derive_costs`); `reprice` recomputes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from routerops.errors import InputError

SCHEMA_VERSION = "3"
# Older files are still read (old DVC-tracked data). Version "1" predates the turns' `observation`
# column (issue 4), which read_table then adds as "" — it was never logged. Versions "1" and "2"
# predate the episodes' `mode` and `conversation` (the orchestrator, issue 10), added as "" (no
# orchestrator wrote them).
READABLE_VERSIONS = ("1", "2", SCHEMA_VERSION)

# Ended-by values for an episode.
END_DONE, END_TURN_LIMIT, END_BUDGET, END_ERROR = "done", "turn_limit", "budget", "error"
END_REASONS = (END_DONE, END_TURN_LIMIT, END_BUDGET, END_ERROR)

EPISODE_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),  # deterministic: hash of run, task, policy, seed
        ("run_id", pa.string()),
        ("task_id", pa.string()),
        ("suite", pa.string()),
        ("split", pa.string()),
        ("policy", pa.string()),
        ("policy_version", pa.string()),
        ("seed", pa.int64()),
        ("budget_usd", pa.float64()),
        ("turn_limit", pa.int64()),
        ("price_book_version", pa.string()),
        ("final_answer", pa.string()),
        ("score", pa.float64()),  # in [0, 1] for QA; environments document their range
        ("success", pa.bool_()),
        ("turns", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("cost_usd", pa.float64()),  # derived: sum of the turns' derived costs
        ("ended_by", pa.string()),  # one of END_REASONS
        ("error", pa.string()),  # last error message when ended_by == "error", else ""
        # Orchestrator episodes (routerops.orchestra): the behaviour mode (orchestra.modes.MODES) and the
        # whole chat as JSON (system prompt, task, the controller's turns, the executor's <obs>), what
        # SFT trains on. "" for flat routers' episodes.
        ("mode", pa.string()),
        ("conversation", pa.string()),
    ],
    metadata={"routerops_schema_version": SCHEMA_VERSION, "table": "episodes"},
)

TURN_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("turn_index", pa.int64()),  # 0, 1, 2 ... contiguous within an episode
        # who chose the action: the policy name; for orchestrator episodes "controller" (the controller's
        # own tokens, the only ones SFT and RL train on) or "worker" (a subtask's call: observation tokens)
        ("actor", pa.string()),
        ("worker", pa.string()),
        ("primitive", pa.string()),
        ("subtask_id", pa.string()),
        ("depends_on", pa.string()),  # JSON list of subtask ids
        ("message", pa.string()),  # what was sent (JSON of chat messages, or tool input)
        ("response", pa.string()),  # what came back
        # What the environment showed after this turn's reply: o_{t+1} of MTRouter's history (§3.2,
        # eq. 2), as Observation.observation. "" when it said nothing: QA environments, tool turns
        # without output, and turns whose worker call failed (the environment never saw a reply).
        ("observation", pa.string()),
        ("prompt_tokens", pa.int64()),  # from the server's usage, never estimated
        ("completion_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("latency_s", pa.float64()),
        ("cost_usd", pa.float64()),  # derived from tokens and the episode's price book
        ("errors", pa.string()),  # JSON list of {"rule", "severity"} detected in this turn
        ("propensity", pa.float64()),  # behaviour policy's probability of the chosen action
    ],
    metadata={"routerops_schema_version": SCHEMA_VERSION, "table": "turns"},
)

SCHEMAS = {"episodes": EPISODE_SCHEMA, "turns": TURN_SCHEMA}
# Columns added after version 2, with the value that means "not written": older files get it on
# reading, and a writer that predates a column may leave it out.
LATER_COLUMNS = {"episodes": {"mode": "", "conversation": ""}, "turns": {}}

TOKEN_COLUMNS = ("prompt_tokens", "completion_tokens", "cached_tokens")
# The largest token count a row may hold: far above any call or episode (context windows are ~1e7
# tokens), so a bigger value is a unit or parsing error. Bounded so that sums over millions of rows
# stay within int64 and exact in the float64 cost arithmetic (< 2**53).
MAX_TOKEN_COUNT = 10**12


def episode_id(run_id: str, task_id: str, policy: str, seed: int) -> str:
    """Deterministic id, so a rerun recognises episodes it already finished."""
    key = json.dumps([run_id, task_id, policy, int(seed)])
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def to_table(frame: pd.DataFrame, kind: str) -> pa.Table:
    schema = SCHEMAS[kind]
    absent = {k: v for k, v in LATER_COLUMNS[kind].items() if k not in frame.columns}
    if absent:
        frame = frame.assign(**absent)
    missing = [n for n in schema.names if n not in frame.columns]
    if missing:
        raise InputError(f"<{kind} table>", missing[0], "column missing")
    return pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)


def write_table(frame: pd.DataFrame, path: str | Path, kind: str) -> Path:
    """Write atomically: a crash mid-write leaves the old file (or none), never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = to_table(frame, kind)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_table(path: str | Path, kind: str) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "<file>", "file not found")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise InputError(path, "<file>", f"not a readable Parquet file: {exc}") from exc
    meta = table.schema.metadata or {}
    version = meta.get(b"routerops_schema_version", b"").decode()
    if version not in READABLE_VERSIONS:
        raise InputError(path, "routerops_schema_version",
                         f"expected one of {', '.join(READABLE_VERSIONS)}, found {version or 'none'}")
    if version == "1" and kind == "turns":
        table = upgrade_v1_turns(table)
    if version in ("1", "2"):
        table = add_later_columns(table, kind)
    missing = [n for n in SCHEMAS[kind].names if n not in table.column_names]
    if missing:
        raise InputError(path, missing[0], "column missing")
    frame = table.to_pandas()
    for column in TOKEN_COLUMNS:
        frame[column] = check_token_counts(frame[column], path, column, row_label(frame))
    return frame


def row_label(frame: pd.DataFrame):
    """How an error names row i (0-based) of a trajectory table: its 1-based number and episode."""
    return lambda i: f"row {i + 1} (episode {frame['episode_id'].iloc[i]})"


def check_token_counts(values: pd.Series, source: Any, column: str, label=None) -> pd.Series:
    """`values` as int64 token counts; InputError naming the first row that is not an integer from
    0 to MAX_TOKEN_COUNT (a float 1e30 would otherwise wrap around to a negative int64)."""
    label = label or (lambda i: f"row {i + 1}")
    if isinstance(values.dtype, np.dtype) and values.dtype.kind in "iu":
        # Compared as integers: above 2**53 a float comparison would not be exact.
        counts = values.to_numpy()
        bad = (counts < 0) | (counts > MAX_TOKEN_COUNT)
    else:
        counts = pd.to_numeric(values, errors="coerce").astype(float).to_numpy()
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(counts) | (counts < 0) | (counts > MAX_TOKEN_COUNT) | (counts != np.floor(counts))
        bad |= values.map(lambda v: isinstance(v, (bool, np.bool_))).to_numpy(dtype=bool)  # True is not 1 token
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        value = values.iloc[i].item() if isinstance(values.iloc[i], np.generic) else values.iloc[i]
        raise InputError(source, column, f"{label(i)}: {value!r} is not a token count "
                                         f"(an integer from 0 to {MAX_TOKEN_COUNT:.0e})")
    return pd.Series(counts.astype("int64"), index=values.index, name=values.name)


def upgrade_v1_turns(table: pa.Table) -> pa.Table:
    """A version-1 turns table with version 2's `observation` column added as "" where TURN_SCHEMA
    has it. Version 1 never logged observations; MTRouter reads "" as "the environment said
    nothing" (models/mtrouter/history.py, interactions_from_turns), so old multi-turn trajectories
    give histories without observations until they are collected again."""
    if "observation" in table.column_names:
        return table
    blank = pa.array([""] * table.num_rows, type=pa.string())
    at = min(TURN_SCHEMA.get_field_index("observation"), table.num_columns)  # a truncated file fails below
    return table.add_column(at, "observation", blank)


def add_later_columns(table: pa.Table, kind: str) -> pa.Table:
    """A version-1 or -2 table with the columns added since (LATER_COLUMNS) at their "not written" value."""
    for name, value in LATER_COLUMNS[kind].items():
        if name not in table.column_names:
            table = table.append_column(name, pa.array([value] * table.num_rows, type=pa.string()))
    return table


def empty_frame(kind: str) -> pd.DataFrame:
    return SCHEMAS[kind].empty_table().to_pandas()


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_format_meta(path: Path, expected_format: str, what: str) -> dict[str, Any]:
    """A saved model's JSON metadata, refusing a missing file or another format version."""
    if not path.is_file():
        raise InputError(path, "<file>", f"not a {what} ({path.name} missing)")
    meta = json.loads(path.read_text())
    if meta.get("format") != expected_format:
        raise InputError(path, "format", f"unsupported {what} format {meta.get('format')!r}")
    return meta


def write_csv_atomic(frame: pd.DataFrame, path: str | Path) -> Path:
    """A CSV written to a temp file beside `path`, then renamed (see write_json_atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            frame.to_csv(fh, index=False)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def write_text_atomic(text: str, path: str | Path) -> Path:
    """Text (UTF-8) written to a temp file beside `path`, then renamed (see write_json_atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def write_json_atomic(obj: Any, path: str | Path) -> Path:
    """JSON written to a temp file beside `path`, then renamed: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)
    return path
