"""A real PostgreSQL cluster on loopback: the team backend for MLflow, Prefect and the gateway.

    with start_postgres() as pg:          # a throw-away cluster in a temp dir
        pg.url("mlflow")                  # postgresql+psycopg://routerops:…@127.0.0.1:PORT/mlflow
        pg.url("prefect", "asyncpg")      # Prefect's server talks to its database through asyncpg

The binaries are the distribution's (Debian: `apt-get install postgresql`, found through
`pg_config --bindir` or /usr/lib/postgresql/<version>/bin). Postgres refuses to run as root, so when
we are root every server command runs as the `postgres` OS user (the Debian package creates it) on a
data directory that user owns.

Authentication is scram-sha-256 with a password generated per cluster: loopback `trust` would let any
local user of a shared machine into the team's runs. The password travels only in connection URLs and
in a 0600 file that initdb deletes; `repr()` of the handle and every error message leave it out.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

from routerops.errors import RouteropsError

TEAM_DATABASES = ("mlflow", "prefect", "gateway")
SUPERUSER = "routerops"
SERVICE_USER = "postgres"  # the OS account Debian's package creates; the server runs as it when we are root
START_TIMEOUT_S = 60


class PostgresUnavailable(RouteropsError):
    """Postgres could not be found or started; the message says which step failed and why."""


@dataclass(frozen=True)
class PostgresServer:
    """A running cluster: where it listens and how to reach each database."""

    host: str
    port: int
    user: str
    data_dir: Path
    socket_dir: Path
    password: str = field(repr=False)  # never printed: the handle may end up in logs and test reports

    def url(self, database: str, driver: str = "psycopg") -> str:
        """An SQLAlchemy URL for `database`; `driver` is psycopg (MLflow, the gateway) or asyncpg (Prefect)."""
        secret = urllib.parse.quote(self.password, safe="")
        return f"postgresql+{driver}://{self.user}:{secret}@{self.host}:{self.port}/{database}"

    def team_urls(self) -> dict[str, str]:
        """The three URLs that switch MLflow, Prefect and the gateway from their embedded SQLite."""
        return {"mlflow": self.url("mlflow"), "prefect": self.url("prefect", "asyncpg"),
                "gateway": self.url("gateway")}


def find_bindir() -> Path:
    """The directory holding initdb, pg_ctl and postgres; the newest version wins where several are installed."""
    candidates: list[Path] = []
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(Path(out.stdout.strip()))
    # Debian keeps the server binaries off PATH, one directory per major version.
    candidates += sorted((Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")),
                         key=lambda p: _major_version(p.parent.name), reverse=True)
    if shutil.which("initdb"):
        candidates.append(Path(shutil.which("initdb")).resolve().parent)
    for bindir in candidates:
        if all((bindir / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    raise PostgresUnavailable("no PostgreSQL server binaries (initdb, pg_ctl, postgres) found via pg_config "
                              "--bindir, /usr/lib/postgresql/*/bin or PATH; on Debian: apt-get install postgresql")


def _major_version(name: str) -> int:
    return int(name) if name.isdigit() else -1


def server_version(bindir: Path) -> str:
    out = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (postgres binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _service_account() -> pwd.struct_passwd | None:
    """The account the server runs as: None (ourselves) unless we are root, who postgres refuses."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        raise PostgresUnavailable(f"running as root, and postgres refuses root, but there is no "
                                  f"'{SERVICE_USER}' OS user to run it as (Debian's postgresql package "
                                  f"creates it)") from None


def _as_service(command: list[str], account: pwd.struct_passwd | None) -> list[str]:
    return command if account is None else ["runuser", "-u", account.pw_name, "--", *command]


def _run(step: str, command: list[str], account, cwd: Path, log: Path | None = None) -> None:
    """Run one server command; on failure say which step failed, with its output (never the password)."""
    done = subprocess.run(_as_service(command, account), cwd=cwd, capture_output=True, text=True,
                          timeout=START_TIMEOUT_S + 30)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip()[-1500:]
        if log is not None and log.is_file():
            detail += "\n--- server log ---\n" + log.read_text(errors="replace")[-2000:]
        raise PostgresUnavailable(f"{step} failed (exit {done.returncode}): {detail}")


def _prepare_dirs(base: Path, account) -> tuple[Path, Path, Path]:
    """data/, run/ (the unix socket) and the log under `base`, owned by the account the server runs as."""
    data, run, log = base / "data", base / "run", base / "postgres.log"
    run.mkdir(parents=True, exist_ok=True)
    log.touch()
    if account is not None:
        for path in (base, run, log):
            os.chown(path, account.pw_uid, account.pw_gid)
        if data.exists():
            os.chown(data, account.pw_uid, account.pw_gid)
    return data, run, log


