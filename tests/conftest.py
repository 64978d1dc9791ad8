"""Shared test setup: no phone-home, offline model hub, the optional ../shared data, one real
SeaweedFS for the S3 tests (a stop costs ~15 s, so one per session) and one Prefect test server for
every test that runs a flow and one llama.cpp server for the tests that only talk to one (a start
costs 10-60 s on two busy cores, so one each per session)."""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import sqlite3
import subprocess
from contextlib import ExitStack
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

# Under pytest-xdist (`make test`: two workers) each worker gets a Prefect home of its own: flows run
# without a server of their own start Prefect's ephemeral one on PREFECT_HOME's SQLite database,
# which two processes must not migrate and write at once. Set before any test imports prefect.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect")
    _worker_home = _home / f"xdist-{os.environ['PYTEST_XDIST_WORKER']}"
    _worker_home.mkdir(parents=True, exist_ok=True)  # Prefect creates only the last level (a warning in CI)
    os.environ["PREFECT_HOME"] = str(_worker_home)



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


@pytest.fixture(scope="session")
def mlflow_schema(tmp_path_factory) -> Path:
    """An empty MLflow database at MLflow's current schema, made once: MLflow migrates a new SQLite
    store through its whole alembic history, seconds per store on two busy cores. The Default
    experiment is left out: the store that opens a copy creates it under its own artifact root,
    exactly as on a new database."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    folder = tmp_path_factory.mktemp("mlflow-schema")
    path = folder / "mlflow.db"
    SqlAlchemyStore(f"sqlite:///{path}", str(folder / "artifacts")).engine.dispose()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("DELETE FROM experiments WHERE experiment_id = 0")
    return path


@pytest.fixture(scope="session")
def new_mlflow_db(mlflow_schema):
    """new_mlflow_db(path) -> path: a new, empty MLflow SQLite store there (a copy of the migrated one)."""
    def make(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(mlflow_schema, path)
        return path
    return make


@pytest.fixture
def mlflow_db(new_mlflow_db, tmp_path) -> Path:
    """tmp_path/mlflow.db: this test's own, empty MLflow store, already migrated."""
    return new_mlflow_db(tmp_path / "mlflow.db")


@pytest.fixture(scope="session")
def llm_url():
    """One real llama.cpp server (SmolLM2, the embedded pool's context of 2,048 tokens) for every test
    that only talks to it: the gateway's, the baselines', the executor's and collection's. Tests of
    the server itself, or that count its calls in its log, start their own."""
    from routerops.workers.server import local_llm_server

    with local_llm_server(n_ctx=2048) as url:
        yield url


@pytest.fixture(scope="session")
def prefect_test_server(tmp_path_factory):
    """One Prefect API server (uvicorn in a subprocess, its own SQLite database under pytest's tmp)
    for the whole run; `prefect_api` points a test at it. Flows, runs and events of different tests
    share its database, as they would a team's server: a test reads back only what it wrote."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL, temporary_settings

    from routerops.workers.server import free_port

    db = tmp_path_factory.mktemp("prefect-test-server") / "prefect.db"
    # The subprocess takes the settings in force when it starts: its database is this file.
    with temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{db}"}):
        server = SubprocessASGIServer(port=free_port())
        server.start(timeout=300)  # generous: the first start imports the whole server on a busy machine
    yield server
    server.stop()


@pytest.fixture
def prefect_api(prefect_test_server, tmp_path):
    """This test's flows and clients talk to the session's Prefect test server (what Prefect's
    `prefect_test_harness` does, without starting a server per test); its URL. Logs and events still
    queued are sent before the next test, so none leak into it."""
    import prefect.context
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings
    from prefect.utilities.asyncutils import run_coro_as_sync

    with ExitStack() as stack:
        # Its own Prefect home: task results and caches never reach the next test or the checkout.
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: prefect_test_server.api_url,
                                                        PREFECT_HOME: tmp_path / "prefect-home"}))
        # Also the process-wide settings, for contexts copied before this test began (task runners'
        # threads, the event loop of an async fixture), as prefect_test_harness does.
        stack.enter_context(prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()))
        yield prefect_test_server.api_url

        async def drain():  # both return an awaitable inside a running loop, a result outside one
            try:
                sent = APILogWorker.instance().drain()
                if inspect.isawaitable(sent):
                    await sent
            except RuntimeError:  # no log was sent: the worker never started
                pass
            sent = EventsWorker.drain_all()
            if inspect.isawaitable(sent):
                await sent

        run_coro_as_sync(drain())
