"""Azure Blob Storage repositories (``as://account/container/prefix``) through obstore: the store's settings from
Triton's credential (a shared key, anonymous, managed identity or Azure's default chain), an endpoint for Azurite
or a private one, and Azure's errors told apart; listing, reads, writes and deletes are edged.sync.obstores'."""

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
from edged.sync.sources import BODY_REQUEST_S, ClientOptions, SourceURL

if TYPE_CHECKING:
    from obstore.store import AzureStore

    from edged.sync.credentials import AzureCredentials

# Azurite's account and key, published by Microsoft and the same in every emulator.
EMULATOR_ACCOUNT: Final = "devstoreaccount1"
EMULATOR_KEY: Final = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
EMULATOR_URL: Final = "http://127.0.0.1:10000"
# A private CA, as Azure's CLI and Python SDK take it.
CA_VARIABLE: Final = "REQUESTS_CA_BUNDLE"
_TRUE: Final = frozenset({"1", "true", "yes", "on"})


class AzureRepository(ObstoreRepository):
    """An Azure Blob Storage container (or a prefix of one), through obstore."""

    def __init__(
        self, source: SourceURL, env: Mapping[str, str], options: ClientOptions, credentials: AzureCredentials
    ) -> None:
        super().__init__(source, _make_store(source, env, options, credentials), options)

    def _entry(self, meta: Mapping[str, Any]) -> RemoteEntry:
        # Azure's ETag changes with every write of a blob, so it tells a change apart; it is no digest of the bytes,
        # and obstore's listing leaves out the Content-MD5 that single-shot uploads carry.
        etag = (meta["e_tag"] or "").strip('"')
        return RemoteEntry(meta["path"], meta["size"], f"etag:{etag}", meta["e_tag"])

    def _error(self, exc: Exception, where: str) -> SyncError:
        return azure_error(exc, where)


def endpoint_for(account: str, env: Mapping[str, str]) -> tuple[str, bool]:
    """The account's blob endpoint (a URL) and whether it is the emulator's: ``AZURE_STORAGE_ENDPOINT`` or
    ``AZURE_ENDPOINT`` (obstore's names) as given, Azurite's (``AZURITE_BLOB_STORAGE_URL``, else its default port,
    addressed by path) with ``AZURE_STORAGE_USE_EMULATOR``, else Azure's."""
    for variable in ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT"):
        if env.get(variable):
            return checked_url(env[variable], variable).rstrip("/"), False
    if env.get("AZURE_STORAGE_USE_EMULATOR", "").lower() in _TRUE:
        root = env.get("AZURITE_BLOB_STORAGE_URL") or EMULATOR_URL
        return f"{checked_url(root, 'AZURITE_BLOB_STORAGE_URL').rstrip('/')}/{account}", True
    return f"https://{account}.blob.core.windows.net", False


def _make_store(
    source: SourceURL, env: Mapping[str, str], options: ClientOptions, credentials: AzureCredentials
) -> AzureStore:
    from obstore.store import AzureStore

    account = credentials.account or source.account or ""
    endpoint, emulator = endpoint_for(account, env)
    # Everything explicit: obstore reads the process environment's AZURE_* variables too, and its emulator mode
    # (which this replaces) would otherwise follow AZURE_STORAGE_USE_EMULATOR there rather than in ``env``.
    config: dict[str, Any] = {"account_name": account, "endpoint": endpoint, "use_emulator": False}
    provider = None
    if credentials.auth_type == "key":
        key = credentials.account_key or (EMULATOR_KEY if emulator else None)
        if key:
            static = {"access_key": key, "expires_at": None}

            def provider() -> dict[str, Any]:
                return static

        else:
            # Triton's anonymous access: a public container.
            config["skip_signature"] = True
    else:
        # Tokens that obstore fetches and refreshes before they expire: from the managed identity (IMDS, or the
        # endpoint App Service and Arc name), or Azure's chain (service principal, workload identity, then the
        # managed identity).
        config["credential_type"] = "managed_identity" if credentials.auth_type == "managed_identity" else "auto"
        if credentials.auth_type == "default":
            for key, variables in _AZURE_CHAIN.items():
                found = next((name for name in variables if env.get(name)), None)
                if found:
                    config[key] = env[found]
        for variable in ("AZURE_MSI_ENDPOINT", "IDENTITY_ENDPOINT"):
            if env.get(variable) and "msi_endpoint" not in config:
                config["msi_endpoint"] = checked_url(env[variable], variable)
        if credentials.client_id:
            config["client_id"] = credentials.client_id
    client = client_options(options, endpoint, env, CA_VARIABLE, BODY_REQUEST_S)
    try:
        return AzureStore(
            source.bucket,
            prefix=source.prefix or None,
            config=config,  # type: ignore[arg-type]
            client_options=client,  # type: ignore[arg-type]
            retry_config=retry_options(options),  # type: ignore[arg-type]
            credential_provider=provider,  # type: ignore[arg-type]
        )
    except Exception as exc:
        raise refused_settings(exc, source, "Azure", CA_VARIABLE) from None


