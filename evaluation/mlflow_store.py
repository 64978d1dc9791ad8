"""A project's MLflow store that can be moved: artifact paths follow the project folder.

MLflow keeps every local artifact location as an absolute path: it resolves a relative location when
it creates an experiment (`resolve_uri_if_local` in its SQLAlchemy store), and each run, logged model
and model version stores its own absolute copy (runs.artifact_uri, logged_models.artifact_location,
model_versions.source/storage_location, the traces' artifact-location tag). A store copied to another
folder or machine therefore still points at the old folder. Relative paths in the database are not an
option: MLflow resolves them against the working directory of whichever process reads them.

So the store keeps MLflow's absolute paths, and opening it (`use_tracking`, `make mlflow-ui`) checks
them: when the project experiment's artifact root is another local folder than the configured one
(track.artifact_root, resolved here) and the configured one holds that experiment's run folders (it
was copied or moved with the store), every stored path under the old root is rewritten to the new
one, in one transaction, and the move is logged. A new, empty artifact_root is not a move: the old
runs keep their folder and only new experiments use the new one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import sqlalchemy as sa

logger = logging.getLogger(__name__)

# (table, column) pairs that hold an artifact location; a (table, column, key column, key) row is a tag
# table whose value is a location only for that key.
PATH_COLUMNS: tuple[tuple[str, str], ...] = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)
PATH_TAGS: tuple[tuple[str, str, str, str], ...] = (
    ("trace_tags", "value", "key", "mlflow.artifactLocation"),
)


def local_path(location: str) -> Path | None:
    """The folder a local artifact location names (a file: URI or a plain path); None for a remote URI."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "" or len(parsed.scheme) == 1:  # a plain path (a Windows drive letter parses as a scheme)
        return Path(location)
    return None


def prefix_forms(location: str) -> list[str]:
    """The spellings MLflow may store for one local root: its file URI and its plain path."""
    path = local_path(location)
    return [location] if path is None else [path.as_uri(), str(path)]


def _rewrite(conn: sa.Connection, table: sa.Table, column: str, old: str, new: str,
             where: sa.ColumnElement | None = None) -> int:
    """Replace the prefix `old` by `new` in `table.column` where it is the whole value or a parent folder."""
    col = table.c[column]
    under = sa.or_(col == old, sa.func.substr(col, 1, len(old) + 1) == old + "/")
    new_value = sa.literal(new) + sa.func.substr(col, len(old) + 1)
    stmt = sa.update(table).where(under if where is None else sa.and_(under, where)).values({column: new_value})
    return conn.execute(stmt).rowcount or 0


def rewrite_artifact_roots(tracking_uri: str, moves: dict[str, str]) -> int:
    """Rewrite every stored artifact location under each old root of `moves` (old -> new, local folders as
    file URIs or paths) to lie under its new root, all in one transaction; returns the rows changed."""
    engine = sa.create_engine(tracking_uri)
    try:
        meta = sa.MetaData()
        tables = set(sa.inspect(engine).get_table_names())
        changed = 0
        with engine.begin() as conn:
            for old_root, new_root in moves.items():
                for old, new in zip(prefix_forms(old_root), prefix_forms(new_root)):
                    for name, column in PATH_COLUMNS:
                        if name in tables:
                            changed += _rewrite(conn, sa.Table(name, meta, autoload_with=conn), column, old, new)
                    for name, column, key_column, key in PATH_TAGS:
                        if name in tables:
                            table = sa.Table(name, meta, autoload_with=conn)
                            changed += _rewrite(conn, table, column, old, new, table.c[key_column] == key)
        return changed
    finally:
        engine.dispose()


def moved_location(client, experiment, root: Path) -> Path | None:
    """Where `experiment`'s artifacts are under this project's `root`, if they were moved or copied
    there, else None. The pipeline's experiments keep their runs in root/<run_id>; an experiment given
    the server's default location (`mlflow ui --default-artifact-root`) in root/<experiment_id>/<run_id>.
    An experiment without runs, or whose runs are not there (a new, empty artifact_root), has not moved."""
    old = local_path(experiment.artifact_location)
    if old is None:
        return None
    runs = client.search_runs([experiment.experiment_id], max_results=20)
    for new in (root, root / old.name):
        if new != old and any((new / run.info.run_id).is_dir() for run in runs):
            return new
    return None


def follow_moved_store(tracking_uri: str, root_uri: str) -> int:
    """If the store was moved or copied with its project (an experiment's local artifact location is
    another folder, and `root_uri`, this project's artifact root, holds its runs' folders), point every
    stored location at the new folder; returns the rows changed. A copy is repointed even while the
    original folder is still there: a teammate's copy must read and write its own artifacts."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    root = local_path(root_uri)
    # Only a SQLite store travels with its project; a team's database server is shared, and one member's
    # copy of the artifacts must not repoint everyone's runs.
    if root is None or not root.is_dir() or not tracking_uri.startswith("sqlite:"):
        return 0
    client = MlflowClient(tracking_uri)
    moves: dict[str, str] = {}
    for experiment in client.search_experiments(view_type=ViewType.ALL):
        new = moved_location(client, experiment, root)
        if new is not None:
            moves[experiment.artifact_location] = new.as_uri()
    if not moves:
        return 0
    changed = rewrite_artifact_roots(tracking_uri, moves)
    for old, new in moves.items():
        logger.warning("MLflow store moved: artifact locations under %s now under %s", local_path(old), local_path(new))
    logger.warning("MLflow store moved: %d stored locations rewritten", changed)
    return changed
