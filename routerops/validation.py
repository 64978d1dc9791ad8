"""Great Expectations suite over the trajectory tables (episodes, turns) of `routerops.schema`.

Every check is a GX expectation, run on an ephemeral context with a pandas datasource, one context
per call. Where a rule spans rows or tables (contiguous turn indices, episode cost = sum of its turns,
costs derived from tokens under the price book) GX has no expectation for it, so a helper column is
computed here in pandas and the expectation is set on that column. Each expectation carries its
check name in `meta["check"]`, which is how failures are reported.

`validate_trajectories` returns a `ValidationReport`; `check_trajectory_rows` is the CLI's edge: it
raises `InputError(path, field, problem)` naming the file and the column of the first broken check.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from routerops.errors import InputError
from routerops.orchestra.modes import CONTROLLER_ACTOR
from routerops.pricing import Pool, PriceBook, derive_costs
from routerops.schema import END_REASONS, SCHEMAS

COST_RTOL = 1e-12  # costs are recomputed with the same formula, so only float rounding may differ
TOKEN_COLUMNS = ("prompt_tokens", "completion_tokens", "cached_tokens")
N_EXAMPLES = 5


@dataclass
class CheckResult:
    check: str  # our name for the rule, e.g. "turn_index_contiguous"
    table: str  # "episodes" or "turns"
    column: str  # the column the failure shows in
    expectation: str  # the GX expectation type that ran
    success: bool
    unexpected_count: int = 0
    examples: list[Any] = field(default_factory=list)  # a few failing rows: key columns and the value


@dataclass
class ValidationReport:
    passed: bool
    n_episodes: int
    n_turns: int
    price_book_version: str
    results: list[CheckResult]

    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.success]

    def failed_checks(self) -> set[str]:
        return {r.check for r in self.failures()}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- helper columns


def relative_error(a: pd.Series, b: pd.Series) -> pd.Series:
    """|a - b| / max(|a|, |b|), 0 where both are 0; NaN where either is NaN (not judged here)."""
    a, b = a.astype(float), b.astype(float)
    scale = np.maximum(a.abs(), b.abs())
    err = (a - b).abs() / scale.where(scale > 0, 1.0)
    return err.where(scale > 0, (a - b).abs())


def derived_turn_costs(turns: pd.DataFrame, book: PriceBook) -> pd.Series:
    """`derive_costs` for the turns whose worker has a price; NaN for the rest (their rows fail
    `worker_priced` instead of aborting the whole validation)."""
    out = pd.Series(np.nan, index=turns.index, dtype=float)
    priced = turns["worker"].isin(list(book.prices))
    if priced.any():
        out[priced] = derive_costs(turns[priced], book)
    return out


def augment_turns(turns: pd.DataFrame, episodes: pd.DataFrame, pool: Pool, book: PriceBook) -> pd.DataFrame:
    t = turns.reset_index(drop=True)
    # Within an episode, the k-th smallest turn_index must be k: with unique (episode, index) pairs
    # this makes the indices exactly 0..n-1.
    t["_expected_turn_index"] = t.sort_values("turn_index", kind="mergesort").groupby("episode_id").cumcount()
    t["_derived_cost_usd"] = derived_turn_costs(t, book)
    t["_cost_rel_error"] = relative_error(t["cost_usd"], t["_derived_cost_usd"])
    t["_episode_known"] = t["episode_id"].isin(set(episodes["episode_id"]))
    # An orchestrator's own turns name the controller as their worker: it is priced, not in the pool.
    t["_worker_known"] = t["worker"].isin(pool.names) | (t["actor"] == CONTROLLER_ACTOR)
    return t


def augment_episodes(episodes: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    e = episodes.reset_index(drop=True)
    sums = turns.groupby("episode_id").agg(
        _turn_rows=("turn_index", "size"), _turn_cost_sum=("cost_usd", "sum"),
        **{f"_turn_{c}": (c, "sum") for c in TOKEN_COLUMNS},
    )
    e = e.join(sums, on="episode_id")
    e["_turn_rows"] = e["_turn_rows"].fillna(0).astype("int64")  # an episode stopped before any call
    for c in ["_turn_cost_sum", *[f"_turn_{c}" for c in TOKEN_COLUMNS]]:
        e[c] = e[c].fillna(0)
    for c in TOKEN_COLUMNS:
        e[f"_turn_{c}"] = e[f"_turn_{c}"].astype("int64")
    e["_cost_rel_error"] = relative_error(e["cost_usd"], e["_turn_cost_sum"])
    return e


# ---------------------------------------------------------------- the suites


def m(check: str) -> dict[str, Any]:
    """Expectation kwargs that carry our check name through to the validation result."""
    return {"meta": {"check": check}}


def episode_expectations(gxe: Any, book: PriceBook, score_range: tuple[float, float]) -> list[Any]:
    checks = [
        gxe.ExpectColumnValuesToBeUnique(column="episode_id", **m("episode_id_unique")),
        gxe.ExpectColumnValuesToNotBeNull(column="episode_id", **m("episode_id_present")),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="turns", column_B="_turn_rows", **m("turn_count_matches")),
        gxe.ExpectColumnValuesToBeBetween(column="_cost_rel_error", min_value=0, max_value=COST_RTOL,
                                          **m("episode_cost_is_sum")),
        gxe.ExpectColumnValuesToNotBeNull(column="cost_usd", **m("episode_cost_present")),
        gxe.ExpectColumnValuesToNotBeNull(column="score", **m("score_present")),
        gxe.ExpectColumnValuesToBeBetween(column="score", min_value=score_range[0], max_value=score_range[1],
                                          **m("score_in_range")),
        gxe.ExpectColumnValuesToBeInSet(column="ended_by", value_set=list(END_REASONS), **m("ended_by_known")),
        gxe.ExpectColumnValuesToBeInSet(column="price_book_version", value_set=[book.version],
                                        **m("price_book_matches")),
    ]
    for c in TOKEN_COLUMNS:
        checks.append(gxe.ExpectColumnValuesToBeBetween(column=c, min_value=0, **m("tokens_non_negative")))
        checks.append(gxe.ExpectColumnPairValuesToBeEqual(column_A=c, column_B=f"_turn_{c}",
                                                          **m("episode_tokens_are_sum")))
    return checks


def turn_expectations(gxe: Any, pool: Pool, book: PriceBook) -> list[Any]:
    checks = [
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["episode_id", "turn_index"], **m("turn_key_unique")),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="turn_index", column_B="_expected_turn_index",
                                            **m("turn_index_contiguous")),
        gxe.ExpectColumnValuesToBeInSet(column="_episode_known", value_set=[True], **m("turn_episode_exists")),
        gxe.ExpectColumnValuesToBeInSet(column="_worker_known", value_set=[True], **m("worker_in_pool")),
        gxe.ExpectColumnValuesToBeInSet(column="worker", value_set=list(book.prices), **m("worker_priced")),
        gxe.ExpectColumnValuesToNotBeNull(column="cost_usd", **m("turn_cost_present")),
        gxe.ExpectColumnValuesToBeBetween(column="_cost_rel_error", min_value=0, max_value=COST_RTOL,
                                          **m("turn_cost_derived")),
        gxe.ExpectColumnValuesToNotBeNull(column="propensity", **m("propensity_present")),
        # "" is a real value (the environment said nothing); null means a writer dropped the column's
        # value, and MTRouter would silently train on histories without o_{t+1} (§3.2, eq. 2).
        gxe.ExpectColumnValuesToNotBeNull(column="observation", **m("observation_present")),
        gxe.ExpectColumnValuesToBeBetween(column="propensity", min_value=0, max_value=1, strict_min=True,
                                          **m("propensity_in_range")),
    ]
    for c in TOKEN_COLUMNS:
        checks.append(gxe.ExpectColumnValuesToBeBetween(column=c, min_value=0, **m("tokens_non_negative")))
    return checks


# Where a failure of a helper column shows to the user: the real column it is computed from.
SHOWN_COLUMN = {"_turn_rows": "turns", "_cost_rel_error": "cost_usd", "_expected_turn_index": "turn_index",
                "_episode_known": "episode_id", "_worker_known": "worker", **{f"_turn_{c}": c for c in TOKEN_COLUMNS}}
# Checks that compare a row with values computed from other rows: they fail as a consequence when a
# row-level check fails, so the CLI reports them last.
CONSISTENCY_CHECKS = {"turn_count_matches", "episode_cost_is_sum", "episode_tokens_are_sum", "turn_cost_derived"}
KEY_COLUMNS = {"episodes": ["episode_id"], "turns": ["episode_id", "turn_index"],
               "decisions": ["episode_id"], "sft": ["episode_id"]}  # the last two: the curriculum filter


def run_suite(context: Any, name: str, frame: pd.DataFrame, expectations: list[Any]) -> list[CheckResult]:
    import great_expectations as gx

    batch = (context.data_sources.add_pandas(name=f"routerops_{name}")
             .add_dataframe_asset(name=name)
             .add_batch_definition_whole_dataframe(name)
             .get_batch(batch_parameters={"dataframe": frame.reset_index(drop=True)}))
    suite = context.suites.add(gx.ExpectationSuite(name=name, expectations=expectations))
    keys = [k for k in KEY_COLUMNS[name] if k in frame.columns]
    # SUMMARY keeps only N_EXAMPLES failing rows (with their key columns), not every failing value
    result = batch.validate(suite, result_format={"result_format": "SUMMARY", "unexpected_index_column_names": keys,
                                                  "partial_unexpected_count": N_EXAMPLES})
    return [to_check_result(name, r) for r in result.results]


def to_check_result(table: str, r: Any) -> CheckResult:
    config = r.expectation_config
    kwargs = config.kwargs
    column = kwargs.get("column") or kwargs.get("column_A") or ",".join(kwargs.get("column_list", []))
    helper = kwargs.get("column_B") if str(kwargs.get("column_B", "")).startswith("_") else column
    result = r.result or {}
    examples = result.get("partial_unexpected_index_list") or result.get("partial_unexpected_list") or []
    return CheckResult(
        check=config.meta["check"], table=table, column=SHOWN_COLUMN.get(helper, SHOWN_COLUMN.get(column, column)),
        expectation=config.type, success=bool(r.success),
        unexpected_count=int(result.get("unexpected_count") or 0),
        examples=[plain(e) for e in examples[:N_EXAMPLES]],
    )


def plain(value: Any) -> Any:
    """JSON-ready copy of a GX example: numpy scalars to Python, NaN to None, tuples to lists."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def ephemeral_context() -> Any:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # no usage statistics, the machine is offline
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    return context


