"""`routerops prices publish` with a team's S3 store configured: the published book also lands in
the bucket (boto3), with its content hash, and the keys appear in nothing the command prints."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_published_price_book_is_uploaded_to_the_team_bucket(s3_env, tmp_path, monkeypatch, capsys):
    from routerops.schema import file_sha256
    from services.s3 import download_file, object_version
    from cli.main import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "pool": {"file": str(REPO / "configs/pools/embedded-smollm2.yaml")},
        "prices": {"evaluation": str(REPO / "configs/prices/current.yaml")},
        "ops": {"s3_bucket": "team-published"}}))
    book = yaml.safe_load((REPO / "configs/prices/current.yaml").read_text())
    book["version"] = "2027-03-01"
    path = tmp_path / "book.yaml"
    path.write_text(yaml.safe_dump(book))

    assert main(["prices", "publish", str(path), "--root", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "uploaded to s3://team-published/published/prices/2027-03-01.yaml" in out.out
    key = "published/prices/2027-03-01.yaml"
    assert object_version("team-published", key) == file_sha256(path)
    fetched = download_file("team-published", key, tmp_path / "fetched.yaml")
    assert fetched.read_bytes() == path.read_bytes()
    secret = s3_env.env()["AWS_SECRET_ACCESS_KEY"]
    assert secret not in out.out + out.err
