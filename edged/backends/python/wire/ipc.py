"""The messages between the daemon and a stub process, and how tensors travel with them.

Transport: one ``AF_UNIX``/``SOCK_SEQPACKET`` socket pair per stub, so each message is one packet (no framing,
and a file descriptor passed with a packet belongs to that message). A packet is a JSON object whose ``t`` names
its kind, then, when tensors travel inside it, a NUL byte and their bytes (the payload; JSON text never holds a
raw NUL). Tensors of a message travel one of two ways:

* small ones (``INLINE_MAX`` bytes in all, the common case of a request's inputs and outputs) inside the packet,
  sent straight from the arrays' memory (scatter-gather, no copy on the way out); each ``TensorDesc`` has ``p``,
  its offset in the payload. Nothing is held or released afterwards, so a round trip costs two syscalls per side.
* larger ones through the sender's shared-memory ring (edged.backends.python.wire.shm): each ``TensorDesc`` has ``o``,
  its ring position, and the message has ``blk``, the span the receiver holds until it has read or finished with
  the tensors, and ``region`` with a descriptor when the sender has moved to a new ring.

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

This module is imported by the stub too, so it needs the standard library and numpy only; msgspec, when the
interpreter has it (the daemon's always does; a model's own environment may not), encodes and decodes the stub's
messages several times faster than the json module.
"""

from __future__ import annotations

import json
import math
import os
import socket
import struct
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NotRequired

    from edged.backends.python.wire.shm import Consumer, Producer

# A message bigger than a socket's send buffer cannot go as one packet; every message is small (large tensors
# travel in shared memory), and the few free-text fields (log lines, error messages) are cut to fit.
MAX_MESSAGE = 160 * 1024
# Tensors up to this many bytes in all travel inside the packet: below this size, copying them through the socket
# costs less than the ring's bookkeeping.
INLINE_MAX = 64 * 1024
MAX_TEXT = 32 * 1024
_MAX_FDS = 4
_DONE_KEYS = frozenset({"t", "batch", "responses"})
_LENGTH = struct.Struct("<I")
_FD = struct.Struct("i")

# Wire datatype -> numpy dtype of its binary form (BF16 travels as its uint16 bits). edged.core.request.datatypes has
# the same table, but this module is also imported by the stub, which may run under a model's own interpreter
# (EXECUTION_ENV_PATH) where edged is not installed: it imports nothing of edged.
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
    b: int  # byte length of the binary form
    o: NotRequired[int]  # ring position, for a tensor in shared memory
    p: NotRequired[int]  # payload offset, for a tensor inside the packet


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
    trace: int  # the id of the request's trace, when it is traced (a BLS call may pass it on)


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
    """Collects the tensors of one message, then sends them inside the packet (``inline``) or writes them into
    the sender's ring as one block (``commit``)."""

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

    def inline(self) -> tuple[list[bytes | memoryview], int] | None:
        """When the tensors are small enough to go inside the packet: the buffers that make its payload and its
        size, each tensor at its offset (64-byte aligned from the payload's start), and every descriptor switched
        from a ring position to that offset. None when they must go through the ring."""
        if not self._items or self._total > INLINE_MAX:
            return None
        parts: list[bytes | memoryview] = []
        end = 0
        for desc, data in self._items:
            offset = desc.pop("o")
            length = desc["b"]
            # An empty tensor takes no room: its offset may lie past the payload's end (when it comes last), so it
            # names the payload's start, where zero bytes are always found.
            desc["p"] = offset if length else 0
            if length == 0:
                continue
            if offset > end:
                parts.append(_PADDING[: offset - end])
            parts.append(_wire_bytes(data))
            end = offset + length
        return parts, end

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
                if data.flags.c_contiguous and data.dtype.byteorder != ">":
                    target[:] = data.data.cast("B")  # already in its wire form: one plain copy
                else:
                    dtype = data.dtype if data.dtype.byteorder != ">" else data.dtype.newbyteorder("<")
                    np.frombuffer(target, dtype=dtype, count=data.size)[...] = data.reshape(-1)
            else:
                target[:] = data
        return [start, start + self._total]


