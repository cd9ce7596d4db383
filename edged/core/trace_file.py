"""Traces in Triton's JSON trace format, and the file they are written to.

A ``Trace`` is one sampled request and the requests it spawns (ensemble steps, BLS calls that pass its trace):
each has its own id, the children name their parent's. What it records is kept as JSON text objects, one per
timestamp, model or tensor, as Triton writes them, and handed to its setting (``TraceSink``) when the last of
them ends; the setting writes them out every ``log_frequency`` traces (into ``FILE.N``), or, with 0, into FILE
itself when it is replaced or the server stops. What is held is bounded: the objects of one trace, the bytes a
setting buffers (written out early past the bound), and the bytes written to one file's name (then traces are
dropped, and the log says so once).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy as np

    from edged.core.request.inference import InferRequest

log = logging.getLogger(__name__)

LEVEL_TIMESTAMPS: Final = 1
LEVEL_TENSORS: Final = 2
# Bounds on what a client can make the daemon hold or write by tracing.
MAX_TRACE_PARTS: Final = 4096  # objects of one trace, its children's included
MAX_TENSOR_VALUES: Final = 65536  # values of one tensor written at TENSORS level (the rest are left out)
MAX_CHILDREN: Final = 256  # child traces of one trace
MAX_BUFFERED_BYTES: Final = 8 * 1024 * 1024  # one setting's traces not yet written
MAX_FILE_BYTES: Final = 512 * 1024 * 1024  # all that is written under one file name (FILE and FILE.N)


class LiveTraces:
    """How many sampled traces are in flight in this process: the schedulers stamp compute times only then."""

    __slots__ = ("count", "traces")

    def __init__(self) -> None:
        self.count = 0
        # Traces in flight by id, for a BLS call that names the trace of the request it serves.
        self.traces: dict[int, Trace] = {}


LIVE: Final = LiveTraces()


class TraceFile:
    """One trace file name: FILE, a JSON array kept valid after every write, and FILE.0, FILE.1, ..."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._index = 0
        self._started = False
        self._written = 0
        self._full = False
        self._lock = threading.Lock()

    def save(self, parts: list[str], indexed: bool) -> None:
        if not self.name or not parts:
            return
        text = ",".join(parts)
        with self._lock:
            if self._written + len(text) + 2 > MAX_FILE_BYTES:
                if not self._full:
                    self._full = True
                    log.warning("trace file %s reached %d bytes: further traces are dropped", self.name, MAX_FILE_BYTES)
                return
            self._written += len(text) + 2
            try:
                if indexed:
                    path = f"{self.name}.{self._index}"
                    self._index += 1
                    with open(path, "w", encoding="utf-8") as out:
                        out.write("[" + text + "]")
                elif not self._started:
                    with open(self.name, "w", encoding="utf-8") as out:
                        out.write("[" + text + "]")
                    self._started = True
                else:
                    # Over the closing bracket: the file stays one valid JSON array between writes.
                    with open(self.name, "r+", encoding="utf-8") as out:
                        out.seek(0, os.SEEK_END)
                        out.seek(out.tell() - 1)
                        out.write("," + text + "]")
            except OSError as exc:
                log.error("failed creating trace file: %s", exc)

    def close(self) -> None:
        """Nothing to finish: the file is complete after every write."""


class TraceSink:
    """Where a setting's finished traces go: buffered, then written as ``log_frequency`` says."""

    def __init__(self, file: TraceFile, log_frequency: int) -> None:
        self.file = file
        self.log_frequency = log_frequency
        self._buffer: list[str] = []
        self._buffered = 0
        self._in_stream = 0
        # Every request the setting saw (traced or not), as Triton counts them.
        self.requests_seen = 0
        self._collected = 0
        self.last_batch = False
        self.live = 0
        self.retired = False
        self._sink_lock = threading.Lock()

    def write(self, parts: list[str]) -> None:
        """A finished trace's objects."""
        with self._sink_lock:
            self.live -= 1
            self._buffer.extend(parts)
            self._buffered += sum(map(len, parts))
            self._in_stream += 1
            self._collected += 1
            # Triton writes FILE.N once the count is spent and every trace sampled is written, or every
            # log_frequency traces.
            spent = self.last_batch and self._collected == self.requests_seen
            frequent = self.log_frequency != 0 and self._in_stream >= self.log_frequency
            if spent or frequent:
                self._flush(indexed=True)
            elif self._buffered > MAX_BUFFERED_BYTES or (self.retired and self.live == 0):
                self._flush(indexed=self.log_frequency != 0)

    def retire(self) -> None:
        """Replaced by a newer setting (or the server stops): write what is left once the last trace is in."""
        with self._sink_lock:
            self.retired = True
            if self.live == 0:
                self._flush(indexed=self.log_frequency != 0)

    def _flush(self, indexed: bool) -> None:
        parts, self._buffer, self._buffered, self._in_stream = self._buffer, [], 0, 0
        self.file.save(parts, indexed)


