"""Backends compute: each one loads a model version into instances and executes batches of requests.

``BackendRegistry`` is the daemon's set of them (edged.core.backend_api.Backends, as the core sees it). Backends are
imported lazily by name, so a device without a backend's runtime still serves every other model; each is built
with its ``--backend-config`` settings and the server its models may call.

Third-party backends: an installed distribution that declares an entry point in the ``edged.backends`` group names
a Backend class (edged.core.backend_api.Backend), built as edged's own are, for the models whose config.pbtxt
gives that name as ``backend``::

    [project.entry-points."edged.backends"]
    rbln = "edged_backend_rbln:RblnBackend"

The backends edged provides keep their names: an entry point under one of them is ignored. packaging/backend-example
is a complete one.

A Python-based backend (``<--backend-directory>/<name>/model.py``, as Triton has them) serves the models whose
config names ``<name>``, through the Python backend (edged.backends.python_based); it is looked for after edged's
own backends and before installed packages.

A framework backend given ``--backend-config <name>,isolation=process`` is built as edged.backends.isolation's
IsolatedBackend over the Python backend: its models run in a process per instance.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from edged.backends.python_based import PythonBasedBackend, python_based_file
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from pathlib import Path

    from edged.core.backend_api import Backend, CustomMetricFamily, ServerApi

log = logging.getLogger(__name__)

# ONNX Runtime's Linux builds keep a telemetry store (a device id and an event database) under
# $HOME/.cache/Microsoft, which for the service is its state directory; an appliance records and sends nothing it
# was not asked to. Set before any backend imports ONNX Runtime (ours, OpenVINO's, a model.py's in a stub process,
# which inherits it); an operator who sets the variable keeps their value.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

PLUGIN_GROUP = "edged.backends"

# backend name (config.pbtxt `backend`) -> "module:attribute" of its Backend class
_BACKENDS: dict[str, str] = {
    "onnxruntime": "edged.backends.onnxruntime:OnnxRuntimeBackend",
    "python": "edged.backends.python.backend:PythonBackend",
    "fil": "edged.backends.fil:FilBackend",
    "pytorch": "edged.backends.pytorch:PyTorchBackend",
    "openvino": "edged.backends.openvino:OpenVinoBackend",
    "tensorflow": "edged.backends.tensorflow:TensorFlowBackend",
    "tensorrt": "edged.backends.tensorrt:TensorRtBackend",
    # Not a backend in Triton's sense (a scheduler over other models, in the core), but loaded the same way.
    "ensemble": "edged.core.scheduling.ensemble:EnsembleBackend",
}


class BackendRegistry:
    """The backends of one server. ``backend_config``: the ``--backend-config`` settings by backend name ("" for
    the global ones); ``host``: the server, for backends whose models call other models (None outside the daemon,
    as in ``edged check-repo``)."""

    def __init__(
        self,
        backend_config: dict[str, dict[str, str]],
        host: ServerApi | None = None,
        backend_directory: Path | None = None,
    ) -> None:
        self._config = {name: dict(values) for name, values in backend_config.items()}
        self._host = host
        # --backend-directory: where Python-based backends (<name>/model.py) are found (edged.backends.python_based).
        self._directory = backend_directory
        self._loaded: dict[str, Backend] = {}
        # Models load on several threads at once; two first models of one backend must get the same backend (a
        # second one would hold, say, the metric families of the models loaded through it where no scrape sees them).
        self._lock = threading.Lock()

    def attach(self, host: ServerApi) -> None:
        """Give the backends the server their models may call. The server is built on the manager, which is built on
        this registry, so the daemon attaches it once both exist, before the first model loads."""
        if self._loaded:
            raise RuntimeError("the server must be attached before any backend is built")
        self._host = host

    def settings(self, name: str) -> dict[str, str]:
        """The ``--backend-config=<name>,<key>=<value>`` settings of one backend, over the global ones."""
        return {**self._config.get("", {}), **self._config.get(name, {})}

    def get(self, name: str) -> Backend:
        loaded = self._loaded.get(name)
        if loaded is not None:
            return loaded
        with self._lock:
            return self._build(name)

    def _build(self, name: str) -> Backend:
        loaded = self._loaded.get(name)
        if loaded is not None:
            return loaded
        settings = self.settings(name)
        if "isolation" in self._config.get(name, {}):
            from edged.backends.isolation import IsolatedBackend, isolation_of

            if isolation_of(name, self._config[name]):
                from edged.backends.python.backend import PythonBackend

                python = self._build("python")
                assert isinstance(python, PythonBackend)
                self._loaded[name] = IsolatedBackend(name, python)
                return self._loaded[name]
        target = _BACKENDS.get(name)
        python_based = python_based_file(self._directory, name) if target is None else None
        if python_based is not None:
            self._loaded[name] = PythonBasedBackend(self._build("python"), python_based)
            return self._loaded[name]
        if target is not None:
            module_name, attribute = target.split(":")
            backend_class = getattr(importlib.import_module(module_name), attribute)
        else:
            backend_class = _plugin(name)
        try:
            backend: Backend = backend_class(settings, self._host)
        except EdgedError:
            raise
        except Exception as exc:
            log.debug("the '%s' backend failed to start", name, exc_info=True)
            raise EdgedError(ErrorCode.INTERNAL, f"the '{name}' backend failed to start: {exc!r}") from None
        self._loaded[name] = backend
        return backend

    def custom_metrics(self) -> list[CustomMetricFamily]:
        """The metric families that models created, from every backend loaded so far that keeps any."""
        families: list[CustomMetricFamily] = []
        for backend in list(self._loaded.values()):
            snapshot = getattr(backend, "custom_metrics", None)
            if snapshot is not None:
                families.extend(snapshot())
        return families


def _plugin(name: str) -> Any:
    """The Backend class an installed distribution registers under ``name``; UNSUPPORTED when none does, INTERNAL
    (with the distribution and the error, the traceback in the log) when it cannot be imported."""
    found = entry_points(group=PLUGIN_GROUP, name=name)
    if not found:
        raise EdgedError(
            ErrorCode.UNSUPPORTED,
            f"unable to find backend '{name}': edged does not provide the '{name}' backend and no installed package "
            f"registers it (in the '{PLUGIN_GROUP}' entry point group)",
        )
    entry = next(iter(found))
    package = entry.dist.name if entry.dist is not None else "an unnamed package"
    try:
        return entry.load()
    except Exception as exc:  # whatever a third party's import raises, the daemon goes on
        # The traceback is the package's maker's to read: at debug level (--log-verbose=1); the reason is the model's.
        log.debug("the '%s' backend of %s failed to import", name, package, exc_info=True)
        raise EdgedError(
            ErrorCode.INTERNAL, f"the '{name}' backend of {package} failed to import: {type(exc).__name__}: {exc}"
        ) from None
