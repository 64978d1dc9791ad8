"""The gateway's decision log, its schema and its reader: one row per routed request (`gateway_decisions`),
read back as bandit feedback by off-policy evaluation (evaluation/ope.py) and the loop on the gateway's
traffic (flows/ope_loop.py). It lives in the core, below both the gateway (gateway/store.py writes it,
through the same table and `metadata`) and evaluation: reading the log imports no gateway code."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import sqlalchemy as sa

metadata = sa.MetaData()  # the gateway's tables (gateway/store.py adds its keys, spend and holds to it)
decisions_table = sa.Table(
    "gateway_decisions", metadata,
    sa.Column("decision_id", sa.String(40), primary_key=True),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.Column("key_id", sa.String(32), nullable=False),
    sa.Column("router", sa.String(200), nullable=False),  # registered name
    sa.Column("router_version", sa.String(32), nullable=False),
    sa.Column("price_book_version", sa.String(100), nullable=False),
    sa.Column("query_id", sa.String(64), nullable=False),
    sa.Column("query", sa.Text, nullable=False),  # "" when the gateway is told not to log texts
    sa.Column("chosen", sa.String(200), nullable=False),  # the router's choice
    sa.Column("worker", sa.String(200), nullable=False),  # who answered ("" if none did)
    sa.Column("propensity", sa.Float, nullable=False),  # P(chosen | query) under the serving policy
    sa.Column("explanation", sa.Text, nullable=False),  # JSON: candidates, budget, λ, attempts
    sa.Column("status", sa.String(32), nullable=False),  # ok | worker_error | client_gone
    sa.Column("prompt_tokens", sa.Integer, nullable=False, default=0),
    sa.Column("completion_tokens", sa.Integer, nullable=False, default=0),
    sa.Column("cost_usd", sa.Float, nullable=False, default=0.0),
    sa.Column("usage_source", sa.String(16), nullable=False, default="worker"),  # worker | estimated
    sa.Column("response", sa.Text, nullable=False, default=""),
    sa.Column("latency_s", sa.Float, nullable=False, default=0.0),
    sa.Column("score", sa.Float, nullable=True),  # filled by POST /v1/decisions/{id}/feedback
    sa.Column("graded_at", sa.String(32), nullable=True),  # when the score was posted (ISO-8601 UTC, μs)
    # The query's embedding (JSON list) when the gateway keeps no texts (`log_texts` off): what a
    # router that reads only embeddings needs for off-policy evaluation and retraining (README).
    sa.Column("embedding", sa.Text, nullable=False, default=""),
)
# Columns added after the first release: a database made before them gets them at start (add_columns).
LATER_DECISION_COLUMNS = ("graded_at", "embedding")
DECISION_COLUMNS = tuple(c.name for c in decisions_table.columns)


def now_iso() -> str:
    """UTC now as ISO-8601 with microseconds (a grade's time: the retrain's cut-off compares against it)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def read_decisions(url: str, graded_only: bool = False) -> pd.DataFrame:
    """The decision log as bandit feedback: one row per routed request, with the logged-outcome
    columns (docs/replay_format.md: dataset, query_id, query, worker, score, prompt_tokens,
    completion_tokens, response) plus `propensity`, `chosen`, `router_version`, `decision_id`.
    Only one worker per query is observed, so it is not a complete grid: an off-policy estimate
    (e.g. inverse propensity weighting) reads it, not `load_logged_outcomes`."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        frame = pd.read_sql(sa.select(decisions_table).where(decisions_table.c.worker != ""), conn)
    engine.dispose()
    frame.insert(0, "dataset", "gateway")
    if graded_only:
        frame = frame[frame.score.notna()].reset_index(drop=True)
    return frame
