"""S3 and S3-compatible repositories through obstore (async, Rust): the store's settings and S3's errors told
apart; listing, reads, writes and deletes are edged.sync.obstores'."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from edged.sync.errors import SourceProblem, SyncError
from edged.sync.obstores import (
    TRANSPORT_SIGNS,
    ObstoreRepository,
    checked_url,
    client_options,
    refused_settings,
    retry_options,
)
from edged.sync.plan import RemoteEntry
from edged.sync.sources import BODY_REQUEST_S, DEFAULT_REGION, ClientOptions, SourceURL

if TYPE_CHECKING:
    from obstore.store import S3Store

    from edged.sync.credentials import S3Credentials


# An ETag that is the content's MD5 (a single-part upload); a multipart one is not, and proves nothing of the bytes.
_MD5_HEX: Final = re.compile(r"[0-9a-f]{32}")


class S3Repository(ObstoreRepository):
    """An S3 or S3-compatible repository, through obstore."""

    def __init__(
        self, source: SourceURL, env: Mapping[str, str], options: ClientOptions, credentials: S3Credentials
    ) -> None:
        self._region = credentials.region or DEFAULT_REGION
        super().__init__(source, self._make_store(source, env, options, credentials, BODY_REQUEST_S), options)

    def _entry(self, meta: Mapping[str, Any]) -> RemoteEntry:
        etag = (meta["e_tag"] or "").strip('"')
        digest = f"md5:{etag}" if _MD5_HEX.fullmatch(etag) else f"etag:{etag}"
        return RemoteEntry(meta["path"], meta["size"], digest, meta["e_tag"])

    def _error(self, exc: Exception, where: str) -> SyncError:
        return _s3_error(exc, where, self._region)

    @staticmethod
    def _make_store(
        source: SourceURL, env: Mapping[str, str], options: ClientOptions, credentials: S3Credentials, request_s: float
    ) -> S3Store:
        from obstore.store import S3Store

        region = credentials.region or DEFAULT_REGION
        config: dict[str, Any] = {"region": region, "default_region": region}
        provider = None
        if credentials.key_id:
            static = {
                "access_key_id": credentials.key_id,
                "secret_access_key": credentials.secret_key,
                "token": credentials.session_token,
                "expires_at": None,
            }

            def provider() -> dict[str, Any]:
                return static

        else:
            # Temporary credentials: obstore fetches them and refreshes them before they expire.
            for key, variables in _S3_CHAIN.items():
                found = next((name for name in variables if env.get(name)), None)
                if found:
                    config[key] = checked_url(env[found], found) if key in _S3_URLS else env[found]
        endpoint = source.endpoint
        for variable in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if not endpoint and env.get(variable):
                endpoint = checked_url(env[variable], variable)
        if endpoint:
            # Both keys: obstore prefers aws_endpoint_url_s3, which the process environment may set otherwise.
            config["endpoint"] = config["aws_endpoint_url_s3"] = endpoint
            # S3-compatible servers (MinIO, Ceph, ...) are addressed by path; few serve virtual-hosted buckets.
            config["virtual_hosted_style_request"] = (
                source.endpoint is None and env.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "").lower() == "true"
            )
        client = client_options(
            options, endpoint or f"https://s3.{region}.amazonaws.com", env, "AWS_CA_BUNDLE", request_s
        )
        retry = retry_options(options)
        try:
            return S3Store(
                source.bucket,
                prefix=source.prefix or None,
                config=config,  # type: ignore[arg-type]
                client_options=client,  # type: ignore[arg-type]
                retry_config=retry,  # type: ignore[arg-type]
                credential_provider=provider,  # type: ignore[arg-type]
            )
        except Exception as exc:
            raise refused_settings(exc, source, "S3", "AWS_CA_BUNDLE") from None


# What obstore uses when no static key is given, by its config key: temporary credentials from web identity (EKS,
# GitHub OIDC, ...), from ECS and EKS container endpoints or from EC2 instance metadata, tried in this order, or
# unsigned requests to a public bucket (AWS_SKIP_SIGNATURE).
# The AWS SDKs' names come first where obstore reads another one.
_S3_CHAIN: Final = {
    "web_identity_token_file": ("AWS_WEB_IDENTITY_TOKEN_FILE",),
    "role_arn": ("AWS_ROLE_ARN",),
    "role_session_name": ("AWS_ROLE_SESSION_NAME",),
    "aws_endpoint_url_sts": ("AWS_ENDPOINT_URL_STS", "AWS_STS_ENDPOINT"),
    "container_credentials_relative_uri": ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",),
    "container_credentials_full_uri": ("AWS_CONTAINER_CREDENTIALS_FULL_URI",),
    "container_authorization_token_file": ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",),
    "metadata_endpoint": ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_METADATA_ENDPOINT"),
    "imdsv1_fallback": ("AWS_IMDSV1_FALLBACK",),
    "skip_signature": ("AWS_SKIP_SIGNATURE",),
}


# These are URLs: obstore panics on some malformed ones rather than failing, so they are checked first.
_S3_URLS: Final = frozenset({"aws_endpoint_url_sts", "container_credentials_full_uri", "metadata_endpoint"})


# S3's error codes (the <Code> of its XML error body) by what an operator has to fix.
_S3_CODES: Final = {
    "NoSuchBucket": SourceProblem.NOT_FOUND,
    "NoSuchKey": SourceProblem.NOT_FOUND,
    "AccessDenied": SourceProblem.DENIED,
    "InvalidAccessKeyId": SourceProblem.DENIED,
    "SignatureDoesNotMatch": SourceProblem.DENIED,
    "ExpiredToken": SourceProblem.DENIED,
    "InvalidToken": SourceProblem.DENIED,
    "PermanentRedirect": SourceProblem.WRONG_REGION,
    "AuthorizationHeaderMalformed": SourceProblem.WRONG_REGION,
    "IllegalLocationConstraintException": SourceProblem.WRONG_REGION,
    "PreconditionFailed": SourceProblem.CHANGED,
}
_S3_STATUS: Final = {
    401: SourceProblem.DENIED,
    403: SourceProblem.DENIED,
    404: SourceProblem.NOT_FOUND,
    301: SourceProblem.WRONG_REGION,
    412: SourceProblem.CHANGED,
}


def _s3_error(exc: Exception, where: str, region: str = DEFAULT_REGION) -> SyncError:
    from obstore import exceptions

    full = str(exc)
    # obstore's first line, without the XML body it appends (read apart below) and without its "Generic S3 error".
    text = full.split("\n", 1)[0].split(": <?xml", 1)[0].removeprefix("Generic S3 error: ")
    code = re.search(r"<Code>(\w+)</Code>", full)
    said = re.search(r"<Message>([^<]*)</Message>", full)
    status = re.search(r"status code: (\d{3})", full)
    if isinstance(exc, exceptions.InvalidPathError):
        problem = SourceProblem.REFUSED
    elif code and code[1] in _S3_CODES:
        problem = _S3_CODES[code[1]]
        text = f"{code[1]}: {said[1] if said else text}"
    elif isinstance(exc, (exceptions.NotFoundError, FileNotFoundError)):
        problem = SourceProblem.NOT_FOUND
    elif isinstance(exc, (exceptions.PermissionDeniedError, exceptions.UnauthenticatedError, PermissionError)):
        problem = SourceProblem.DENIED
    elif isinstance(exc, exceptions.PreconditionError):
        problem = SourceProblem.CHANGED
    elif any(sign in full for sign in ("/latest/api/token", "/latest/meta-data/")):
        # No key was configured, so the client asked the EC2 instance metadata service, which is not there.
        problem = SourceProblem.CREDENTIALS
        text = (
            "no credentials: none configured (AWS_ACCESS_KEY_ID, TRITON_CLOUD_CREDENTIAL_PATH, systemd credentials,"
            f" web identity, container) and the instance metadata service failed: {text}"
        )
    elif "incorrectly configured region" in full:
        # S3's answer to a request sent to another region than the bucket's: a 301 without a Location.
        problem = SourceProblem.WRONG_REGION
    elif status and int(status[1]) in _S3_STATUS:
        problem = _S3_STATUS[int(status[1])]
    elif isinstance(exc, (ConnectionError, TimeoutError)) or any(sign in full for sign in TRANSPORT_SIGNS):
        problem = SourceProblem.UNREACHABLE
    else:
        problem = SourceProblem.OTHER
    if problem is SourceProblem.WRONG_REGION:
        text += (
            f' (edged asked in region {region}: set AWS_DEFAULT_REGION, or the entry\'s "region" in'
            " TRITON_CLOUD_CREDENTIAL_PATH, to the bucket's)"
        )
    return SyncError(problem, f"{where}: {text}")