def _check_reachable(base: Path, account) -> None:
    """The service user must be able to enter `base`; pytest's tmp dirs, for one, are root-only (0700)."""
    if account is None:
        return
    probe = subprocess.run(_as_service(["test", "-x", str(base)], account), capture_output=True)
    if probe.returncode != 0:
        raise PostgresUnavailable(f"{base}: the '{account.pw_name}' user cannot enter this directory or one "
                                  f"of its parents; give a data dir it can reach, or none for a temp dir")


def _initdb(bindir: Path, data: Path, base: Path, password: str, account) -> None:
    # The password goes through a 0600 file, not the command line, which `ps` shows to every user.
    pwfile = base / "pwfile"
    pwfile.write_text(password + "\n")
    pwfile.chmod(0o600)
    if account is not None:
        os.chown(pwfile, account.pw_uid, account.pw_gid)
    try:
        _run("initdb", [str(bindir / "initdb"), "-D", str(data), "-U", SUPERUSER, f"--pwfile={pwfile}",
                        "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8"], account, cwd=base)
    finally:
        pwfile.unlink(missing_ok=True)


def _server_options(port: int, socket_dir: Path, settings: Mapping[str, str]) -> str:
    options = {"listen_addresses": "127.0.0.1", "port": str(port), "unix_socket_directories": str(socket_dir),
               **settings}
    for name, value in options.items():
        if not re.fullmatch(r"[a-z_]+", name) or not re.fullmatch(r"[\w./:-]*", value):
            raise PostgresUnavailable(f"server setting {name}={value!r}: only plain names and values are passed")
    return " ".join(f"-c {name}={value}" for name, value in options.items())


def _create_databases(server: PostgresServer, databases: tuple[str, ...]) -> None:
    import psycopg  # the driver is imported only when a cluster actually starts

    with psycopg.connect(host=server.host, port=server.port, user=server.user, password=server.password,
                         dbname="postgres", autocommit=True, connect_timeout=10) as conn:
        existing = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
        for name in databases:
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
                raise PostgresUnavailable(f"database name {name!r}: use lower-case letters, digits and _")
            if name not in existing:
                conn.execute(f'CREATE DATABASE "{name}"')


@contextlib.contextmanager
def start_postgres(data_dir: Path | None = None, databases: tuple[str, ...] = TEAM_DATABASES,
                   password: str | None = None, settings: Mapping[str, str] | None = None,
                   ) -> Iterator[PostgresServer]:
    """Start a cluster on 127.0.0.1 (a free port), create `databases`, yield its handle, stop it after.

    `data_dir`: a folder that keeps the cluster between runs (created and initialised on first use,
    reopened with the same `password` after); None for a temp dir removed on exit. `settings` are
    extra server settings, e.g. {"fsync": "off"} for throw-away test clusters.
    """
    bindir, account = find_bindir(), _service_account()
    base = Path(data_dir).resolve() if data_dir is not None else Path(tempfile.mkdtemp(prefix="routerops-pg-"))
    fresh = not (base / "data" / "PG_VERSION").is_file()
    if not fresh and password is None:
        raise PostgresUnavailable(f"{base / 'data'}: an existing cluster; pass the password it was created with")
    password = password or secrets.token_urlsafe(24)
    base.mkdir(parents=True, exist_ok=True)
    data, socket_dir, log = _prepare_dirs(base, account)
    _check_reachable(base, account)
    if fresh:
        _initdb(bindir, data, base, password, account)
    server = PostgresServer("127.0.0.1", free_port(), SUPERUSER, data, socket_dir, password)
    pg_ctl = str(bindir / "pg_ctl")
    try:
        _run(f"starting {server_version(bindir)} on 127.0.0.1:{server.port}",
             [pg_ctl, "start", "-w", "-t", str(START_TIMEOUT_S), "-D", str(data), "-l", str(log),
              "-o", _server_options(server.port, socket_dir, settings or {})], account, cwd=base, log=log)
        try:
            _create_databases(server, tuple(databases))
            yield server
        finally:
            # fast: roll back open transactions and disconnect clients, so a test's leftover
            # connection cannot hold the shutdown up.
            _run("stopping postgres", [pg_ctl, "stop", "-w", "-m", "fast", "-D", str(data)], account, cwd=base)
    finally:
        if data_dir is None:
            shutil.rmtree(base, ignore_errors=True)