def validate_trajectories(episodes: pd.DataFrame, turns: pd.DataFrame, pool: Pool, book: PriceBook,
                          score_range: tuple[float, float] = (0.0, 1.0)) -> ValidationReport:
    """Run the episodes and turns suites; `passed` only when every expectation holds."""
    import great_expectations.expectations as gxe

    context = ephemeral_context()
    results = run_suite(context, "episodes", augment_episodes(episodes, turns),
                        episode_expectations(gxe, book, score_range))
    results += run_suite(context, "turns", augment_turns(turns, episodes, pool, book), turn_expectations(gxe, pool, book))
    return ValidationReport(passed=all(r.success for r in results), n_episodes=len(episodes), n_turns=len(turns),
                            price_book_version=book.version, results=results)


def write_validation_report(report: ValidationReport, path: str | Path) -> Path:
    """JSON, written atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(report.to_dict(), fh, indent=2)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


# ---------------------------------------------------------------- the CLI's edge


def check_column_types(frame: pd.DataFrame, kind: str, path: str | Path) -> None:
    """Every schema column present and convertible to its Arrow type; names the first broken one."""
    for f in SCHEMAS[kind]:
        if f.name not in frame.columns:
            raise InputError(path, f.name, "column missing")
        try:
            pa.array(frame[f.name], type=f.type, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise InputError(path, f.name, f"not {f.type}: {exc}") from exc


def check_trajectory_rows(episodes: pd.DataFrame, turns: pd.DataFrame, pool: Pool, book: PriceBook,
                          episodes_path: str | Path = "<episodes>", turns_path: str | Path = "<turns>",
                          score_range: tuple[float, float] = (0.0, 1.0)) -> ValidationReport:
    """Validate and raise `InputError(file, column, problem)` for the first failing check."""
    check_column_types(episodes, "episodes", episodes_path)
    check_column_types(turns, "turns", turns_path)
    report = validate_trajectories(episodes, turns, pool, book, score_range)
    # A bad value in one row also breaks the sums and derived costs built from it; name the row first.
    for failure in sorted(report.failures(), key=lambda f: f.check in CONSISTENCY_CHECKS):
        path = episodes_path if failure.table == "episodes" else turns_path
        raise InputError(path, failure.column, f"{failure.check}: {failure.unexpected_count} row(s) fail "
                                               f"({failure.expectation}), e.g. {failure.examples[:3]}")
    return report
