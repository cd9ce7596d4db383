"""HTTP/2's frames (RFC 9113 section 6) and the header blocks edged sends (RFC 7541), for edged.frontends.grpc.http2:
the codes and the protocol's own limits, and the few encoders and checks that need no connection state (the limits
this server announces and keeps are edged.frontends.grpc.bounds)."""

from __future__ import annotations

import struct
from typing import Final

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

FLAG_END_STREAM: Final = 0x1
FLAG_ACK: Final = 0x1
FLAG_END_HEADERS: Final = 0x4
FLAG_PADDED: Final = 0x8
FLAG_PRIORITY: Final = 0x20

NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = 0xB

SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE: Final = 0x6

MAX_WINDOW: Final = 2**31 - 1
DEFAULT_WINDOW: Final = 65535
DEFAULT_MAX_FRAME: Final = 16384

_FRAME_HEADER: Final = struct.Struct(">BHBBL")  # the 24-bit length as a byte and a short, then type, flags, stream


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _FRAME_HEADER.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


def header_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block of literals without indexing (RFC 7541 6.2.2), so that no dynamic table state is needed;
    ``:status: 200`` is the static table's entry 8."""
    parts = []
    for name, value in headers:
        if name == b":status" and value == b"200":
            parts.append(b"\x88")
        else:
            parts.append(b"\x00" + _string(name) + _string(value))
    return b"".join(parts)


def _string(data: bytes) -> bytes:
    size = len(data)
    if size < 127:
        return bytes((size,)) + data
    size -= 127
    prefix = bytearray(b"\x7f")
    while size >= 128:
        prefix.append((size & 0x7F) | 0x80)
        size >>= 7
    prefix.append(size)
    return bytes(prefix) + data


class ProtocolError(Exception):
    """The peer broke HTTP/2: the connection ends with GOAWAY and this code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def unpad(payload: bytes) -> bytes:
    if not payload:
        raise ProtocolError(PROTOCOL_ERROR, "padded frame without its pad length")
    padding = payload[0]
    if padding >= len(payload):
        raise ProtocolError(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - padding]
