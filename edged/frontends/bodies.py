"""Request bodies that the HTTP doors (the API and the console) stream to disk or refuse: the size limits, and model
archives (their content types, their kind from their first bytes, written to a file within a limit)."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from litestar import Request

    from edged.core.repository.archives import ArchiveKind

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


class BodyTooLarge(Exception):
    """The request body is over ``HttpOptions.max_input_size`` (413)."""


def declared_too_large(declared: str | None, limit: int) -> BodyTooLarge | None:
    """The refusal of a body whose Content-Length is over the limit, before any of it is read."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return BodyTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    return None


def streamed_too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"request body exceeds the limit of {limit} bytes")


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
