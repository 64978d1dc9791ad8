"""The loop on the gateway's own traffic (evaluation/drift.py): a drift check that emits
`routerops.champion.drift` once per breach, and the retrain it triggers (deployment
`retrain-from-log`, flows/deployments.py): refit on the graded decisions before the event's cut-off,
register, and gate the new version off-policy on the champion's held-out traffic.

    routerops drift check --log sqlite:///gateway.db --router router-knn     # e.g. from cron
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from prefect import flow

from evaluation.drift import DRIFT_EVENT, DriftConfig, check_drift, retrain_from_log
from evaluation.tracking import use_tracking
from routerops.config import load_params
from routerops.layout import Layout
from routerops.promotion import OffPolicyGateConfig
from routerops.publishing import EVENT_PREFIX


def drift_event(verdict: dict[str, Any]):
    from prefect.events import Event

    return Event(event=DRIFT_EVENT,
                 resource={"prefect.resource.id": f"{EVENT_PREFIX}.champion.{verdict['model']}",
                           "prefect.resource.name": verdict["model"], f"{EVENT_PREFIX}.version": verdict["version"]},
                 payload={k: verdict[k] for k in ("model", "version", "gate", "live", "gap", "bound", "graded",
                                                  "cutoff", "log")})


def emit(event) -> str | None:
    """Send `event` to the Prefect server at PREFECT_API_URL (None when none is configured)."""
    from prefect.settings import PREFECT_API_URL

    from services.prefect_server import _send

    api_url = PREFECT_API_URL.value()
    if not api_url:
        return None
    asyncio.run(_send(event, api_url))
    return str(event.id)


def now_iso() -> str:
    from routerops.decision_log import now_iso as store_now

    return store_now()


@flow(name="routerops-drift-check", log_prints=True)
def drift_check(log: str, name: str, params_file: str = "params.yaml", root: str = ".", bound: float = 0.1,
                min_graded: int = 30, state_file: str = "retrain/drift_state.json") -> dict[str, Any]:
    repo = Layout(Path(root).resolve())
    use_tracking(load_params(repo.resolve(params_file)).track)
    verdict = check_drift(name, log, DriftConfig(bound=bound, min_graded=min_graded,
                                                 state_file=str(repo.resolve(state_file))), now_iso())
    if verdict["emit"]:
        verdict["event_id"] = emit(drift_event(verdict))
    print(verdict["reason"], "→ event emitted" if verdict.get("event_id") else "")
    return verdict


@flow(name="routerops-retrain-from-log", log_prints=True)
def retrain_from_log_flow(log: str, name: str, cutoff: str, params_file: str = "params.yaml", root: str = ".",
                          base_table: str | None = None, min_ess: float = 10.0,
                          out: str = "retrain/from_log") -> dict[str, Any]:
    repo = Layout(Path(root).resolve())
    use_tracking(load_params(repo.resolve(params_file)).track)
    report = retrain_from_log(name, log, cutoff, repo.resolve(out), OffPolicyGateConfig(min_ess=min_ess),
                              base_table=base_table and str(repo.resolve(base_table)))
    print(f"{name} v{report['version']} retrained on {report['training_rows']} decisions before {cutoff}: "
          f"{report['decision']['reason']}")
    return report

