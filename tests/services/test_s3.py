"""services/seaweedfs.py and services/s3.py against a real SeaweedFS (no mock of S3 anywhere)."""

from __future__ import annotations

import hashlib
import json
import stat

import pytest

from services.s3 import (S3Error, download_file, ensure_bucket, object_version, publish_file, pull_reports,
                         push_reports, s3_client, upload_file)
from services.seaweedfs import S3Credentials, seaweedfs_server, write_identities


def test_identities_file_is_private_and_holds_the_key_pair(tmp_path):
    creds = S3Credentials.generate()
    path = write_identities(tmp_path / "ids.json", creds)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    identity = json.loads(path.read_text())["identities"][0]
    assert identity["credentials"] == [{"accessKey": creds.access_key, "secretKey": creds.secret_key}]
    assert creds.secret_key not in repr(creds)


def test_missing_credentials_name_the_variable(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    with pytest.raises(S3Error, match=r"^AWS_SECRET_ACCESS_KEY not set"):
        s3_client()


@pytest.mark.slow
def test_unreachable_endpoint_names_the_url(monkeypatch):
    from routerops.workers.server import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("ROUTEROPS_S3_ENDPOINT_URL", url)
    with pytest.raises(S3Error, match=f"S3 endpoint {url} is unreachable"):
        ensure_bucket("routerops-test")


@pytest.mark.slow
def test_round_trip_and_wrong_secret_is_refused(s3_env, tmp_path):
    source = tmp_path / "book.yaml"
    source.write_bytes(b"version: 2026-12-01\n" * 100)
    ensure_bucket("routerops-rt")
    ensure_bucket("routerops-rt")  # idempotent
    upload_file(source, "routerops-rt", "books/book.yaml")
    back = download_file("routerops-rt", "books/book.yaml", tmp_path / "out" / "book.yaml")
    assert back.read_bytes() == source.read_bytes()

    # The server checks the signature: the right key id with a wrong secret is refused ...
    wrong = s3_client(access_key=s3_env.credentials.access_key, secret_key="not-the-secret")
    with pytest.raises(S3Error, match="refused the key pair in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"):
        download_file("routerops-rt", "books/book.yaml", tmp_path / "stolen.yaml", client=wrong)
    assert not (tmp_path / "stolen.yaml").exists()
    import boto3
    import botocore
    from botocore.config import Config

    with pytest.raises(botocore.exceptions.ClientError, match="SignatureDoesNotMatch"):
        wrong.get_object(Bucket="routerops-rt", Key="books/book.yaml")
    # ... and so is an unsigned request.

    anonymous = boto3.client("s3", endpoint_url=s3_env.endpoint_url, region_name="us-east-1",
                             config=Config(signature_version=botocore.UNSIGNED))
    with pytest.raises(botocore.exceptions.ClientError, match="AccessDenied"):
        anonymous.get_object(Bucket="routerops-rt", Key="books/book.yaml")


@pytest.mark.slow
def test_failed_download_leaves_the_old_file(s3_env, tmp_path):
    ensure_bucket("routerops-rt")
    dest = tmp_path / "report.json"
    dest.write_text("old")
    with pytest.raises(S3Error, match=r"s3://routerops-rt/no/such/key"):
        download_file("routerops-rt", "no/such/key", dest)
    assert dest.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no .part left behind


@pytest.mark.slow
def test_publish_file_versions_by_content(s3_env, tmp_path):
    book = tmp_path / "current.yaml"
    book.write_text("version: a\n")
    version = publish_file("routerops-books", "prices/current.yaml", book)
    assert version == hashlib.sha256(b"version: a\n").hexdigest()
    assert object_version("routerops-books", "prices/current.yaml") == version
    assert publish_file("routerops-books", "prices/current.yaml", book) == version  # same bytes, same version
    book.write_text("version: b\n")
    new_version = publish_file("routerops-books", "prices/current.yaml", book)
    assert new_version != version and object_version("routerops-books", "prices/current.yaml") == new_version


@pytest.mark.slow
def test_pull_reports_fetches_one_runs_reports(s3_env, tmp_path):
    reports = tmp_path / "reports"
    (reports / "eval").mkdir(parents=True)
    (reports / "eval" / "metrics.json").write_text('{"accuracy": 0.5}')
    (reports / "validation.json").write_text('{"passed": true}')
    keys = push_reports("routerops-reports", "run-1", reports)
    assert keys == ["runs/run-1/reports/eval/metrics.json", "runs/run-1/reports/validation.json"]
    push_reports("routerops-reports", "run-2", reports / "eval")  # another run: not pulled below

    pulled = pull_reports("routerops-reports", "run-1", tmp_path / "pulled")
    assert sorted(p.relative_to(tmp_path / "pulled").as_posix() for p in pulled) == [
        "eval/metrics.json", "validation.json"]
    assert (tmp_path / "pulled/eval/metrics.json").read_text() == '{"accuracy": 0.5}'
    with pytest.raises(S3Error, match="no reports for run run-3"):
        pull_reports("routerops-reports", "run-3", tmp_path / "none")


@pytest.mark.slow
def test_data_dir_survives_a_restart(weed, tmp_path):
    creds = S3Credentials.generate()
    data = tmp_path / "data"
    source = tmp_path / "kept.txt"
    source.write_text("kept across restarts")
    with seaweedfs_server(data_dir=data, credentials=creds) as first:
        client = s3_client(first.endpoint_url, creds.access_key, creds.secret_key)
        ensure_bucket("routerops-kept", client=client)
        upload_file(source, "routerops-kept", "kept.txt", client=client)
    with seaweedfs_server(data_dir=data, credentials=creds) as second:
        client = s3_client(second.endpoint_url, creds.access_key, creds.secret_key)
        back = download_file("routerops-kept", "kept.txt", tmp_path / "back.txt", client=client)
    assert back.read_text() == "kept across restarts"
