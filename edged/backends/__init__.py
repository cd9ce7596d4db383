"""Backends compute: each one loads a model version into instances and executes batches of requests.

Backends are imported lazily by name, so a device without a backend's runtime still serves every other model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.backends.base import Backend

# backend name (config.pbtxt `backend`) -> "module:attribute" of its Backend class
_BACKENDS: dict[str, str] = {
    "onnxruntime": "edged.backends.onnxruntime:OnnxRuntimeBackend",
}
_loaded: dict[str, Backend] = {}


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
