"""S3 and S3-compatible repositories through obstore (async, Rust): listing, ranged reads bounded by the time
between two pieces of a body, writes and deletes, and S3's errors told apart."""

from __future__ import annotations

import asyncio
import datetime
import re
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from edged.sync.errors import SourceProblem, SyncError
from edged.sync.plan import RemoteEntry
from edged.sync.proxies import proxy_for
from edged.sync.sources import (
    BODY_REQUEST_S,
    CHUNK_BYTES,
    DEFAULT_REGION,
    IDLE_CONNECTION_S,
    ClientOptions,
    SourceURL,
)

if TYPE_CHECKING:
    from obstore.store import S3Store

    from edged.sync.credentials import S3Credentials


T = TypeVar("T")
CLOSE_GRACE_S: Final = 0.05
# An ETag that is the content's MD5 (a single-part upload); a multipart one is not, and proves nothing of the bytes.
_MD5_HEX: Final = re.compile(r"[0-9a-f]{32}")


class S3Repository:
    """An S3 or S3-compatible repository, through obstore."""

    def __init__(
        self, source: SourceURL, env: Mapping[str, str], options: ClientOptions, credentials: S3Credentials
    ) -> None:
        self._source = source
        self._region = credentials.region or DEFAULT_REGION
        self._idle_s = options.read_timeout_s
        # obstore's timeout bounds a whole request, body included: a slow download that keeps moving would be cut
        # at the read timeout and finish only over several runs. So the client's is long, and each request here
        # is bounded by the read timeout itself, a download's body by the time between two of its pieces.
        self._store = self._make_store(source, env, options, credentials, BODY_REQUEST_S)

    @property
    def url(self) -> str:
        return str(self._source)

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
                    config[key] = _checked_url(env[found], found) if key in _S3_URLS else env[found]
        endpoint = source.endpoint
        for variable in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if not endpoint and env.get(variable):
                endpoint = _checked_url(env[variable], variable)
        if endpoint:
            # Both keys: obstore prefers aws_endpoint_url_s3, which the process environment may set otherwise.
            config["endpoint"] = config["aws_endpoint_url_s3"] = endpoint
            # S3-compatible servers (MinIO, Ceph, ...) are addressed by path; few serve virtual-hosted buckets.
            config["virtual_hosted_style_request"] = (
                source.endpoint is None and env.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "").lower() == "true"
            )
        client: dict[str, Any] = {
            "allow_http": bool(endpoint and endpoint.startswith("http://")),
            "connect_timeout": datetime.timedelta(seconds=options.connect_timeout_s),
            "timeout": datetime.timedelta(seconds=request_s),
            # A connection idle longer is not reused: NATs and proxies drop idle ones silently, and a request
            # sent on such a connection waits for the read timeout (aiohttp's default for GCS is the same 15 s).
            "pool_idle_timeout": datetime.timedelta(seconds=IDLE_CONNECTION_S),
        }
        proxy = proxy_for(endpoint or f"https://s3.{region}.amazonaws.com", env)
        if proxy:
            client["proxy_url"] = proxy
        if env.get("AWS_CA_BUNDLE"):
            # A private CA (MinIO, Ceph, an STS endpoint inside the network): trusted on top of the system's.
            client["root_certificate"] = _read_bundle(env["AWS_CA_BUNDLE"])
        # obstore's own retries are kept short: the sync loop retries whole runs, and a run resumes its downloads.
        retry: dict[str, Any] = {"max_retries": 2, "retry_timeout": datetime.timedelta(seconds=options.read_timeout_s)}
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
            # obstore builds its HTTP client here: a certificate or proxy it cannot use fails now, and so does a
            # system without CA certificates (a minimal root without ca-certificates), even for an http:// endpoint.
            text = str(exc).split("\n", 1)[0]
            raise SyncError(
                SourceProblem.BAD_URL,
                f"{source}: the S3 client refused its settings ({text}): check AWS_CA_BUNDLE, the proxy variables"
                " and that the system's CA certificates are installed (ca-certificates)",
            ) from None

    async def list(self) -> list[RemoteEntry]:
        import obstore

        entries: list[RemoteEntry] = []
        try:
            pages = aiter(obstore.list(self._store, chunk_size=1000))
            while (batch := await self._within(anext(pages, None))) is not None:
                for meta in batch:
                    etag = (meta["e_tag"] or "").strip('"')
                    digest = f"md5:{etag}" if _MD5_HEX.fullmatch(etag) else f"etag:{etag}"
                    entries.append(RemoteEntry(meta["path"], meta["size"], digest, meta["e_tag"]))
        except SyncError:
            raise
        except Exception as exc:
            raise _s3_error(exc, self.url, self._region) from exc
        return entries

    async def _within(self, step: Awaitable[T]) -> T:
        """``step``, or SyncError(UNREACHABLE) when it takes longer than the read timeout (a stalled link)."""
        try:
            return await asyncio.wait_for(step, self._idle_s)
        except TimeoutError:
            raise SyncError(
                SourceProblem.UNREACHABLE, f"{self.url}: no answer for {self._idle_s:g} s (the link stalled)"
            ) from None

    async def read(self, entry: RemoteEntry, start: int) -> AsyncIterator[bytes]:
        import obstore

        options: dict[str, Any] = {}
        if start:
            options["range"] = {"offset": start}
        if entry.version:
            options["if_match"] = entry.version
        try:
            result = await self._within(
                obstore.get_async(self._store, entry.path, options=options)  # type: ignore[arg-type]
            )
            chunks = aiter(result.stream(min_chunk_size=CHUNK_BYTES))
            while (chunk := await self._within(anext(chunks, None))) is not None:
                yield bytes(chunk)
        except SyncError:
            raise
        except Exception as exc:
            raise _s3_error(exc, f"{self.url}/{entry.path}", self._region) from exc

    async def write(self, key: str, data: bytes) -> None:
        import obstore

        try:
            await self._within(obstore.put_async(self._store, key, data))
        except SyncError:
            raise
        except Exception as exc:
            raise _s3_error(exc, f"{self.url}/{key}", self._region) from exc

    async def delete(self, key: str) -> None:
        import obstore

        try:
            await self._within(obstore.delete_async(self._store, key))
        except SyncError:
            raise
        except Exception as exc:
            raise _s3_error(exc, f"{self.url}/{key}") from exc

    async def close(self) -> None:
        """obstore's client holds no connection that needs closing, but its runtime threads hand each result back an
        instant after the await ends; an interpreter finalizing under one of them aborts the process (a race in
        pyo3-async-runtimes). A process that exits right after closing waits that instant out here."""
        await asyncio.sleep(CLOSE_GRACE_S)


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


