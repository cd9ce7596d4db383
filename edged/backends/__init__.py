"""Backends compute: each one loads a model version into instances and executes batches of requests.

Backends are imported lazily by name, so a device without a backend's runtime still serves every other model.
``configure`` gives them the daemon's ``--backend-config`` settings and the server they may call; the daemon
calls it once, before the first model loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.backends.base import Backend, CustomMetricFamily, ServerApi

# backend name (config.pbtxt `backend`) -> "module:attribute" of its Backend class
_BACKENDS: dict[str, str] = {
    "onnxruntime": "edged.backends.onnxruntime:OnnxRuntimeBackend",
    "python": "edged.backends.python.backend:PythonBackend",
    # Not a backend in Triton's sense (its models are other models), but loaded the same way.
    "ensemble": "edged.backends.ensemble:EnsembleBackend",
}
_loaded: dict[str, Backend] = {}
_settings: dict[str, dict[str, str]] = {}
_host: list[ServerApi] = []  # the one server, once configured


def configure(backend_config: dict[str, dict[str, str]], host: ServerApi | None = None) -> None:
    """``backend_config``: the ``--backend-config`` settings by backend name ("" for global ones)."""
    _settings.clear()
    _settings.update({name: dict(values) for name, values in backend_config.items()})
    _host[:] = [host] if host is not None else []


def backend_settings(name: str) -> dict[str, str]:
    """The ``--backend-config=<name>,<key>=<value>`` settings of one backend, over the global ones."""
    return {**_settings.get("", {}), **_settings.get(name, {})}


def host() -> ServerApi | None:
    """The server, for backends whose models call other models; None outside the daemon (check-repo)."""
    return _host[0] if _host else None


def get_backend(name: str) -> Backend:
    backend = _loaded.get(name)
    if backend is not None:
        return backend
    target = _BACKENDS.get(name)
    if target is None:
        raise EdgedError(
            ErrorCode.UNSUPPORTED, f"unable to find backend '{name}': edged does not provide the '{name}' backend"
        )
    module_name, attribute = target.split(":")
    backend_class: type[Backend] = getattr(importlib.import_module(module_name), attribute)
    backend = backend_class()
    _loaded[name] = backend
    return backend


def custom_metrics() -> list[CustomMetricFamily]:
    """The metric families that models created, from every backend loaded so far that keeps any."""
    families: list[CustomMetricFamily] = []
    for backend in list(_loaded.values()):
        snapshot = getattr(backend, "custom_metrics", None)
        if snapshot is not None:
            families.extend(snapshot())
    return families
