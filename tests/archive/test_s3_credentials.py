"""Credentials as the AWS tools find them, and a clear error when none are found."""

from __future__ import annotations

import pytest

from tiered.errors import ConfigError, CredentialsMissingError, StorageError
from tiered.archive.s3probe import Capabilities, endpoint_name
from tiered.archive.storage import RetryPolicy, S3Options, S3Store, open_store

FAST = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.01)


@pytest.fixture
def no_aws_env(monkeypatch, tmp_path):  # noqa: ANN001, ANN201
    """Nothing in the chain: no env keys, no files, no instance metadata."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return tmp_path


def test_no_credentials_anywhere_names_what_is_missing(moto_endpoint, s3_bucket, no_aws_env):
    store = open_store(f"s3://{s3_bucket}/a", s3=S3Options(endpoint_url=moto_endpoint), retry=FAST)
    with pytest.raises(CredentialsMissingError) as err:
        store.head("x")
    msg = str(err.value)
    assert msg.startswith(f"head x: no S3 credentials found for {moto_endpoint}: set s3.access_key_id")
    for place in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "instance metadata"):
        assert place in msg
    assert not err.value.retriable


def test_half_a_key_pair_is_a_configuration_error():
    with pytest.raises(ConfigError) as err:
        open_store("s3://bucket/a", s3=S3Options(access_key_id="AKIAONLY"))
    assert str(err.value).startswith("s3.access_key_id and s3.secret_access_key: set both or neither")
    with pytest.raises(ConfigError):
        open_store("s3://bucket/a", s3=S3Options(secret_access_key="only-the-secret"))
    assert "only-the-secret" not in str(err.value)


def test_a_named_profile_from_the_shared_files(moto_endpoint, s3_bucket, no_aws_env):
    """The profile's keys are the server's (SeaweedFS checks the signature)."""
    import os

    creds = no_aws_env / "none-credentials"
    creds.write_text(f"[archive]\naws_access_key_id = {os.environ.get('TIERED_TEST_KEY', 'testing-key-id')}\n"
                     f"aws_secret_access_key = {os.environ.get('TIERED_TEST_SECRET', 'testing-secret-key')}\n")
    store = open_store(f"s3://{s3_bucket}/a", s3=S3Options(endpoint_url=moto_endpoint, profile="archive",
                                                            region="us-east-1"), retry=FAST)
    etag = store.put_if_absent("k", b"v")
    assert store.get_with_etag("k") == (b"v", etag) and store.get("k") == b"v"  # boto3 and s3fs alike

    missing = open_store(f"s3://{s3_bucket}/a", s3=S3Options(endpoint_url=moto_endpoint, profile="nope"), retry=FAST)
    with pytest.raises(StorageError) as err:
        missing.head("k")
    assert str(err.value) == "head k: AWS profile 'nope' is in neither ~/.aws/config nor ~/.aws/credentials"


def test_endpoint_named_without_credentials(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    store = S3Store("bucket/p", S3Options(endpoint_url="https://user:pa55@minio.example:9000/"))
    assert endpoint_name(store) == "https://minio.example:9000/"
    assert "pa55" not in endpoint_name(store)
    assert endpoint_name(S3Store("bucket/p", S3Options(region="eu-west-1"))) == "AWS S3 (eu-west-1)"


def test_if_match_forms():
    assert Capabilities(if_match_form="quoted", upload_checksum="crc32").if_match('"abc"') == '"abc"'
    assert Capabilities(if_match_form="quoted", upload_checksum="crc32").if_match("abc") == '"abc"'
    assert Capabilities(if_match_form="bare", upload_checksum="md5").if_match('"abc"') == "abc"
