"""One real SeaweedFS for the S3 tests of this folder (a stop costs ~15 s, so one per session)."""

from __future__ import annotations

import subprocess

import pytest


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