# Azure's chain (DefaultAzureCredential) by obstore's config key, from the variables Azure's SDKs read.
_AZURE_CHAIN: Final = {
    "client_id": ("AZURE_CLIENT_ID",),
    "client_secret": ("AZURE_CLIENT_SECRET",),
    "tenant_id": ("AZURE_TENANT_ID",),
    "federated_token_file": ("AZURE_FEDERATED_TOKEN_FILE",),
    "authority_host": ("AZURE_AUTHORITY_HOST",),
}

# Azure's error codes (the <Code> of its XML error body, or x-ms-error-code) by what an operator has to fix.
_AZURE_CODES: Final = {
    "ContainerNotFound": SourceProblem.NOT_FOUND,
    "BlobNotFound": SourceProblem.NOT_FOUND,
    "ResourceNotFound": SourceProblem.NOT_FOUND,
    "AuthenticationFailed": SourceProblem.DENIED,
    "AuthorizationFailure": SourceProblem.DENIED,
    "AuthorizationPermissionMismatch": SourceProblem.DENIED,
    "AuthorizationResourceTypeMismatch": SourceProblem.DENIED,
    "InsufficientAccountPermissions": SourceProblem.DENIED,
    "NoAuthenticationInformation": SourceProblem.DENIED,
    "PublicAccessNotPermitted": SourceProblem.DENIED,
    "AccountIsDisabled": SourceProblem.DENIED,
    "ConditionNotMet": SourceProblem.CHANGED,
    "InvalidResourceName": SourceProblem.BAD_URL,
}
_AZURE_STATUS: Final = {
    401: SourceProblem.DENIED,
    403: SourceProblem.DENIED,
    404: SourceProblem.NOT_FOUND,
    412: SourceProblem.CHANGED,
}


def azure_error(exc: Exception, where: str) -> SyncError:
    from obstore import exceptions

    full = str(exc)
    text = full.split("\n", 1)[0].split(": <?xml", 1)[0].removeprefix("Generic MicrosoftAzure error: ")
    code = re.search(r"<Code>(\w+)</Code>", full)
    said = re.search(r"<Message>([^<\n]*)", full)
    status = re.search(r"(?:status code: |non-2xx status code: )(\d{3})", full)
    if isinstance(exc, exceptions.InvalidPathError):
        problem = SourceProblem.REFUSED
    elif code and code[1] in _AZURE_CODES:
        problem = _AZURE_CODES[code[1]]
        text = f"{code[1]}: {said[1].strip() if said else text}"
    elif any(sign in full for sign in ("169.254.169.254", "/metadata/identity/oauth2/token")):
        # A managed identity was asked for, and the instance metadata service is not there (not an Azure VM).
        problem = SourceProblem.CREDENTIALS
        text = f"no managed identity (the instance metadata service failed): {text}"
    elif isinstance(exc, (exceptions.NotFoundError, FileNotFoundError)):
        problem = SourceProblem.NOT_FOUND
    elif isinstance(exc, (exceptions.PermissionDeniedError, exceptions.UnauthenticatedError, PermissionError)):
        problem = SourceProblem.DENIED
    elif isinstance(exc, exceptions.PreconditionError):
        problem = SourceProblem.CHANGED
    elif status and int(status[1]) in _AZURE_STATUS:
        problem = _AZURE_STATUS[int(status[1])]
    elif isinstance(exc, (ConnectionError, TimeoutError)) or any(sign in full for sign in TRANSPORT_SIGNS):
        problem = SourceProblem.UNREACHABLE
    else:
        problem = SourceProblem.OTHER
    return SyncError(problem, f"{where}: {text}")