_PADDING = bytes(64)


def _wire_bytes(data: np.ndarray[Any, Any] | bytes | memoryview) -> bytes | memoryview:
    """A tensor's binary form as a flat byte buffer: the array's own memory when it is already in that form."""
    if not isinstance(data, np.ndarray):
        return data
    if not data.flags.c_contiguous or data.dtype.byteorder == ">":
        data = np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<"))
    return data.data.cast("B")


def read_tensor(
    consumer: Consumer, desc: TensorDesc, *, copy: bool, payload: memoryview | None = None
) -> np.ndarray[Any, Any]:
    """The tensor a descriptor names, as numpy: a view over the ring or the payload unless ``copy`` (BYTES are
    always copied)."""
    shape = desc["s"]
    count = math.prod(shape)
    datatype = desc["d"]
    length = desc["b"]
    offset = desc.get("p")
    if offset is None:
        raw = consumer.read(desc["o"], length)
    else:
        if payload is None or offset < 0 or length < 0 or offset + length > len(payload):
            raise ValueError(f"tensor '{desc['n']}' is outside the message's payload")
        raw = payload[offset : offset + length]
    if datatype == "BYTES":
        return deserialize_bytes(raw, count).reshape(shape)
    dtype = NUMPY_BY_DATATYPE.get(datatype)
    if dtype is None:
        raise ValueError(f"unknown datatype '{datatype}' for tensor '{desc['n']}'")
    if length != count * dtype.itemsize or count < 0:
        raise ValueError(f"tensor '{desc['n']}' holds {length} bytes, its shape needs {count * dtype.itemsize}")
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return array.copy() if copy else array


# --- the socket, blocking (the stub, and the daemon while it starts or stops a stub) ----------------------------


def socket_pair() -> tuple[socket.socket, socket.socket]:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (parent, child):
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, 4 * MAX_MESSAGE)
    return parent, child


# One encoder and decoder for every message: json.dumps and json.loads with options build new ones per call.
_encode_json = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
_raw_decode = json.JSONDecoder().raw_decode
_quote: Callable[[str], str] = json.encoder.encode_basestring_ascii
_NUL = b"\0"
_TRUNCATED = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)
_ANCILLARY_SIZE = socket.CMSG_SPACE(_MAX_FDS * _FD.size)
_fast_decode: Callable[[bytes | memoryview], Any] | None = None
_fast_encode: Callable[[Any], bytes] | None = None
try:
    import msgspec.json
except ImportError:
    pass
else:
    _fast_decode = msgspec.json.Decoder().decode
    _fast_encode = msgspec.json.Encoder().encode


def _response_json(response: ResponseMsg) -> str:
    """A response's JSON, written out directly for the common case (tensors only): the generic encoder costs
    more than the whole of this for these small, fixed shapes. Shapes, offsets and lengths are Python ints here,
    whose text (a list's included) is valid JSON."""
    if len(response) != 1 or "outputs" not in response:
        return _encode_json(response)
    parts = []
    for desc in response["outputs"]:
        name, datatype = _quote(desc["n"]), _quote(desc["d"])
        where = f'"p":{desc["p"]}' if "p" in desc else f'"o":{desc["o"]}'
        parts.append(f'{{"n":{name},"d":{datatype},"s":{desc["s"]},{where},"b":{desc["b"]}}}')
    return '{"outputs":[' + ",".join(parts) + "]}"


def _member_json(key: str, value: Any) -> str:
    if key == "blk":
        return f',"blk":[{int(value[0])},{int(value[1])}]'
    if key == "region":
        return f',"region":{int(value)}'
    return f",{_quote(key)}:{_encode_json(value)}"


