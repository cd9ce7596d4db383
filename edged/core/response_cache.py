"""Triton's response cache (``--cache-config local,size=BYTES`` and a model's ``response_cache { enable: true }``):
the responses of earlier requests, kept so that the same request again is answered without running the model.

One cache for the whole device, as Triton's ``local`` cache is shared by every model: bounded by the bytes it was
given, least recently used entries evicted first. A response larger than the whole cache is not kept. Each loaded
version of a model fills its own partition, dropped when that version is unloaded or replaced by a reload: a
reloaded model may answer differently, and an unloaded one must not hold memory a served one could use.

The key is what Triton's documentation says makes a request: the model's name and version and each input's name,
datatype, shape and bytes (Triton's own hash leaves out the datatype and shape, so that two inputs with the same
bytes in different shapes would share an entry; edged does not). The names of the outputs asked for are part of it
too: a model may compute only those, and its answer to one set of outputs is not an answer to another.

Entries hold copies of the outputs, made read-only: a cached response is answered many times and must stay what the
model returned. Everything here runs on the event loop.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from edged.core.request.inference import InferOutput, InferResponse
from edged.core.request.tensors import array_to_binary

if TYPE_CHECKING:
    from edged.core.request.inference import InferRequest, ParameterValue

# What an entry costs beyond its tensors' bytes (the key, the record, each output's name and shape), so that a flood
# of tiny responses is bounded as well as a few large ones.
ENTRY_OVERHEAD = 128
OUTPUT_OVERHEAD = 64


@dataclass(slots=True)
class _Entry:
    partition: int
    outputs: tuple[InferOutput, ...]
    parameters: dict[str, ParameterValue]
    size: int


@dataclass(slots=True)
class CacheCounts:
    """What Triton's device-wide ``nv_cache_*`` gauges report: every partition's lookups together."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    lookup_ns: int = 0
    insertion_ns: int = 0


@dataclass(slots=True)
class CachePartition:
    """The entries of one loaded version of a model; ``closed`` once it is dropped, after which nothing is kept."""

    id: int
    model: str
    version: int
    keys: set[bytes] = field(default_factory=set)
    closed: bool = False


class ResponseCache:
    """Responses by request, within ``size`` bytes, least recently used first out."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("the response cache needs a size of at least one byte")
        self.size = size
        self.bytes = 0
        self.counts = CacheCounts()
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._partitions: dict[int, CachePartition] = {}
        self._ids = itertools.count(1)

    @property
    def entry_count(self) -> int:
        return len(self._entries)

    def partition(self, model: str, version: int) -> CachePartition:
        """A fresh partition for a version that has just loaded."""
        part = CachePartition(next(self._ids), model, version)
        self._partitions[part.id] = part
        return part

    def drop(self, part: CachePartition) -> None:
        """Forget the partition's entries: its version is unloaded or replaced."""
        part.closed = True
        self._partitions.pop(part.id, None)
        for key in part.keys:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self.bytes -= entry.size
        part.keys.clear()

    def key(self, part: CachePartition, request: InferRequest) -> bytes:
        digest = hashlib.blake2b(digest_size=32)
        digest.update(part.id.to_bytes(8, "little"))
        _add_text(digest, part.model)
        digest.update(part.version.to_bytes(8, "little", signed=True))
        for tensor in sorted(request.inputs, key=lambda t: t.name):
            _add_text(digest, tensor.name)
            _add_text(digest, tensor.datatype)
            digest.update(len(tensor.shape).to_bytes(4, "little"))
            for dim in tensor.shape:
                digest.update(dim.to_bytes(8, "little", signed=True))
            data = b"" if tensor.data is None else array_to_binary(tensor.data, tensor.datatype)
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
        if request.outputs is None:
            digest.update(b"\x00")
        else:
            digest.update(b"\x01")
            for name in sorted({o.name for o in request.outputs}):
                _add_text(digest, name)
        return digest.digest()

    def lookup(self, key: bytes, request: InferRequest) -> InferResponse | None:
        """The stored response, as a new response to ``request``; None on a miss."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return InferResponse(
            request.model_name,
            str(request.model_version),
            request.id,
            # New records over the same read-only data: the answer marks outputs it writes to shared memory.
            [InferOutput(o.name, o.datatype, o.shape, o.data) for o in entry.outputs],
            dict(entry.parameters),
        )

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def insert(self, part: CachePartition, key: bytes, response: InferResponse) -> bool:
        """Keep a copy of ``response`` under ``key``, evicting the least recently used entries to make room; False
        when it is not kept (already there, larger than the whole cache, or its partition already dropped)."""
        if part.closed or key in self._entries:
            return False
        outputs = tuple(_frozen(output) for output in response.outputs)
        size = ENTRY_OVERHEAD + sum(OUTPUT_OVERHEAD + _nbytes(o) for o in outputs)
        if size > self.size:
            return False
        while self.bytes + size > self.size and self._entries:
            old_key, old = self._entries.popitem(last=False)
            self.bytes -= old.size
            self.counts.evictions += 1
            owner = self._partitions.get(old.partition)
            if owner is not None:
                owner.keys.discard(old_key)
        self._entries[key] = _Entry(part.id, outputs, dict(response.parameters), size)
        part.keys.add(key)
        self.bytes += size
        return True


def _add_text(digest: hashlib.blake2b, text: str) -> None:
    raw = text.encode()
    digest.update(len(raw).to_bytes(4, "little"))
    digest.update(raw)


def _frozen(output: InferOutput) -> InferOutput:
    data = np.array(output.data, copy=True)
    data.setflags(write=False)
    return InferOutput(output.name, output.datatype, tuple(output.shape), data)


def _nbytes(output: InferOutput) -> int:
    if output.datatype == "BYTES":
        return sum(4 + len(item) for item in output.data.ravel())
    return int(output.data.nbytes)