class Trace:
    """A sampled request, or a request it spawned (``parent_id`` not 0), and what is recorded of it."""

    __slots__ = (
        "_children",
        "_closed",
        "_next_id",
        "_open",
        "_parts",
        "_size",
        "id",
        "level",
        "parent_id",
        "root",
        "sink",
    )

    def __init__(
        self, trace_id: int, parent_id: int, sink: TraceSink, level: int, next_id: Callable[[], int], root: Any = None
    ) -> None:
        self.id = trace_id
        self.parent_id = parent_id
        self.sink = sink
        self.level = level
        self._next_id = next_id
        self._parts: list[str] = []
        self.root: Trace = root if root is not None else self
        self._children: list[Trace] = []
        self._open = 1
        self._closed = False
        self._size = 0  # the objects of the trace and its children (kept on the root)
        LIVE.traces[trace_id] = self
        if root is None:
            LIVE.count += 1
            with sink._sink_lock:
                sink.live += 1

    def _add(self, text: str) -> None:
        root = self.root
        if root._size < MAX_TRACE_PARTS:
            root._size += 1
            self._parts.append(text)

    def stamp(self, name: str, ns: int | None = None) -> None:
        if self.level & LEVEL_TIMESTAMPS:
            at = time.monotonic_ns() if ns is None else ns
            self._add(f'{{"id":{self.id},"timestamps":[{{"name":"{name}","ns":{at}}}]}}')

    def request_start(self, model: str, version: int, request_id: str, ns: int) -> None:
        """The core accepted the request: what Triton records at REQUEST_START (and QUEUE_START)."""
        if not self.level & LEVEL_TIMESTAMPS:
            return
        fields: dict[str, Any] = {"id": self.id, "model_name": model, "model_version": version}
        if request_id:
            fields["request_id"] = request_id
        if self.parent_id:
            fields["parent_id"] = self.parent_id
        self._add(json.dumps(fields, separators=(",", ":")))
        self.stamp("REQUEST_START", ns)
        self.stamp("QUEUE_START")

    def accepted(self, request: InferRequest) -> None:
        """The core accepted the request (validated, its version chosen)."""
        self.request_start(request.model_name, request.model_version, request.id, request.arrival_ns)
        if self.level & LEVEL_TENSORS:
            self.tensors("TENSOR_QUEUE_INPUT", [(t.name, t.datatype, t.shape, t.data) for t in request.inputs])

    def request_end(self) -> None:
        """The core is done with the request; a child trace ends here, the frontend ends the one it sampled."""
        if self.parent_id == 0:
            self.stamp("INFER_RESPONSE_COMPLETE")
        self.stamp("REQUEST_END")
        if self.parent_id != 0:
            self.close()

    def compute(self, start: int, end: int, input_ns: int, output_ns: int, response: object) -> None:
        """One execution of the request by a backend: Triton's COMPUTE timestamps, and its outputs (TENSORS)."""
        input_end = min(start + input_ns, end)
        output_start = max(end - output_ns, input_end)
        self.stamp("COMPUTE_START", start)
        self.stamp("COMPUTE_INPUT_END", input_end)
        self.stamp("COMPUTE_OUTPUT_START", output_start)
        self.stamp("COMPUTE_END", end)
        outputs = getattr(response, "outputs", None)
        if self.level & LEVEL_TENSORS and outputs is not None:
            self.tensors("TENSOR_BACKEND_OUTPUT", [(o.name, o.datatype, o.shape, o.data) for o in outputs])

    def tensors(
        self, activity: str, tensors: Sequence[tuple[str, str, tuple[int, ...], np.ndarray[Any, Any] | None]]
    ) -> None:
        """TENSORS level: each tensor's values, as Triton writes them (comma-separated text)."""
        if not self.level & LEVEL_TENSORS:
            return
        for name, datatype, shape, data in tensors:
            tensor = {
                "name": name,
                "data": _values(datatype, data),
                "shape": ",".join(map(str, shape)),
                "dtype": datatype,
            }
            self._add(json.dumps({"id": self.id, "activity": activity, "tensor": tensor}, separators=(",", ":")))

    def child(self) -> Trace | None:
        """A trace for a request this one spawns; None past the bound on children."""
        root = self.root
        if len(root._children) >= MAX_CHILDREN or root._open <= 0:
            return None
        child = Trace(self._next_id(), self.id, self.sink, self.level, self._next_id, root)
        root._children.append(child)
        root._open += 1
        return child

    def close(self) -> None:
        """This request ended (a second call does nothing); the last of a trace and its children to end writes
        them all."""
        if self._closed:
            return
        self._closed = True
        LIVE.traces.pop(self.id, None)
        root = self.root
        root._open -= 1
        if root._open == 0:
            LIVE.count -= 1
            parts = list(root._parts)
            for child in root._children:
                parts.extend(child._parts)
            root.sink.write(parts)


def _values(datatype: str, data: np.ndarray[Any, Any] | None) -> str:
    if data is None:
        return ""
    flat = data.reshape(-1)[:MAX_TENSOR_VALUES]
    if datatype == "BYTES":
        return ",".join(
            '\\"' + (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)) + '\\"' for v in flat
        )
    if datatype in ("FP16", "BF16"):
        return ""  # Triton leaves these out too
    if datatype == "BOOL":
        return ",".join("1" if v else "0" for v in flat)
    if datatype in ("FP32", "FP64"):
        return ",".join(f"{float(v):g}" for v in flat)
    return ",".join(str(int(v)) for v in flat)
