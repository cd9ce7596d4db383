"""Python-based backends, as Triton has them: a folder ``<backend-directory>/<name>/`` holding a ``model.py`` is a
backend named ``<name>``, written in Python. Every model whose config says ``backend: "<name>"`` runs that model.py
through the Python backend (its stub, pb_utils, instances), with the model's own folder and version as its
``args``; the model's version folders need not hold any file."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edged.core.backend_api import Backend, BackendModel, LoadContext
    from edged.proto.model_config_pb2 import ModelConfig

MODEL_FILE = "model.py"


def python_based_file(directory: Path | None, name: str) -> Path | None:
    """The model.py of the Python-based backend ``name`` in ``directory``, or None when there is none."""
    if directory is None or not name or "/" in name or name in {".", ".."}:
        return None
    candidate = directory / name / MODEL_FILE
    return candidate if candidate.is_file() else None


class PythonBasedBackend:
    """One Python-based backend: the Python backend, given the backend's model.py for each model it loads."""

    def __init__(self, python: Backend, model_file: Path) -> None:
        self._python = python
        self._model_file = model_file

    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        self._python.auto_complete_config(config, self._context(context), default_max_batch_size)

    def load(self, config: ModelConfig, context: LoadContext) -> BackendModel:
        return self._python.load(config, self._context(context))

    def _context(self, context: LoadContext) -> LoadContext:
        return dataclasses.replace(context, model_file=self._model_file)
