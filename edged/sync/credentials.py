"""Credentials for remote repositories, found the way Triton finds them, plus systemd's credentials.

Where they come from, in this order:

``$CREDENTIALS_DIRECTORY`` (systemd ``LoadCredential=``, ``LoadCredentialEncrypted=``, ``SetCredential=``)
    A file of one of these names stands for the variable next to it, and replaces it when both are set:

    ========================================  =====================================================
    ``aws-access-key-id``                     ``AWS_ACCESS_KEY_ID``
    ``aws-secret-access-key``                 ``AWS_SECRET_ACCESS_KEY``
    ``aws-session-token``                     ``AWS_SESSION_TOKEN``
    ``gcs-service-account.json``              ``GOOGLE_APPLICATION_CREDENTIALS`` (the file's path)
    ``azure-storage-key``                     ``AZURE_STORAGE_KEY``
    ``triton-cloud-credentials.json``         ``TRITON_CLOUD_CREDENTIAL_PATH`` (the file's path)
    ========================================  =====================================================

    The three AWS files are one key: when the directory holds the key ID or the secret, a session token from
    the environment is dropped unless the directory holds one too, so that a key is never signed with
    another key's token. Surrounding whitespace (the newline ``echo`` leaves) is stripped.

``TRITON_CLOUD_CREDENTIAL_PATH``
    Triton's JSON file: ``{"s3": {PREFIX: {"key_id", "secret_key", "session_token", "region", "profile"}},
    "gs": {PREFIX: "service-account.json path"}, "as": {PREFIX: {"account_str", "account_key", "auth_type",
    "client_id"}}}``. The entry whose PREFIX is the longest one the
    repository URL starts with is used (a plain string prefix, as Triton matches it: ``""`` matches every URL).
    As in Triton, when the variable is set the file alone decides: a URL that no entry matches (one of a kind
    the file leaves out too) has no credentials and is refused. An S3 entry without ``key_id`` and
    ``secret_key`` uses its ``profile``, else the default chain below (environment, web identity, instance
    metadata); a ``gs`` entry ``""`` uses Google's default chain. edged also takes a ``gs`` entry that is the
    service-account JSON itself rather than its path. An ``as`` entry's ``account_str`` replaces the account the
    URL names; its ``auth_type`` is Triton's: ``key`` (the default: the ``account_key``, else anonymous),
    ``managed_identity`` (with ``client_id`` for a user-assigned identity) or ``default`` (Azure's chain:
    service principal or workload identity variables, then managed identity).

The environment
    ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION`` (or
    ``AWS_REGION``), ``AWS_PROFILE``; ``GOOGLE_APPLICATION_CREDENTIALS`` (a path, or the JSON itself);
    ``AZURE_STORAGE_ACCOUNT``, ``AZURE_STORAGE_KEY``, ``AZURE_STORAGE_AUTH_TYPE``, ``AZURE_STORAGE_CLIENT_ID`` (the
    ``as`` entry's fields, as Triton reads them). Without
    static keys, the S3 client finds temporary credentials itself and refreshes them before they expire:
    ``AWS_WEB_IDENTITY_TOKEN_FILE`` with ``AWS_ROLE_ARN``, ECS/EKS container credentials, EC2 instance metadata.

A credential problem is a ``SyncError(CREDENTIALS)`` that names the file and the entry, never a secret.
"""

from __future__ import annotations

import base64
import binascii
import configparser
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from edged.sync.errors import SourceProblem, SyncError

# systemd credential names, by the variable each one stands for.
SYSTEMD_CREDENTIALS: Final = {
    "aws-access-key-id": "AWS_ACCESS_KEY_ID",
    "aws-secret-access-key": "AWS_SECRET_ACCESS_KEY",
    "aws-session-token": "AWS_SESSION_TOKEN",
    "gcs-service-account.json": "GOOGLE_APPLICATION_CREDENTIALS",
    "azure-storage-key": "AZURE_STORAGE_KEY",
    "triton-cloud-credentials.json": "TRITON_CLOUD_CREDENTIAL_PATH",
}
# These hold a secret: the variable gets the file's content. The others get the file's path.
_BY_CONTENT: Final = frozenset({"aws-access-key-id", "aws-secret-access-key", "aws-session-token", "azure-storage-key"})
_S3_FIELDS: Final = ("key_id", "secret_key", "session_token", "region", "profile")
_AZURE_FIELDS: Final = {
    "account_str": "AZURE_STORAGE_ACCOUNT",
    "account_key": "AZURE_STORAGE_KEY",
    "auth_type": "AZURE_STORAGE_AUTH_TYPE",
    "client_id": "AZURE_STORAGE_CLIENT_ID",
}
AZURE_AUTH_TYPES: Final = ("key", "managed_identity", "default")


@dataclass(frozen=True)
class S3Credentials:
    """What an S3 client is given. No key: the client's own chain (web identity, container, instance metadata)."""

    key_id: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str | None = None


