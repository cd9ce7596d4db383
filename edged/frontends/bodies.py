"""Request bodies that the HTTP doors (the API and the console) stream to disk or refuse: the size limits, model
archives (their content types, their kind from their first bytes, written to a file within a limit), and the fields
of edged's management requests (tokens, sync control, versions), refused when unknown."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any, Final, Literal

from edged.core.names import printable
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping
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
# Unknown fields a refusal names at most, each cut to this many characters: the answer stays short.
_UNKNOWN_NAMED: Final = 10
_NAME_SHOWN: Final = 64


class BodyTooLarge(Exception):
    """The request body is over ``HttpOptions.max_input_size`` (413)."""


# What a body is, for the words of its refusal: a JSON document, a JSON header with binary data after it, one raw
# binary input (Inference-Header-Content-Length 0), or a model archive.
Framing = Literal["json", "binary", "raw", "upload"]


def framing_of(inference_header_length: str | None) -> Framing:
    """What an inference (or other API) body is, from its ``Inference-Header-Content-Length`` header."""
    if inference_header_length is None:
        return "json"
    return "raw" if inference_header_length.strip() == "0" else "binary"


def declared_too_large(declared: str | None, limit: int, framing: Framing = "json") -> BodyTooLarge | None:
    """The refusal of a body whose Content-Length is over the limit, before any of it is read."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return BodyTooLarge(_too_large(int(declared), limit, framing))
    return None


def streamed_too_large(limit: int, framing: Framing = "json") -> BodyTooLarge:
    return BodyTooLarge(_too_large(None, limit, framing))


def _too_large(size: int | None, limit: int, framing: Framing) -> str:
    """Triton's words for a body over ``--http-max-input-size`` (its clients and its tests look for them); edged's
    own for an archive over ``--upload-max-bytes``."""
    if framing == "upload":
        of = f" of {size} bytes" if size is not None else ""
        return (
            f"model archive{of} exceeds the maximum allowed size of {limit} bytes. Use --upload-max-bytes to "
            "increase the limit."
        )
    advice = f"{limit} bytes. Use --http-max-input-size to increase the limit."
    if framing == "raw":
        of = f" ({size} bytes)" if size is not None else ""
        return f"Raw input has a byte_size{of} that exceeds the maximum allowed value of {advice}"
    of = f" of {size} bytes" if size is not None else ""
    what = "request JSON size" if framing == "json" else "request size"
    return f"{what}{of} exceeds the maximum allowed input size of {advice}"


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
                raise streamed_too_large(limit, "upload")
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


def management_fields(body: bytes, what: str, known: Collection[str], max_depth: int) -> dict[str, Any]:
    """The fields of a management request (edged's own API, not Triton's): an empty body is none, anything else a
    JSON object of ``known`` fields. INVALID_ARG (400) for any other body, and naming every unknown field: a field
    misspelt or not supported, dropped silently, would do something else than asked (a token meant to expire that
    never does)."""
    # Here, not at the top: the HTTP package (its infer route) imports this module.
    from edged.frontends.http.codec import decode_json

    if not body.strip():
        return {}
    try:
        document = decode_json(body, max_depth)
    except EdgedError as error:  # the codec's INTERNAL is Triton's answer for inference; here it is the client's
        raise EdgedError(ErrorCode.INVALID_ARG, error.message) from None
    if not isinstance(document, dict):
        raise EdgedError(ErrorCode.INVALID_ARG, f"the {what} request body must be a JSON object")
    problem = unknown_fields(document, f"{what} request", known)
    if problem is not None:
        raise EdgedError(ErrorCode.INVALID_ARG, problem)
    return document


def unknown_fields(names: Iterable[str], what: str, known: Collection[str]) -> str | None:
    """What is wrong with a management request (or console form) that holds fields among ``names`` other than
    ``known``, each named; None when there are none."""
    unknown = sorted({str(name) for name in names} - set(known))
    if not unknown:
        return None
    named = ", ".join(f"'{printable(name, _NAME_SHOWN)}'" for name in unknown[:_UNKNOWN_NAMED])
    more = f" and {len(unknown) - _UNKNOWN_NAMED} more" if len(unknown) > _UNKNOWN_NAMED else ""
    fields = "field" if len(unknown) == 1 else "fields"
    expected = f"known: {', '.join(known)}" if known else "it takes none"
    return f"unknown {fields} {named}{more} in the {what} ({expected})"


async def no_fields(request: Request[Any, Any, Any], what: str) -> None:
    """An API management request that takes no fields (sync control, a version's activation): its body is empty or
    ``{}``, within the API's JSON depth; 400 naming any field."""
    management_fields(await request.body(), what, (), request.app.state.options.max_json_depth)
