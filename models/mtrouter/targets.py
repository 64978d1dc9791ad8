"""Error-penalised, turn-conditional outcome targets (MTRouter §3.3, eq. 5-6; App. B).

    S̃_t = S_final − Σ_{i=t}^{T−1} ρ_i                                            (eq. 5)
    ρ_i = 1[E_i ≠ ∅] · β_sev(E_i) · w((i+1)/T_max) · (1/N) · score_range          (eq. 6, App. B)

β is the severity coefficient of the most severe error detected at turn i (high 1.0, medium 0.8,
low 0.2), w the piecewise-linear progress warm-up (w_min up to p0, linear to w_max at p1, w_max
after), and 1/N the base penalty, N the expected episode length of the task category (App. B).
`score_range` rescales the penalty for environments whose scores are not on a unit scale.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from models.mtrouter.config import SEVERITIES, MTRouterConfig
from routerops.errors import InputError


def progress_weight(progress: np.ndarray | float, cfg: MTRouterConfig) -> np.ndarray:
    """w(p): monotone piecewise-linear warm-up, so late errors cost more than early ones (eq. 6)."""
    p = np.asarray(progress, dtype=float)
    return np.interp(p, [cfg.progress_p0, cfg.progress_p1], [cfg.progress_w_min, cfg.progress_w_max])


def parse_errors(cell: Any, where: str = "turns.errors") -> list[dict[str, Any]]:
    """The turn's `errors` column: a JSON list of {"rule", "severity"} (or an already-parsed list)."""
    if cell is None or (isinstance(cell, float) and np.isnan(cell)) or cell == "":
        return []
    if isinstance(cell, str):
        try:
            cell = json.loads(cell)
        except json.JSONDecodeError as exc:
            raise InputError("<turns table>", where, f"not valid JSON: {exc}") from exc
    if not isinstance(cell, (list, tuple)):
        raise InputError("<turns table>", where, f"expected a list of errors, got {type(cell).__name__}")
    for err in cell:
        if not isinstance(err, Mapping) or err.get("severity") not in SEVERITIES:
            raise InputError("<turns table>", where, f"each error needs a severity in {SEVERITIES}, got {err!r}")
    return list(cell)


def turn_severity(errors: Sequence[Mapping[str, Any]], cfg: MTRouterConfig) -> float:
    """β_sev(E_i): coefficient of the most severe error at the turn; 0 when there is none."""
    coefficients = cfg.severity_coefficients()
    return max((coefficients[e["severity"]] for e in errors), default=0.0)


def turn_penalties(errors_per_turn: Sequence[Sequence[Mapping[str, Any]]], turn_limit: int, base_penalty: float,
                   cfg: MTRouterConfig) -> np.ndarray:
    """ρ_i for i = 0 … T−1 of one episode (eq. 6)."""
    if turn_limit <= 0:
        raise InputError("<episodes table>", "turn_limit", f"must be positive to form progress (i+1)/T_max, got {turn_limit}")
    beta = np.array([turn_severity(errs, cfg) for errs in errors_per_turn], dtype=float)
    progress = (np.arange(len(beta)) + 1.0) / float(turn_limit)
    return beta * progress_weight(progress, cfg) * base_penalty * cfg.score_range


def penalised_targets(final_score: float, penalties: np.ndarray) -> np.ndarray:
    """S̃_t = S_final − Σ_{i≥t} ρ_i for every t (eq. 5): a reversed cumulative sum."""
    future_penalty = np.cumsum(np.asarray(penalties, dtype=float)[::-1])[::-1]
    return float(final_score) - future_penalty


def expected_episode_lengths(episodes: pd.DataFrame, cfg: MTRouterConfig) -> dict[str, float]:
    """N per task category (suite): the configured value, else the mean logged episode length."""
    if cfg.expected_episode_length > 0:
        return {str(s): float(cfg.expected_episode_length) for s in episodes["suite"].unique()}
    lengths = episodes.groupby("suite")["turns"].mean()
    return {str(s): max(float(n), 1.0) for s, n in lengths.items()}


def turn_targets(episodes: pd.DataFrame, turns: pd.DataFrame, cfg: MTRouterConfig,
                 lengths: Mapping[str, float] | None = None) -> pd.Series:
    """S̃_t for every row of `turns` (same index), from the episodes/turns tables of routerops.schema.

    With cfg.error_penalty off (Table 4 ablation) every turn's target is its episode's S_final.
    `lengths` (suite → N) lets a caller fix N from training data before scoring other splits.
    """
    missing = [c for c in ("episode_id", "score", "turn_limit", "suite", "turns") if c not in episodes.columns]
    if missing:
        raise InputError("<episodes table>", missing[0], "column missing")
    by_episode = episodes.set_index("episode_id")
    unknown = sorted(set(turns["episode_id"]) - set(by_episode.index))
    if unknown:
        raise InputError("<turns table>", "episode_id", f"turn of unknown episode {unknown[0]!r}")
    lengths = dict(lengths) if lengths is not None else expected_episode_lengths(episodes, cfg)
    targets = pd.Series(np.nan, index=turns.index, dtype=float)
    for eid, rows in turns.groupby("episode_id", sort=False):
        rows = rows.sort_values("turn_index")
        episode = by_episode.loc[eid]
        if not cfg.error_penalty:
            targets.loc[rows.index] = float(episode["score"])
            continue
        errors = [parse_errors(cell, f"errors (episode {eid}, turn {i})") for cell, i in zip(rows["errors"], rows["turn_index"])]
        n = lengths.get(str(episode["suite"]), float(episode["turns"]) or 1.0)
        rho = turn_penalties(errors, int(episode["turn_limit"]), 1.0 / n, cfg)
        targets.loc[rows.index] = penalised_targets(float(episode["score"]), rho)
    return targets
