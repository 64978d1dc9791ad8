"""The project's own S3 I/O, through boto3: artefacts a team shares (price books, a run's reports).

Everything about the store comes from the environment, never from params.yaml or a tracked file:
the key pair from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (what DVC's dvc-s3 and MLflow read too),
the endpoint from ROUTEROPS_S3_ENDPOINT_URL, else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (boto3's own
names), else AWS itself. Errors are one line that names the variable, the URL or the object.

Downloads are atomic: a temporary file beside the target, renamed over it once complete, so a
reader never sees half a file and an interrupted pull leaves the old one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config

from routerops.errors import RouteropsError
from routerops.schema import file_sha256

ENDPOINT_VARS = ("ROUTEROPS_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
KEY_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
DEFAULT_REGION = "us-east-1"  # self-hosted stores ignore it; SigV4 needs one to sign
# Refusals that mean "wrong key pair", as opposed to a missing bucket or object.
AUTH_ERRORS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "403"}


class S3Error(RouteropsError):
    """An S3 operation failed: missing credentials, unreachable endpoint, refused keys, no such object."""


def endpoint_from_env(env: Mapping[str, str] = os.environ) -> str | None:
    """The S3 endpoint URL, or None for AWS itself."""
    return next((env[name] for name in ENDPOINT_VARS if env.get(name)), None)


def keys_from_env(env: Mapping[str, str] = os.environ) -> tuple[str, str]:
    missing = [name for name in KEY_VARS if not env.get(name)]
    if missing:
        raise S3Error(f"{' and '.join(missing)} not set: export the S3 key pair "
                      f"({', '.join(KEY_VARS)}) before using the team store")
    return env[KEY_VARS[0]], env[KEY_VARS[1]]


def s3_client(endpoint_url: str | None = None, access_key: str | None = None, secret_key: str | None = None):
    """A boto3 S3 client. With no arguments, everything comes from the environment (see module doc);
    the arguments exist for the code that starts a server and knows its keys (services/seaweedfs.py)."""
    if access_key is None or secret_key is None:
        access_key, secret_key = keys_from_env()
    endpoint_url = endpoint_url or endpoint_from_env()
    config = Config(
        signature_version="s3v4",
        s3={"addressing_style": "path"},  # http://host:port/bucket/key: self-hosted stores have no bucket DNS
        connect_timeout=5, read_timeout=60,
        retries={"max_attempts": 3, "mode": "standard"},
    )
    # A fresh Session: boto3's default one is shared module state, and we pass the keys explicitly.
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        region_name=os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION, config=config)


def client_url(client) -> str:
    return client.meta.endpoint_url


@contextlib.contextmanager
def s3_errors(client, what: str) -> Iterator[None]:
    """Turn botocore's exceptions into one-line S3Errors that say what was attempted and where."""
    url = client_url(client)
    try:
        yield
    except botocore.exceptions.EndpointConnectionError as exc:
        raise S3Error(f"S3 endpoint {url} is unreachable ({what}): is the server running and "
                      f"ROUTEROPS_S3_ENDPOINT_URL right?") from exc
    except botocore.exceptions.ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", "?"))
        if code in AUTH_ERRORS:
            raise S3Error(f"S3 at {url} refused the key pair in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
                          f"({code}) while trying to {what}") from exc
        raise S3Error(f"S3 at {url}: could not {what}: {code}") from exc
    except botocore.exceptions.BotoCoreError as exc:
        raise S3Error(f"S3 at {url}: could not {what}: {exc}") from exc


def ensure_bucket(bucket: str, client=None) -> None:
    """Create `bucket` unless it exists (and is ours)."""
    client = client or s3_client()
    with s3_errors(client, f"check bucket {bucket}"):
        try:
            client.head_bucket(Bucket=bucket)
            return
        except botocore.exceptions.ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) not in {"404", "NoSuchBucket", "NotFound"}:
                raise
    with s3_errors(client, f"create bucket {bucket}"):
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass  # created between our check and now


def upload_file(path: str | Path, bucket: str, key: str, client=None,
                metadata: Mapping[str, str] | None = None) -> None:
    """Upload one file to s3://bucket/key. S3 makes the object visible only once it is complete."""
    path = Path(path)
    if not path.is_file():
        raise S3Error(f"{path}: no such file to upload to s3://{bucket}/{key}")
    client = client or s3_client()
    extra: dict[str, Any] = {"Metadata": dict(metadata)} if metadata else {}
    with s3_errors(client, f"upload {path} to s3://{bucket}/{key}"):
        client.upload_file(str(path), bucket, key, ExtraArgs=extra or None)


