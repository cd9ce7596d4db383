"""The messages between the daemon and a stub process, and how tensors travel with them.

Transport: one ``AF_UNIX``/``SOCK_SEQPACKET`` socket pair per stub, so each message is one packet (no framing,
and a file descriptor passed with a packet belongs to that message). A message is a JSON object whose ``t`` names
its kind; tensor data never goes through the socket: the sender writes it into its shared-memory ring
(edged.backends.python.shm) and the message carries each tensor's position (``TensorDesc``), plus ``blk``, the
span the receiver holds until it has read or finished with the tensors, and ``region`` with a descriptor when the
sender has moved to a new ring.

Kinds, daemon to stub:
  init {args, model_file, paths, decoupled}            -> init_done {ok, error?, has_is_ready, ready}
  auto_complete {config, model_file, paths}            -> auto_complete_done {config?, error?}
  execute {batch, requests: [RequestMsg]}               -> execute_done {batch, responses?: [ResponseMsg], error?}
  cancel {rid}                                          a request of the batch was cancelled by its client
  bls_response {call, response: ResponseMsg, final}    a reply to the stub's bls, once (or 0..n for decoupled)
  call_done {call, result?, error?}                     a reply to load_model, unload_model, is_model_ready
  is_ready                                              -> is_ready_done {ready}
  finalize                                              -> finalize_done, then the stub exits
Kinds, stub to daemon:
  response {rid, response?: ResponseMsg, final}         a decoupled model's response through its sender
  bls {call, model, version, request: RequestMsg, decoupled}, bls_cancel {call}
  call {call, op, args}                                  load_model, unload_model, is_model_ready
  log {level, msg}
  metric {op, ...}                                       custom metric families and their values

This module is imported by the stub too, so it uses the standard library and numpy only.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

if TYPE_CHECKING:
    from edged.backends.python.shm import Consumer, Producer

# A message bigger than a socket's send buffer cannot go as one packet; every message is small (tensors travel in
# shared memory), and the few free-text fields (log lines, error messages) are cut to fit.
MAX_MESSAGE = 160 * 1024
MAX_TEXT = 32 * 1024
_MAX_FDS = 4
_LENGTH = struct.Struct("<I")

# Wire datatype -> numpy dtype of its binary form (BF16 travels as its uint16 bits).
NUMPY_BY_DATATYPE: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
}


class TensorDesc(TypedDict):
    n: str  # name
    d: str  # wire datatype
    s: list[int]  # shape
    o: int  # ring position
    b: int  # byte length of the binary form


class RequestMsg(TypedDict, total=False):
    rid: int  # the daemon's key for the request, unique per stub
    id: str
    correlation_id: int | str
    flags: int
    timeout: int
    parameters: str  # JSON
    inputs: list[TensorDesc]
    outputs: list[str]
    model_name: str
    model_version: int


class ErrorMsg(TypedDict):
    msg: str
    code: str  # an ErrorCode name


class ResponseMsg(TypedDict, total=False):
    outputs: list[TensorDesc]
    error: ErrorMsg
    parameters: dict[str, Any]


def cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 15] + " ... (cut)"


# --- tensors ------------------------------------------------------------------------------------------------


def serialize_bytes(array: np.ndarray[Any, Any]) -> bytes:
    """Triton's binary BYTES form: each element as a uint32 little-endian length and its bytes, in C order."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        # bytes (and np.bytes_) go as they are; anything else as its text, as Triton serialises it.
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | memoryview, count: int) -> np.ndarray[Any, Any]:
    view = memoryview(buffer)
    if count * 4 > len(view):  # every element has at least its 4-byte length
        raise ValueError(f"BYTES tensor of {len(view)} bytes cannot hold {count} elements")
    out = np.empty(count, dtype=np.object_)
    offset = 0
    for index in range(count):
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        out[index] = bytes(view[offset : offset + length])
        offset += length
    if offset != len(view):
        raise ValueError(f"BYTES tensor holds {len(view)} bytes, its {count} elements use {offset}")
    return out


class TensorWriter:
    """Collects the tensors of one message, then writes them into the sender's ring as one block."""

    __slots__ = ("_items", "_total")

    def __init__(self) -> None:
        self._items: list[tuple[TensorDesc, Any]] = []
        self._total = 0

    def add(
        self, name: str, datatype: str, shape: list[int], data: np.ndarray[Any, Any] | bytes | memoryview
    ) -> TensorDesc:
        """``data``: a numeric array, an object array (BYTES), or the binary form itself."""
        if isinstance(data, np.ndarray):
            if datatype == "BYTES":
                data = serialize_bytes(data)
                length = len(data)
            else:
                length = data.nbytes
        else:
            length = len(data) if isinstance(data, bytes) else data.nbytes
        desc: TensorDesc = {"n": name, "d": datatype, "s": shape, "o": self._total, "b": length}
        self._items.append((desc, data))
        self._total += (length + 63) & ~63
        return desc

    def commit(self, producer: Producer) -> list[int] | None:
        """Write every tensor; returns the block ``[start, end]`` for the message, or None when there is nothing."""
        if not self._items:
            return None
        start, view = producer.reserve(self._total)
        for desc, data in self._items:
            offset = desc["o"]
            length = desc["b"]
            desc["o"] = start + offset
            if length == 0:
                continue
            target = view[offset : offset + length]
            if isinstance(data, np.ndarray):
                dtype = data.dtype if data.dtype.byteorder != ">" else data.dtype.newbyteorder("<")
                np.frombuffer(target, dtype=dtype, count=data.size)[...] = data.reshape(-1)
            else:
                target[:] = data
        return [start, start + self._total]


def read_tensor(consumer: Consumer, desc: TensorDesc, *, copy: bool) -> np.ndarray[Any, Any]:
    """The tensor a descriptor names, as numpy: a view over the ring unless ``copy`` (BYTES are always copied)."""
    shape = tuple(int(d) for d in desc["s"])
    count = 1
    for dim in shape:
        count *= dim
    datatype = desc["d"]
    raw = consumer.read(int(desc["o"]), int(desc["b"]))
    if datatype == "BYTES":
        return deserialize_bytes(raw, count).reshape(shape)
    dtype = NUMPY_BY_DATATYPE.get(datatype)
    if dtype is None:
        raise ValueError(f"unknown datatype '{datatype}' for tensor '{desc['n']}'")
    if len(raw) != count * dtype.itemsize:
        raise ValueError(f"tensor '{desc['n']}' holds {len(raw)} bytes, its shape needs {count * dtype.itemsize}")
    array = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
    return array.copy() if copy else array


# --- the socket, blocking (the stub, and the daemon while it starts or stops a stub) ----------------------------


def socket_pair() -> tuple[socket.socket, socket.socket]:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (parent, child):
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, 4 * MAX_MESSAGE)
    return parent, child


def encode(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"message of {len(data)} bytes is over the limit of {MAX_MESSAGE}")
    return data


def send(sock: socket.socket, data: bytes, fds: list[int] | None = None) -> None:
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One packet and the descriptors that came with it; empty bytes when the peer has gone."""
    data, fds, _flags, _address = socket.recv_fds(sock, MAX_MESSAGE + 1, _MAX_FDS)
    return data, list(fds)
