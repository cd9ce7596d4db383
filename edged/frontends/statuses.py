"""The HTTP status of each core error, as Triton's HTTP endpoint answers it: the same for every door that speaks HTTP
(the API and the console)."""

from __future__ import annotations

from edged.errors import EdgedError, ErrorCode

STATUS_BY_CODE: dict[ErrorCode, int] = {
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
}


def status_for(error: EdgedError) -> int:
    """Every other code is the client's: 400."""
    return STATUS_BY_CODE.get(error.code, 400)