def download_file(bucket: str, key: str, dest: str | Path, client=None) -> Path:
    """Download s3://bucket/key to `dest` atomically (temporary file beside it, then rename)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    client = client or s3_client()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with s3_errors(client, f"download s3://{bucket}/{key}"):
            client.download_file(bucket, key, str(tmp))
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def publish_file(bucket: str, key: str, path: str | Path, client=None) -> str:
    """Publish `path` as s3://bucket/key and return its version: the content's sha256 (hex).

    The version is a property of the bytes, not of the store, so readers can check what they fetched
    (`object_version`) and the same file published twice has the same version. It travels in the
    object's metadata (`x-amz-meta-sha256`); the bucket is created if needed.
    """
    client = client or s3_client()
    version = file_sha256(path)
    ensure_bucket(bucket, client=client)
    upload_file(path, bucket, key, client=client, metadata={"sha256": version})
    return version


def object_version(bucket: str, key: str, client=None) -> str:
    """The sha256 a published object carries (publish_file), or S3Error when it carries none."""
    client = client or s3_client()
    with s3_errors(client, f"read s3://{bucket}/{key}"):
        head = client.head_object(Bucket=bucket, Key=key)
    version = head.get("Metadata", {}).get("sha256")
    if not version:
        raise S3Error(f"s3://{bucket}/{key}: field 'sha256' missing from the object's metadata "
                      f"(not written by publish_file)")
    return version


def list_keys(bucket: str, prefix: str, client=None) -> list[str]:
    client = client or s3_client()
    keys: list[str] = []
    with s3_errors(client, f"list s3://{bucket}/{prefix}"):
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
    return keys


def reports_prefix(run_id: str) -> str:
    """Where a run's reports live in the bucket: one folder per run."""
    return f"runs/{run_id}/reports/"


def push_reports(bucket: str, run_id: str, reports_dir: str | Path, client=None) -> list[str]:
    """Upload every file under `reports_dir` to s3://bucket/runs/<run_id>/reports/; returns the keys."""
    reports_dir = Path(reports_dir)
    client = client or s3_client()
    ensure_bucket(bucket, client=client)
    keys = []
    for path in sorted(p for p in reports_dir.rglob("*") if p.is_file()):
        key = reports_prefix(run_id) + path.relative_to(reports_dir).as_posix()
        upload_file(path, bucket, key, client=client)
        keys.append(key)
    return keys


def pull_reports(bucket: str, run_id: str, dest_dir: str | Path, client=None) -> list[Path]:
    """Fetch a run's reports (push_reports' layout) into `dest_dir`; returns the files written.
    Refuses a key that would land outside `dest_dir` (a `..` in an object name)."""
    dest_dir = Path(dest_dir).resolve()
    client = client or s3_client()
    prefix = reports_prefix(run_id)
    keys = list_keys(bucket, prefix, client=client)
    if not keys:
        raise S3Error(f"s3://{bucket}/{prefix}: no reports for run {run_id}")
    written = []
    for key in keys:
        relative = PurePosixPath(key.removeprefix(prefix))
        target = (dest_dir / relative).resolve()
        if ".." in relative.parts or not target.is_relative_to(dest_dir):
            raise S3Error(f"s3://{bucket}/{key}: object name leaves the destination {dest_dir}")
        written.append(download_file(bucket, key, target, client=client))
    return written


DVC_REMOTE = "team"  # .dvc/config's default remote


def configure_storage(repo: str | Path = ".", buckets: tuple[str, ...] = ()) -> str:
    """Point this checkout at the team's store: write the endpoint (from the environment) into the
    git-ignored .dvc/config.local for DVC's `team` remote, and create the DVC bucket, the MLflow
    artifact bucket (ROUTEROPS_ARTIFACT_ROOT, when s3://) and `buckets`. Returns the endpoint."""
    endpoint = endpoint_from_env()
    if not endpoint:
        raise S3Error(f"none of {', '.join(ENDPOINT_VARS)} is set: export the store's URL, "
                      f"e.g. ROUTEROPS_S3_ENDPOINT_URL=http://127.0.0.1:8333")
    client = s3_client()
    remote_url = subprocess.run([sys.executable, "-m", "dvc", "config", f"remote.{DVC_REMOTE}.url"],
                                cwd=repo, capture_output=True, text=True)
    wanted = set(buckets)
    for url in (remote_url.stdout.strip(), os.environ.get("ROUTEROPS_ARTIFACT_ROOT", "")):
        if url.startswith("s3://"):
            wanted.add(url.removeprefix("s3://").split("/", 1)[0])
    for bucket in sorted(wanted):
        ensure_bucket(bucket, client=client)
    done = subprocess.run([sys.executable, "-m", "dvc", "remote", "modify", "--local", DVC_REMOTE,
                           "endpointurl", endpoint], cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise S3Error(f"{Path(repo) / '.dvc/config.local'}: could not set remote '{DVC_REMOTE}' "
                      f"field 'endpointurl': {done.stderr.strip()}")
    return endpoint


if __name__ == "__main__":  # `python -m services.s3`: what `make storage` runs
    try:
        print(f"DVC remote '{DVC_REMOTE}' → {configure_storage()} (.dvc/config.local); buckets ready")
    except RouteropsError as exc:
        raise SystemExit(f"error: {exc}") from None