@dataclass(frozen=True)
class GCSCredentials:
    """A service-account (or authorized-user) file, or its content; neither: the client's default chain."""

    service_file: str | None = None
    service_info: Mapping[str, Any] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class AzureCredentials:
    """Triton's Azure credential: ``auth_type`` "key" (``account_key``, or anonymous without one),
    "managed_identity" (``client_id`` for a user-assigned one) or "default"; ``account`` replaces the URL's."""

    account: str | None = None
    auth_type: str = "key"
    account_key: str | None = field(default=None, repr=False)
    client_id: str | None = None


def with_systemd_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the variables that files in ``$CREDENTIALS_DIRECTORY`` stand for."""
    merged = dict(env)
    folder = env.get("CREDENTIALS_DIRECTORY")
    if not folder:
        return merged
    found: dict[str, str] = {}
    for name, variable in SYSTEMD_CREDENTIALS.items():
        path = Path(folder) / name
        if not path.is_file():
            continue
        if name in _BY_CONTENT:
            try:
                found[variable] = path.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise SyncError(
                    SourceProblem.CREDENTIALS, f"systemd credential {name} cannot be read: {type(exc).__name__}"
                ) from None
        else:
            found[variable] = str(path)
    if {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & found.keys():
        merged.pop("AWS_SESSION_TOKEN", None)
    merged.update(found)
    return merged


def _credential_file(env: Mapping[str, str]) -> tuple[str, dict[str, Any]] | None:
    """(path, content) of TRITON_CLOUD_CREDENTIAL_PATH, None when it is not set."""
    path = env.get("TRITON_CLOUD_CREDENTIAL_PATH")
    if not path:
        return None
    try:
        content = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SyncError(
            SourceProblem.CREDENTIALS, f"TRITON_CLOUD_CREDENTIAL_PATH {path} cannot be read: {exc.strerror}"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        # JSONDecodeError's message holds a position, never the document.
        where = f" (line {exc.lineno} column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise SyncError(
            SourceProblem.CREDENTIALS, f"TRITON_CLOUD_CREDENTIAL_PATH {path} is not a JSON document{where}"
        ) from None
    if not isinstance(content, dict):
        raise SyncError(SourceProblem.CREDENTIALS, f"TRITON_CLOUD_CREDENTIAL_PATH {path} is not a JSON object")
    for kind in ("s3", "gs", "as"):
        if kind in content and not isinstance(content[kind], dict):
            raise SyncError(
                SourceProblem.CREDENTIALS,
                f'TRITON_CLOUD_CREDENTIAL_PATH {path}: "{kind}" must map path prefixes to credentials',
            )
    return path, content


def _longest_match(entries: Mapping[str, Any], url: str) -> str | None:
    """Triton's rule: the longest entry name that ``url`` starts with."""
    matching = [name for name in entries if url.startswith(name)]
    return max(matching, key=len) if matching else None


def _entry_fields(found: tuple[str, str, Any], names: tuple[str, ...]) -> tuple[str, dict[str, str | None]]:
    """Where a credential-file entry came from (for messages), and its string fields ``names`` (None when absent
    or empty). Raises SyncError(CREDENTIALS) for an entry that is not an object or a field that is not a string."""
    path, prefix, entry = found
    origin = f'TRITON_CLOUD_CREDENTIAL_PATH {path} entry "{prefix}"'
    if not isinstance(entry, dict):
        raise SyncError(SourceProblem.CREDENTIALS, f"{origin} is not a JSON object")
    for name in names:
        if name in entry and not isinstance(entry[name], str):
            raise SyncError(SourceProblem.CREDENTIALS, f'{origin}: "{name}" is not a string')
    return origin, {name: entry.get(name) or None for name in names}


def _entry(env: Mapping[str, str], kind: str, url: str) -> tuple[str, str, Any] | None:
    """(file, prefix, entry) from the credential file for ``url``; None when the file is not in use."""
    loaded = _credential_file(env)
    if loaded is None:
        return None
    path, content = loaded
    entries: dict[str, Any] = content.get(kind, {})
    prefix = _longest_match(entries, url)
    if prefix is None:
        raise SyncError(
            SourceProblem.CREDENTIALS,
            f'TRITON_CLOUD_CREDENTIAL_PATH {path} has no "{kind}" entry matching {url} (an entry "" matches all)',
        )
    return path, prefix, entries[prefix]


