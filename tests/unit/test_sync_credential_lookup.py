"""Where the sync clients find credentials and proxies: Triton's credential file, systemd's credentials, AWS
profiles and the proxy variables, read from files a test writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import pytest

from edged.sync import SourceProblem, SyncError, open_repository
from edged.sync.credentials import (
    GCSCredentials,
    S3Credentials,
    gcs_credentials,
    s3_credentials,
    with_systemd_credentials,
)
from edged.sync.proxies import proxy_for

SECRET: Final = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
TRITON_EXAMPLE: Final = {
    "gs": {"": "/etc/edged/gcs-default.json", "gs://gcs-bucket-002": "/etc/edged/gcs-002.json"},
    "s3": {
        "": {"secret_key": "default-secret", "key_id": "AKIADEFAULT", "region": "us-west-2", "session_token": ""},
        "s3://s3-bucket-002": {
            "secret_key": SECRET,
            "key_id": "AKIA002",
            "region": "eu-west-3",
            "session_token": "token-002",
            "profile": "",
        },
        "s3://10.0.0.5:9000/models": {"secret_key": "minio-secret", "key_id": "minio"},
    },
    "as": {"": {"account_str": "account", "account_key": "key"}},
}


def credential_file(tmp_path: Path, content: Any) -> dict[str, str]:
    path = tmp_path / "cloud_credential.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return {"TRITON_CLOUD_CREDENTIAL_PATH": str(path)}


def problem(call: Any) -> SyncError:
    with pytest.raises(SyncError) as failure:
        call()
    return failure.value


# --- TRITON_CLOUD_CREDENTIAL_PATH -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "key_id", "region"),
    [
        ("s3://s3-bucket-002/models", "AKIA002", "eu-west-3"),
        ("s3://s3-bucket-002", "AKIA002", "eu-west-3"),
        ("s3://any-other-bucket/models", "AKIADEFAULT", "us-west-2"),
        ("s3://10.0.0.5:9000/models/repository", "minio", "us-east-2"),
        ("s3://10.0.0.5:9000/other", "AKIADEFAULT", "us-west-2"),
    ],
)
def test_longest_matching_prefix_wins(tmp_path: Path, url: str, key_id: str, region: str) -> None:
    # An entry without a region takes the environment's.
    env = credential_file(tmp_path, TRITON_EXAMPLE) | {"AWS_DEFAULT_REGION": "us-east-2"}
    found = s3_credentials(url, env)
    assert (found.key_id, found.region) == (key_id, region)


def test_the_file_replaces_the_variables(tmp_path: Path) -> None:
    env = credential_file(tmp_path, TRITON_EXAMPLE) | {
        "AWS_ACCESS_KEY_ID": "AKIAENV",
        "AWS_SECRET_ACCESS_KEY": "env-secret",
        "AWS_SESSION_TOKEN": "env-token",
        "GOOGLE_APPLICATION_CREDENTIALS": "/env.json",
    }
    found = s3_credentials("s3://s3-bucket-002/x", env)
    assert found == S3Credentials("AKIA002", SECRET, "token-002", "eu-west-3")
    # An empty session token in the file is no token, not the environment's.
    assert s3_credentials("s3://elsewhere/x", env).session_token is None


def test_an_entry_without_keys_leaves_the_client_its_own_chain(tmp_path: Path) -> None:
    env = credential_file(tmp_path, {"s3": {"": {"region": "ap-south-1"}}})
    assert s3_credentials("s3://bucket/x", env) == S3Credentials(region="ap-south-1")


def test_no_matching_entry_is_refused(tmp_path: Path) -> None:
    env = credential_file(tmp_path, {"s3": {"s3://one": {"key_id": "a", "secret_key": SECRET}}})
    failure = problem(lambda: s3_credentials("s3://two/x", env))
    assert failure.problem is SourceProblem.CREDENTIALS and "s3://two/x" in str(failure)
    # Nor does a kind the file leaves out fall back to the variables: the file alone decides, as in Triton.
    env["GOOGLE_APPLICATION_CREDENTIALS"] = "/env.json"
    assert problem(lambda: gcs_credentials("gs://b/x", env)).problem is SourceProblem.CREDENTIALS


@pytest.mark.parametrize(
    "content",
    [
        '{"s3": {"": {"key_id": "AKIA", "secret_key": "' + SECRET + '"',
        "[1, 2]",
        '{"s3": ["' + SECRET + '"]}',
        '{"s3": {"": "' + SECRET + '"}}',
        '{"s3": {"": {"key_id": "AKIA", "secret_key": ["' + SECRET + '"]}}}',
        '{"s3": {"": {"key_id": "AKIA"}}}',
        b"\xff\xfe".decode("latin-1"),
    ],
    ids=["truncated", "array", "kind-not-object", "entry-not-object", "field-not-string", "half-a-key", "not-utf8"],
)
def test_a_malformed_file_is_told_without_its_secrets(tmp_path: Path, content: str) -> None:
    path = tmp_path / "cloud_credential.json"
    path.write_bytes(content.encode("latin-1"))
    failure = problem(lambda: open_repository("s3://bucket/x", {"TRITON_CLOUD_CREDENTIAL_PATH": str(path)}))
    assert failure.problem is SourceProblem.CREDENTIALS, failure
    assert str(path) in str(failure) and SECRET not in str(failure)


def test_a_missing_file_is_told(tmp_path: Path) -> None:
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(tmp_path / "absent.json")}
    failure = problem(lambda: open_repository("gs://bucket/x", env))
    assert failure.problem is SourceProblem.CREDENTIALS and "absent.json" in str(failure)


def test_gcs_entries_are_paths_or_the_service_account_itself(tmp_path: Path) -> None:
    account = {"type": "service_account", "client_email": "a@b", "private_key": SECRET}
    path = tmp_path / "account.json"
    path.write_text(json.dumps(account))
    env = credential_file(tmp_path, {"gs": {"": str(path), "gs://inline": account, "gs://anonymous": ""}})
    assert gcs_credentials("gs://bucket/x", env) == GCSCredentials(service_file=str(path))
    assert gcs_credentials("gs://inline/x", env) == GCSCredentials(service_info=account)
    assert gcs_credentials("gs://anonymous/x", env) == GCSCredentials()
    assert SECRET not in repr(gcs_credentials("gs://inline/x", env))


@pytest.mark.parametrize(
    "value",
    ["{not json", '{"client_email": "a@b"}', "/nowhere/account.json", "not-a-json-file"],
    ids=["bad-json", "no-type", "missing-file", "file-not-json"],
)
def test_unusable_google_credentials_are_refused(tmp_path: Path, value: str) -> None:
    (tmp_path / "not-a-json-file").write_text(SECRET)
    if value == "not-a-json-file":
        value = str(tmp_path / value)
    failure = problem(lambda: gcs_credentials("gs://b/x", {"GOOGLE_APPLICATION_CREDENTIALS": value}))
    assert failure.problem is SourceProblem.CREDENTIALS and SECRET not in str(failure)


def test_google_credentials_by_path_or_content(tmp_path: Path) -> None:
    account = {"type": "service_account", "client_email": "a@b"}
    path = tmp_path / "account.json"
    path.write_text(json.dumps(account))
    assert gcs_credentials("gs://b", {"GOOGLE_APPLICATION_CREDENTIALS": str(path)}).service_file == str(path)
    by_content = gcs_credentials("gs://b", {"GOOGLE_APPLICATION_CREDENTIALS": json.dumps(account)})
    assert by_content.service_info == account


# --- systemd credentials ---------------------------------------------------------------------------------------


def test_systemd_credentials_stand_for_the_variables(tmp_path: Path) -> None:
    (tmp_path / "aws-access-key-id").write_text("AKIASYSTEMD\n")
    (tmp_path / "aws-secret-access-key").write_text(SECRET + "\n")
    (tmp_path / "gcs-service-account.json").write_text("{}")
    (tmp_path / "triton-cloud-credentials.json").write_text("{}")
    (tmp_path / "unrelated").write_text("x")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "AWS_ACCESS_KEY_ID": "AKIAENV", "AWS_SESSION_TOKEN": "env"}
    merged = with_systemd_credentials(env)
    assert merged["AWS_ACCESS_KEY_ID"] == "AKIASYSTEMD" and merged["AWS_SECRET_ACCESS_KEY"] == SECRET
    # The environment's session token belonged to another key.
    assert "AWS_SESSION_TOKEN" not in merged
    assert merged["GOOGLE_APPLICATION_CREDENTIALS"] == str(tmp_path / "gcs-service-account.json")
    assert merged["TRITON_CLOUD_CREDENTIAL_PATH"] == str(tmp_path / "triton-cloud-credentials.json")
    assert "unrelated" not in json.dumps(merged)


def test_systemd_session_token_goes_with_its_key(tmp_path: Path) -> None:
    for name, value in (("aws-access-key-id", "ASIA1"), ("aws-secret-access-key", "s"), ("aws-session-token", "t")):
        (tmp_path / name).write_text(value)
    merged = with_systemd_credentials({"CREDENTIALS_DIRECTORY": str(tmp_path), "AWS_SESSION_TOKEN": "other"})
    assert s3_credentials("s3://b", merged) == S3Credentials("ASIA1", "s", "t", None)


def test_without_a_credentials_directory_nothing_changes() -> None:
    env = {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SESSION_TOKEN": "t"}
    assert with_systemd_credentials(env) == env
    assert with_systemd_credentials(env | {"CREDENTIALS_DIRECTORY": "/nonexistent"})["AWS_SESSION_TOKEN"] == "t"


# --- AWS profiles ----------------------------------------------------------------------------------------------


def test_a_profile_is_read_from_the_shared_files(tmp_path: Path) -> None:
    (tmp_path / "credentials").write_text(
        f"[default]\naws_access_key_id = AKIADEF\naws_secret_access_key = x\n\n"
        f"[edge]\naws_access_key_id = AKIAEDGE\naws_secret_access_key = {SECRET}\naws_session_token = tok\n"
    )
    (tmp_path / "config").write_text("[profile edge]\nregion = eu-north-1\n")
    files = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"), "AWS_CONFIG_FILE": str(tmp_path / "config")}
    assert s3_credentials("s3://b", files | {"AWS_PROFILE": "edge"}) == S3Credentials(
        "AKIAEDGE", SECRET, "tok", "eu-north-1"
    )
    env = files | credential_file(tmp_path, {"s3": {"": {"profile": "edge", "region": "sa-east-1"}}})
    assert s3_credentials("s3://b", env).region == "sa-east-1"
    missing = problem(lambda: s3_credentials("s3://b", files | {"AWS_PROFILE": "absent"}))
    assert missing.problem is SourceProblem.CREDENTIALS and '"absent"' in str(missing)


# --- proxies ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "env", "expected"),
    [
        ("https://s3.eu-west-3.amazonaws.com", {"HTTPS_PROXY": "http://proxy:3128"}, "http://proxy:3128"),
        ("https://s3.eu-west-3.amazonaws.com", {"https_proxy": "proxy:3128"}, "http://proxy:3128"),
        ("https://s3.eu-west-3.amazonaws.com", {"HTTP_PROXY": "http://proxy:3128"}, None),
        ("http://10.0.0.5:9000", {"HTTP_PROXY": "http://proxy:3128"}, "http://proxy:3128"),
        ("http://10.0.0.5:9000", {"HTTPS_PROXY": "http://proxy:3128"}, None),
        ("http://10.0.0.5:9000", {"ALL_PROXY": "http://proxy:3128"}, "http://proxy:3128"),
        ("https://storage.googleapis.com", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": ".googleapis.com"}, None),
        ("https://storage.googleapis.com", {"HTTPS_PROXY": "http://p:1", "no_proxy": "googleapis.com"}, None),
        ("https://storage.googleapis.com", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "apis.com"}, "http://p:1"),
        ("http://10.0.0.5:9000", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "localhost, 10.0.0.0/8"}, None),
        ("http://10.0.0.5:9000", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "*"}, None),
        ("http://[::1]:9000", {"HTTP_PROXY": "http://p:1", "NO_PROXY": "::1"}, None),
    ],
)
def test_proxy_is_chosen_as_curl_chooses(endpoint: str, env: dict[str, str], expected: str | None) -> None:
    assert proxy_for(endpoint, env) == expected


# --- URLs obstore would not survive ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {"AWS_ENDPOINT_URL_STS": "127.0.0.1:9000", "AWS_ROLE_ARN": "arn", "AWS_WEB_IDENTITY_TOKEN_FILE": "/t"},
        {"AWS_ENDPOINT_URL": "minio:9000"},
        {"AWS_CONTAINER_CREDENTIALS_FULL_URI": "169.254.170.23/v1/credentials"},
    ],
    ids=["sts", "s3", "container"],
)
def test_an_endpoint_without_a_scheme_is_refused(env: dict[str, str]) -> None:
    """obstore panics on some of these (a BaseException, out of reach of `except Exception`)."""
    failure = problem(lambda: open_repository("s3://bucket/x", env))
    assert failure.problem is SourceProblem.BAD_URL and next(iter(env.values())) in str(failure)


@pytest.mark.parametrize(
    "env",
    [{"AWS_CA_BUNDLE": "ca.pem"}, {"AWS_CA_BUNDLE": "missing.pem"}, {"HTTPS_PROXY": "http://"}],
    ids=["not-pem-certificate", "missing-bundle", "proxy-without-host"],
)
def test_client_settings_it_cannot_use_are_refused(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n")
    env = {key: str(tmp_path / value) if key == "AWS_CA_BUNDLE" else value for key, value in env.items()}
    keys = {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": SECRET}
    failure = problem(lambda: open_repository("s3://https://minio.example:9000/bucket/x", env | keys))
    assert failure.problem is SourceProblem.BAD_URL and SECRET not in str(failure), failure
