"""``POST /v2/edged/models/{model}/upload[?activate=true]``: a model archive as the raw body, streamed to a file
under the state directory (never held whole in memory) within ``--upload-max-bytes``, then installed by the core
(edged.core.repository.uploads).

Answers ``{"model", "version", "created", "loaded", "problems"}``: 200 when installed; 400 with the problems for an
archive or model that is refused (``error`` holds the first); 409 for a model that cannot be uploaded to (synced);
413 past the size limit (the connection protocol answers a declared Content-Length over it before the body is
read); 415 for a body that is not a zip or tar archive.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from litestar import MediaType, Request, Response, post

from edged.core.repository.uploads import UploadInvalid
from edged.errors import EdgedError, ErrorCode
from edged.frontends.http.codec import encode, error_body
from edged.frontends.http.infer import BodyTooLarge, HttpOptions, declared_too_large, status_for, streamed_too_large

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from edged.core.repository.archives import ArchiveKind
    from edged.core.repository.uploads import ModelUploads
    from edged.core.service import InferenceService

# Content types an archive may be sent as; the archive's own first bytes decide how it is read.
ARCHIVE_TYPES = frozenset(
    {
        "application/zip",
        "application/x-zip-compressed",
        "application/gzip",
        "application/x-gzip",
        "application/x-tar",
        "application/x-gtar",
        "application/x-compressed-tar",
        "application/octet-stream",
    }
)
_BOOLEANS = {"true": True, "1": True, "on": True, "yes": True, "false": False, "0": False, "off": False, "no": False}
# Written to disk in pieces this large, in a worker thread, so the event loop never waits for the disk.
_WRITE_SIZE = 1024 * 1024


def _uploads(request: Request[Any, Any, Any]) -> ModelUploads:
    service: InferenceService = request.app.state.service
    if service.uploads is None:
        raise EdgedError(ErrorCode.UNAVAILABLE, "this server takes no model uploads")
    return service.uploads


def _answer(status: int, value: Any) -> Response[bytes]:
    return Response(encode(value), status_code=status, media_type=MediaType.JSON)


@post("/v2/edged/models/{model:str}/upload", status_code=200, request_max_body_size=None)
async def model_upload(request: Request[Any, Any, Any], model: str) -> Response[bytes]:
    """Install the archive in the body as model ``model`` or as its next version; ``?activate=true`` loads it."""
    uploads = _uploads(request)
    options: HttpOptions = request.app.state.options
    refusal = archive_type_refusal(request.headers)
    if refusal is not None:
        return Response(error_body(refusal), status_code=415, media_type=MediaType.JSON)
    activate = activate_flag(request.query_params.get("activate", "false"))
    limit = options.max_upload_size
    try:
        too_large = declared_too_large(request.headers.get("content-length"), limit)
        if too_large is not None:
            raise too_large
        # Refused before the body is read: a name that cannot be a model's, a synced model.
        await uploads.precheck(model, activate=activate)
        async with uploads.receiving() as path:
            await receive_archive(request, path, limit)
            result = await uploads.install(model, path, archive_kind(path), activate=activate)
    except BodyTooLarge as error:
        return Response(error_body(str(error)), status_code=413, media_type=MediaType.JSON)
    except UploadInvalid as error:
        body = {
            "error": error.message,
            "model": error.model,
            "version": error.version,
            "loaded": False,
            "problems": error.problems,
        }
        return _answer(400, body)
    except EdgedError as error:
        status = 409 if error.code is ErrorCode.ALREADY_EXISTS else status_for(error)
        return Response(error_body(error.message), status_code=status, media_type=MediaType.JSON)
    return _answer(200, result.to_json())


def archive_type_refusal(headers: Mapping[str, str]) -> str | None:
    """Why a body sent with these headers is not taken as an archive (415); None when it is."""
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in ARCHIVE_TYPES:
        return (
            f"an upload's body is a .zip or .tar.gz archive, sent as application/zip or application/gzip, "
            f"not '{content_type or 'no content type'}'"
        )
    if headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
        return "an upload's body is sent as it is: compress the archive, not the request"
    return None


def activate_flag(text: str) -> bool:
    """The ``activate`` query parameter: true or false (1/0, on/off, yes/no); INVALID_ARG otherwise."""
    value = text.strip().lower()
    if value not in _BOOLEANS:
        raise EdgedError(ErrorCode.INVALID_ARG, f"activate must be true or false, got '{value[:20]}'")
    return _BOOLEANS[value]


async def receive_archive(request: Request[Any, Any, Any], path: Path, limit: int) -> None:
    """The body into a new file at ``path``, within ``limit`` bytes (BodyTooLarge past it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        size = 0
        pending = bytearray()
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise streamed_too_large(limit)
            pending += chunk
            if len(pending) >= _WRITE_SIZE:
                data, pending = pending, bytearray()
                await asyncio.to_thread(handle.write, data)
        if pending:
            await asyncio.to_thread(handle.write, pending)


def archive_kind(path: Path) -> ArchiveKind:
    """zip or tar (compressed or not), from the archive's first bytes; 415-worthy otherwise."""
    with path.open("rb") as handle:
        head = handle.read(512)
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")) or head[257:262] == b"ustar":
        return "tar"
    raise EdgedError(ErrorCode.INVALID_ARG, "the body is not a zip or tar archive (gzip, bzip2 or xz compressed)")
