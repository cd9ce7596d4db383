"""The life cycle every backend implements: auto-complete a config, load a version, execute, unload.

Ownership and threads: the core loads and unloads from a worker thread, and calls ``execute`` on one instance
from at most one thread at a time (the scheduler hands an instance to one batch at a time), so instances need no
locks of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from edged.core.inference import InferRequest, InferResponse
    from edged.core.stats import ExecutionTiming
    from edged.errors import EdgedError
    from edged.proto.model_config_pb2 import ModelConfig


@dataclass(frozen=True, slots=True)
class LoadContext:
    """What a backend needs to load one model version."""

    model_name: str
    version: int
    model_dir: Path
    version_dir: Path
    model_file: Path


class BackendInstance(Protocol):
    """One copy of a model on one device; executes one batch at a time."""

    @property
    def name(self) -> str: ...

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        """One response (or error) per request, in the same order; fills ``timing`` for the statistics."""
        ...


class BackendModel(Protocol):
    """A loaded model version: its instances, and how to release them."""

    @property
    def instances(self) -> Sequence[BackendInstance]: ...

    def unload(self) -> None: ...


class Backend(Protocol):
    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        """Fill what config.pbtxt leaves out (inputs, outputs, max_batch_size) from the model itself."""
        ...

    def load(self, config: ModelConfig, context: LoadContext) -> BackendModel: ...
