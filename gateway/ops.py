"""The gateway's operational routes: GET /health (liveness) and GET /ready (readiness), and the
request tracing of gateway/telemetry.py when the gateway has telemetry.

/health answers 200 while the process serves HTTP: what a supervisor restarts on. /ready answers 200
only when every served router has a loaded champion and the database answers `SELECT 1` within
READY_TIMEOUT_S, else 503 with what is missing: what a load balancer routes on (a gateway whose
champion is still loading, or whose Postgres is gone, is alive and not ready). Neither asks for a key,
as probes do not have one, and neither says more than which routers are loaded.
"""

from __future__ import annotations

import asyncio
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.responses import JSONResponse

READY_TIMEOUT_S = 2.0


async def readiness(gw: Any) -> tuple[bool, dict[str, Any]]:
    """(ready, body): each router's champion version (None: not loaded) and the database's state."""
    routers = {}
    for name in gw.cfg.routers:
        champion = gw.champions.current(name)
        routers[name] = champion.version if champion is not None else None
    try:
        await asyncio.wait_for(gw.store.arun(lambda conn: conn.execute(sa.text("SELECT 1")).scalar()), READY_TIMEOUT_S)
        database = "ok"
    except asyncio.TimeoutError:
        database = f"no answer within {READY_TIMEOUT_S:g} s"
    except Exception as exc:  # noqa: BLE001 - any driver error means not ready; the body says which
        database = f"error: {type(exc).__name__}: {str(exc)[:200]}"
    ready = database == "ok" and all(v is not None for v in routers.values())
    return ready, {"ready": ready, "routers": routers, "database": database}


def add_operations(app: FastAPI, gw: Any) -> None:
    """/health and /ready on `app`; the tracing middleware when `gw` has telemetry (gateway serve)."""

    @app.get("/health", include_in_schema=False)
    async def health():
        return {"status": "ok"}

    @app.get("/ready", include_in_schema=False)
    async def ready():
        is_ready, body = await readiness(gw)
        return JSONResponse(body, status_code=200 if is_ready else 503)

    instrument = getattr(gw, "instrument", None)  # an ObservedGateway (gateway/telemetry.py) adds its tracing
    if instrument is not None:
        instrument(app)
