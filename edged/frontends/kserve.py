"""What the HTTP and gRPC wires both answer, written once: the KServe v2 documents (model metadata, statistics,
the repository index) as plain values, the logging extension's update in Triton's order, and the overrides a load
request carries.

The documents are dicts in the JSON shape of Triton's HTTP API, with every member Triton's gRPC messages have under
the same name, so HTTP encodes them as they are and gRPC builds its protobuf messages from them (protobuf fills a
message from such a dict). What differs between the wires (a type check's wording, a status code) stays in each
wire's package.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from edged import logs
from edged.core.access import ACTOR
from edged.errors import EdgedError, unsupported

if TYPE_CHECKING:
    from edged.core.repository.manager import IndexEntry
    from edged.core.service import ModelMetadata
    from edged.core.stats import BatchStatistics, Duration, ModelStatistics

log = logging.getLogger(__name__)


def model_metadata(meta: ModelMetadata) -> dict[str, Any]:
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.inputs],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in meta.outputs],
    }


def model_statistics(stats: list[ModelStatistics]) -> list[dict[str, Any]]:
    """The ``model_stats`` entries; perf_analyzer reads every ``inference_stats`` member, so all eight are there."""
    return [
        {
            "name": s.name,
            "version": str(s.version),
            "last_inference": s.last_inference,
            "inference_count": s.inference_count,
            "execution_count": s.execution_count,
            "inference_stats": {
                "success": _duration(s.success),
                "fail": _duration(s.fail),
                "queue": _duration(s.queue),
                "compute_input": _duration(s.compute_input),
                "compute_infer": _duration(s.compute_infer),
                "compute_output": _duration(s.compute_output),
                "cache_hit": _duration(s.cache_hit),
                "cache_miss": _duration(s.cache_miss),
            },
            "response_stats": {},
            "batch_stats": [_batch(b) for _, b in sorted(s.batch_stats.items())],
            "memory_usage": [],
        }
        for s in stats
    ]


def repository_index(entries: list[IndexEntry]) -> list[dict[str, str]]:
    """The index entries; a model never loaded is ``{"name"}`` alone, as Triton lists it."""
    documents = []
    for entry in entries:
        document = {"name": entry.name}
        for key in ("version", "state", "reason"):
            if value := getattr(entry, key):
                document[key] = value
        documents.append(document)
    return documents


def log_settings() -> dict[str, Any]:
    settings = logs.current()
    return {
        "log_file": settings.log_file,
        "log_info": settings.log_info,
        "log_warning": settings.log_warning,
        "log_error": settings.log_error,
        "log_verbose_level": settings.log_verbose_level,
        "log_format": settings.log_format,
    }


class LogSettingsRequest(Protocol):
    """One wire's log settings request: which keys it sets, and each value read as the type the key needs (raising
    that wire's error for a value of another type)."""

    def sets(self, key: str) -> bool: ...

    def boolean(self, key: str) -> bool: ...

    def unsigned(self, key: str) -> int: ...

    def string(self, key: str) -> str: ...

    def bad_format(self, text: str) -> EdgedError:
        """The error for a log_format that is no format (Triton answers it differently on each wire)."""
        ...


def update_log_settings(request: LogSettingsRequest, wire: str) -> None:
    """Triton's order: log_file refuses the whole request; then each setting in turn is checked and applied, so one
    that fails leaves those before it applied. Keys the request does not set are left alone."""
    if request.sets("log_file"):
        # A remote client must never choose a path the daemon writes to.
        raise unsupported("log file location can not be updated through network protocol")
    changed: dict[str, Any] = {}
    try:
        for key in logs.TOGGLES:
            if request.sets(key):
                value = request.boolean(key)
                changed[key] = value
                logs.toggle(key, value)
        if request.sets("log_verbose_level"):
            level = request.unsigned("log_verbose_level")
            changed["log_verbose_level"] = logs.update(log_verbose_level=level).log_verbose_level
        if request.sets("log_format"):
            text = request.string("log_format")
            log_format = logs.log_format(text)
            if log_format is None:
                raise request.bad_format(text)
            changed["log_format"] = logs.update(log_format=log_format).log_format
    finally:
        if changed:
            settings = ", ".join(f"{k}={v}" for k, v in changed.items())
            log.info("log settings changed over %s by %s: %s", wire, ACTOR.get() or "anonymous", settings)


class LoadParameters(Protocol):
    """One wire's load request parameters: their keys, and the two kinds read as the wire carries them (raising
    that wire's error for a value of another type)."""

    def names(self) -> list[str]: ...

    def config(self, key: str) -> str: ...

    def file(self, key: str) -> bytes: ...


def load_overrides(parameters: LoadParameters) -> tuple[str | None, dict[str, bytes]]:
    """The ``config`` override (JSON text) and the ``file:<version>/<path>`` contents of a load request, by path;
    other keys are ignored, as Triton ignores them."""
    config: str | None = None
    files: dict[str, bytes] = {}
    for key in parameters.names():
        if key == "config":
            config = parameters.config(key)
        elif key.startswith("file:"):
            files[key.removeprefix("file:")] = parameters.file(key)
    return config, files


def _duration(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def _batch(b: BatchStatistics) -> dict[str, Any]:
    return {
        "batch_size": b.batch_size,
        "compute_input": _duration(b.compute_input),
        "compute_infer": _duration(b.compute_infer),
        "compute_output": _duration(b.compute_output),
    }