def _read_bundle(path: str) -> str:
    try:
        bundle = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise SyncError(SourceProblem.BAD_URL, f"AWS_CA_BUNDLE {path} cannot be read: {type(exc).__name__}") from None
    if "-----BEGIN CERTIFICATE-----" not in bundle:
        raise SyncError(SourceProblem.BAD_URL, f"AWS_CA_BUNDLE {path} holds no PEM certificate")
    return bundle


# These are URLs: obstore panics on some malformed ones rather than failing, so they are checked first.
_S3_URLS: Final = frozenset({"aws_endpoint_url_sts", "container_credentials_full_uri", "metadata_endpoint"})


def _checked_url(value: str, variable: str) -> str:
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError:
        parts = urllib.parse.urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SyncError(SourceProblem.BAD_URL, f"{variable} '{value}' is not an http:// or https:// URL")
    return value


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
    elif isinstance(exc, (ConnectionError, TimeoutError)) or any(
        # "body error" with "TimedOut": a response body that stopped arriving (a stalled link mid-download).
        sign in full
        for sign in (
            "error sending request",
            "timed out",
            "TimedOut",
            "body error",
            "Connection refused",
            "connection reset",
        )
    ):
        problem = SourceProblem.UNREACHABLE
    else:
        problem = SourceProblem.OTHER
    if problem is SourceProblem.WRONG_REGION:
        text += (
            f' (edged asked in region {region}: set AWS_DEFAULT_REGION, or the entry\'s "region" in'
            " TRITON_CLOUD_CREDENTIAL_PATH, to the bucket's)"
        )
    return SyncError(problem, f"{where}: {text}")