def encode(message: dict[str, Any]) -> bytes:
    """A message's JSON (the stub's encoder; the daemon uses msgspec's)."""
    if message["t"] == "execute_done" and "responses" in message:
        responses = message["responses"]
        # Without a model's own parameters an answer holds strings and integers only, which msgspec writes as
        # the json module does (parameters may hold a float that is not finite, which the json module refuses).
        if _fast_encode is not None and not any("parameters" in response for response in responses):
            return _fast_encode(message)
        head = f'{{"t":"execute_done","batch":{int(message["batch"])},"responses":['
        body = ",".join([_response_json(response) for response in message["responses"]])
        rest = "".join([_member_json(key, value) for key, value in message.items() if key not in _DONE_KEYS])
        return (head + body + "]" + rest + "}").encode()
    return _encode_json(message).encode()


def decode(data: bytes | memoryview) -> dict[str, Any]:
    """A message's JSON (the stub's decoder; the daemon uses msgspec's). Raises ValueError when malformed."""
    if _fast_decode is not None:
        message = _fast_decode(data)  # its DecodeError is a ValueError
    else:
        text = str(data, "utf-8")
        message, end = _raw_decode(text)
        if end != len(text):
            raise ValueError("malformed message")
    if not isinstance(message, dict):
        raise ValueError("malformed message")
    return message


def pack(
    message: dict[str, Any],
    tensors: TensorWriter | None,
    producer: Producer,
    encode_json: Callable[[dict[str, Any]], bytes],
) -> tuple[list[bytes | memoryview], list[int] | None]:
    """The packet for a message, its tensors inside it or written into the ring, and the descriptors to send with
    it (a new region's, a duplicate the caller closes once sent). Raises ValueError when it is over the size limit,
    RingFull when the ring may not grow."""
    inline = None
    if tensors is not None:
        inline = tensors.inline()
        if inline is None:
            block = tensors.commit(producer)
            if block is not None:
                message["blk"] = block
    region = producer.pending_region()
    if region is not None:
        message["region"] = region[1]
    header = encode_json(message)
    packet: list[bytes | memoryview] = [header]
    size = len(header)
    if inline is not None:
        packet.append(_NUL)
        packet.extend(inline[0])
        size += 1 + inline[1]
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes is over the limit of {MAX_MESSAGE}")
    fds = None
    if region is not None:
        fds = [os.dup(region[0])]
        producer.region_sent()
    return packet, fds


def send(sock: socket.socket, packet: list[bytes | memoryview], fds: list[int] | None = None) -> None:
    """One packet: its parts go out as one message, without being joined first."""
    if fds:
        sock.sendmsg(packet, [(socket.SOL_SOCKET, socket.SCM_RIGHTS, b"".join(_FD.pack(fd) for fd in fds))])
    elif len(packet) == 1:
        sock.send(packet[0])
    else:
        sock.sendmsg(packet)


class Receiver:
    """Receives packets from one socket into a buffer allocated once, not one per message."""

    __slots__ = ("_buffer", "_buffers", "_sock", "_view")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray(MAX_MESSAGE + 1)
        self._buffers = [self._buffer]
        self._view = memoryview(self._buffer)

    def receive(self) -> tuple[memoryview, memoryview | None, list[int]]:
        """One packet, as its JSON and its payload (views that the next call overwrites), and the descriptors
        that came with it; the JSON is empty when the peer has gone. Raises BlockingIOError on a non-blocking
        socket with nothing to read, ValueError for a packet over the size limit."""
        size, ancillary, flags, _address = self._sock.recvmsg_into(self._buffers, _ANCILLARY_SIZE)
        fds: list[int] = []
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(data) - len(data) % _FD.size
                fds.extend(value for (value,) in _FD.iter_unpack(data[:usable]))
        if flags & _TRUNCATED or size > MAX_MESSAGE:
            for fd in fds:
                os.close(fd)
            raise ValueError(f"a message over the limit of {MAX_MESSAGE} bytes")
        end = self._buffer.find(0, 0, size)
        if end < 0:
            return self._view[:size], None, fds
        return self._view[:end], self._view[end + 1 : size], fds
