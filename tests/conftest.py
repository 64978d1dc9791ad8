"""Shared test setup: no phone-home, offline model hub, and the optional ../shared data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

for key, value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
}.items():
    os.environ.setdefault(key, value)


@pytest.fixture
def shared_data() -> Path:
    """../shared/data next to the repository; tests that need it skip on a user's machine."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent (only CI and developers have it)")
    return SHARED_DATA


@pytest.fixture
def record_fits():
    """record_fits(factory, seen) -> a router factory whose routers write the query ids they are
    fitted on into `seen`: the registry's own routers, for tests that no evaluation query reaches
    training data."""
    def recording(factory, seen: set):
        def build(seed):
            router = factory(seed)
            fit = router.fit

            def recorded_fit(data):
                seen.update(data.query_ids)
                return fit(data)

            router.fit = recorded_fit
            return router
        return build
    return recording