def s3_credentials(url: str, env: Mapping[str, str]) -> S3Credentials:
    """The credentials for the S3 repository ``url``. Raises SyncError(CREDENTIALS)."""
    region = env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or None
    found = _entry(env, "s3", url)
    if found is None:
        fields = {
            "key_id": env.get("AWS_ACCESS_KEY_ID"),
            "secret_key": env.get("AWS_SECRET_ACCESS_KEY"),
            "session_token": env.get("AWS_SESSION_TOKEN"),
            "region": region,
            "profile": env.get("AWS_PROFILE"),
        }
        origin = "the environment"
    else:
        origin, fields = _entry_fields(found, _S3_FIELDS)
        fields["region"] = fields["region"] or region
    key_id, secret_key = fields["key_id"], fields["secret_key"]
    if bool(key_id) != bool(secret_key):
        missing = "secret key" if key_id else "key ID"
        raise SyncError(SourceProblem.CREDENTIALS, f"{origin} has an access key without its {missing}")
    if key_id:
        return S3Credentials(key_id, secret_key, fields["session_token"] or None, fields["region"])
    if fields["profile"]:
        return _profile(fields["profile"], fields["region"], env, origin)
    return S3Credentials(region=fields["region"])


def _profile(name: str, region: str | None, env: Mapping[str, str], origin: str) -> S3Credentials:
    """Static keys of profile ``name`` in the AWS shared files (what a profile holds most often on a device)."""
    home = Path(env.get("HOME") or Path.home())
    files = {
        "credentials": Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials"),
        "config": Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config"),
    }
    sections: dict[str, dict[str, str]] = {}
    for kind, path in files.items():
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError):
            raise SyncError(SourceProblem.CREDENTIALS, f"AWS {kind} file {path} cannot be parsed") from None
        section = name if kind == "credentials" or name == "default" else f"profile {name}"
        sections[kind] = dict(parser[section]) if parser.has_section(section) else {}
    keys = sections["credentials"] or sections["config"]
    key_id, secret_key = keys.get("aws_access_key_id"), keys.get("aws_secret_access_key")
    if not (key_id and secret_key):
        raise SyncError(
            SourceProblem.CREDENTIALS,
            f'{origin}: AWS profile "{name}" has no aws_access_key_id and aws_secret_access_key in '
            f"{files['credentials']} or {files['config']}",
        )
    return S3Credentials(
        key_id, secret_key, keys.get("aws_session_token") or None, region or sections["config"].get("region")
    )


def gcs_credentials(url: str, env: Mapping[str, str]) -> GCSCredentials:
    """The credentials for the GCS repository ``url``. Raises SyncError(CREDENTIALS)."""
    found = _entry(env, "gs", url)
    if found is None:
        value: Any = env.get("GOOGLE_APPLICATION_CREDENTIALS") or None
        origin = "GOOGLE_APPLICATION_CREDENTIALS"
    else:
        path, prefix, value = found
        origin = f'TRITON_CLOUD_CREDENTIAL_PATH {path} entry "{prefix}"'
    if value is None or value == "":
        return GCSCredentials()
    if isinstance(value, dict):
        return GCSCredentials(service_info=_service_info(value, origin))
    if not isinstance(value, str):
        raise SyncError(SourceProblem.CREDENTIALS, f"{origin} is neither a file path nor a service-account object")
    if value.lstrip().startswith("{"):
        # The JSON itself, as some deployments pass it in the variable.
        try:
            info = json.loads(value)
        except json.JSONDecodeError:
            raise SyncError(SourceProblem.CREDENTIALS, f"{origin} holds JSON that cannot be parsed") from None
        return GCSCredentials(service_info=_service_info(info, origin))
    try:
        info = json.loads(Path(value).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SyncError(SourceProblem.CREDENTIALS, f"{origin}: {value} cannot be read: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SyncError(SourceProblem.CREDENTIALS, f"{origin}: {value} is not a JSON document") from None
    _service_info(info, f"{origin}: {value}")
    return GCSCredentials(service_file=value)


def _service_info(info: Any, origin: str) -> Mapping[str, Any]:
    if not isinstance(info, dict) or not isinstance(info.get("type"), str):
        raise SyncError(SourceProblem.CREDENTIALS, f'{origin} is not a Google credential (no "type")')
    return info


def azure_credentials(url: str, env: Mapping[str, str]) -> AzureCredentials:
    """The credentials for the Azure repository ``url``. Raises SyncError(CREDENTIALS)."""
    found = _entry(env, "as", url)
    if found is None:
        fields = {name: env.get(variable) or None for name, variable in _AZURE_FIELDS.items()}
        origin = "the environment (AZURE_STORAGE_*)"
    else:
        origin, fields = _entry_fields(found, tuple(_AZURE_FIELDS))
    auth_type = fields["auth_type"] or "key"
    if auth_type not in AZURE_AUTH_TYPES:
        raise SyncError(
            SourceProblem.CREDENTIALS,
            f"{origin}: auth_type '{auth_type}' is none of {', '.join(AZURE_AUTH_TYPES)}",
        )
    key = fields["account_key"]
    if key:
        try:
            # A shared key is base64: one that is not would only fail later, as a refused signature.
            base64.b64decode(key, validate=True)
        except (binascii.Error, ValueError):
            raise SyncError(SourceProblem.CREDENTIALS, f"{origin}: the account key is not base64") from None
    return AzureCredentials(fields["account_str"], auth_type, key, fields["client_id"])
