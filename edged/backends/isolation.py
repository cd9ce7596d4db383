"""Framework backends in a process of their own per instance (``--backend-config <backend>,isolation=process``).

A crash inside a framework (a segfault in a TorchScript operator, an abort in a TensorFlow kernel) takes down the
process it runs in. Isolated, a framework model runs as a Python-backend model whose ``model.py`` is
edged.backends.isolated_model: each instance is a stub process that loads the model with the same framework backend
and executes each batch there, so a crash ends that instance's process, its requests fail with the stub's error,
and the daemon and every other model keep serving. The supervision, the shared-memory transport, statistics and
restarts are the Python backend's.

What it costs (README, "Backends"): the stub hop per execution, nothing measurable for a model whose batch runs
for milliseconds, and about a tenth of the throughput for a tree model at one row per request; a process per
instance with the framework loaded in it, in place of the framework in the daemon.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Final

from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.backends.python.backend import PythonBackend, PythonModel
    from edged.core.backend_api import LoadContext
    from edged.proto.model_config_pb2 import ModelConfig

SETTING: Final = "isolation"
# The backends that may run isolated: the frameworks. The ONNX Runtime and Python backends are excluded: the first is
# the daemon's own (in the .deb, tested in the daemon), the second isolated already.
ISOLATABLE: Final = frozenset({"fil", "pytorch", "openvino", "tensorflow", "tensorrt"})
# The model.py every isolated instance runs, and the parameters by which the daemon tells it what to load.
RUNNER: Final = Path(__file__).with_name("isolated_model.py")
BACKEND: Final = "__edged_isolated_backend"
MODEL_FILE: Final = "__edged_isolated_model_file"
VERSION_DIR: Final = "__edged_isolated_version_dir"
DEFAULT_MAX_BATCH_SIZE: Final = "__edged_isolated_default_max_batch_size"
MARKS: Final = (BACKEND, MODEL_FILE, VERSION_DIR, DEFAULT_MAX_BATCH_SIZE)


def isolation_of(name: str, settings: dict[str, str]) -> bool:
    """Whether ``--backend-config <name>,isolation=...`` (``settings``: that backend's own, not the global ones)
    asks for backend ``name`` to run isolated; refuses what it cannot mean."""
    value = settings.get(SETTING, "none")
    if value not in ("none", "process"):
        raise EdgedError(
            ErrorCode.INVALID_ARG, f"--backend-config {name},{SETTING}={value}: the value must be 'none' or 'process'"
        )
    if value == "process" and name not in ISOLATABLE:
        raise EdgedError(
            ErrorCode.INVALID_ARG,
            f"--backend-config {name},{SETTING}=process: only the framework backends ({', '.join(sorted(ISOLATABLE))}) "
            "run isolated",
        )
    return value == "process"


class IsolatedBackend:
    """Backend ``name`` run through the Python backend (edged.core.backend_api.Backend)."""

    def __init__(self, name: str, python: PythonBackend) -> None:
        self._name = name
        self._python = python

    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        if config.input and config.output:
            # Nothing to fill (every framework backend leaves such a config as it is): the checks its auto-complete
            # makes run in each instance's process before the load, which saves a throw-away process that would
            # import the framework for nothing.
            return
        marked = self._marked(config, context, default_max_batch_size)
        self._python.auto_complete_config(
            marked, dataclasses.replace(context, model_file=RUNNER), default_max_batch_size
        )
        for key in MARKS:
            if key in marked.parameters:
                del marked.parameters[key]
        config.CopyFrom(marked)

    def load(self, config: ModelConfig, context: LoadContext) -> PythonModel:
        if not context.model_file.exists():
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"model '{config.name}': no model file {context.model_file.name} in its version folder",
            )
        marked = self._marked(config, context, 0)
        return self._python.load(marked, dataclasses.replace(context, model_file=RUNNER))

    def _marked(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> ModelConfig:
        marked = type(config)()
        marked.CopyFrom(config)
        marked.parameters[BACKEND].string_value = self._name
        marked.parameters[MODEL_FILE].string_value = str(context.model_file)
        # Not always the model file's folder: a backend without a default file name (fil) gets the folder itself.
        marked.parameters[VERSION_DIR].string_value = str(context.version_dir)
        marked.parameters[DEFAULT_MAX_BATCH_SIZE].string_value = str(default_max_batch_size)
        return marked
