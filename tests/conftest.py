"""Shared test setup: no phone-home, offline model hub, the optional ../shared data, and one real
SeaweedFS for the S3 tests (a stop costs ~15 s, so one per session)."""

from __future__ import annotations

import os
import subprocess
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


def weed_or_skip():
    """The `weed` binary, or a skip that says why it cannot run here."""
    from services.seaweedfs import SeaweedFSError, weed_binary

    try:
        weed = weed_binary()
        subprocess.run([str(weed), "version"], capture_output=True, check=True, timeout=30)
    except (SeaweedFSError, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"SeaweedFS cannot run here: {exc}")
    return weed


@pytest.fixture(scope="session")
def weed():
    return weed_or_skip()


@pytest.fixture(scope="session")
def seaweedfs(weed, tmp_path_factory):
    """A running SeaweedFS with a random key pair; its data folder is under pytest's tmp."""
    from services.seaweedfs import seaweedfs_server

    data = tmp_path_factory.mktemp("seaweedfs-data")
    with seaweedfs_server(data_dir=data, log_path=data.parent / "weed.log") as server:
        yield server


@pytest.fixture
def s3_env(seaweedfs, monkeypatch):
    """The environment a team member has: keys and endpoint exported, nothing else."""
    for name, value in seaweedfs.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return seaweedfs
