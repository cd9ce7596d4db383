"""RFC 9113 section 8's rules for a request's fields, which make a request that breaks them malformed (a stream
error, PROTOCOL_ERROR): field names are lower-case tokens, values hold no NUL, CR or LF and neither begin nor end
with a space or tab, the pseudo-headers are the request's four, each at most once and before every regular field,
``:method``, ``:scheme`` and a non-empty ``:path`` are there, no connection-specific field (``connection``,
``keep-alive``, ``transfer-encoding``...) and no ``te`` but ``trailers``; a ``content-length`` must be a number,
and the DATA that follows must add up to it (checked by edged.frontends.grpc.http2 as it arrives).

Behind a proxy that reads the first ``:path`` or trusts ``content-length``, each of these would let one request be
read as another. The checks run once per distinct header block: edged.frontends.grpc.http2 remembers the verdict
with the decoded block.
"""

from __future__ import annotations

from typing import Final

_TOKEN: Final = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
_PSEUDO: Final = frozenset({b":method", b":scheme", b":path", b":authority"})
_REQUIRED: Final = frozenset({b":method", b":scheme", b":path"})
_CONNECTION_SPECIFIC: Final = frozenset(
    {b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade"}
)
_EDGES: Final = (b" ", b"\t")


def check_request(headers: list[tuple[bytes, bytes]]) -> tuple[int | None, str | None]:
    """The request's ``content-length`` (None when it has none), and what makes it malformed (None when nothing)."""
    seen: set[bytes] = set()
    regular = False
    length: int | None = None
    for name, value in headers:
        if name[:1] == b":":
            if regular:
                return None, f"pseudo-header {_shown(name)} after a regular field"
            if name not in _PSEUDO:
                return None, f"unknown pseudo-header {_shown(name)}"
            if name in seen:
                return None, f"pseudo-header {_shown(name)} more than once"
            seen.add(name)
            if name == b":path" and not value:
                return None, "empty :path"
        else:
            regular = True
            error = _field_error(name)
            if error is not None:
                return None, error
            if name == b"te" and value != b"trailers":
                return None, "te other than trailers"
            if name == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    return None, "content-length that is not one number"
                length = int(value)
        if _bad_value(value):
            return None, f"the value of {_shown(name)} has NUL, CR or LF, or begins or ends with white space"
    missing = _REQUIRED - seen
    if missing:
        return None, f"no {', '.join(sorted(m.decode() for m in missing))}"
    return length, None


def check_trailers(headers: list[tuple[bytes, bytes]]) -> str | None:
    """What makes a request's trailers malformed: any pseudo-header, and the rules for every field."""
    for name, value in headers:
        if name[:1] == b":":
            return f"pseudo-header {_shown(name)} in trailers"
        error = _field_error(name)
        if error is not None:
            return error
        if _bad_value(value):
            return f"the value of {_shown(name)} has NUL, CR or LF, or begins or ends with white space"
    return None


def _bad_value(value: bytes) -> bool:
    # Searched byte by byte in C (memchr): a regular expression takes milliseconds over a 60 KB value.
    return b"\0" in value or b"\r" in value or b"\n" in value or value[:1] in _EDGES or value[-1:] in _EDGES


def _field_error(name: bytes) -> str | None:
    if not name or name.translate(None, _TOKEN):
        return f"field name {_shown(name)} is not a lower-case token"
    if name in _CONNECTION_SPECIFIC:
        return f"connection-specific field {_shown(name)}"
    return None


def _shown(name: bytes) -> str:
    """A name as the error text shows it: printable ASCII only, at most 64 characters."""
    text = name[:64].decode("ascii", "backslashreplace")
    return repr("".join(c if c.isprintable() else "?" for c in text))
