"""The memory of a model whose instances run in processes of their own (the Python backend's stub processes, and
a framework model run isolated, edged.backends.isolation): each instance process's resident set (RSS), with any
process it started, and the model's sum. A model served inside the daemon (ONNX Runtime, a framework not isolated)
has no memory of its own that can be told apart from the daemon's: it has no instance processes here, and its
memory is in edged's own figure (edged.core.processes).

The processes come from the backend: a loaded model may offer ``instance_processes()`` (edged.core.backend_api.
BackendModel). Read on request, from ``/proc`` (a few short reads per instance).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edged.core.processes import PROC, tree_memory
from edged.core.repository.manager import ModelState

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edged.core.repository.manager import ModelRepositoryManager


@dataclass(frozen=True, slots=True)
class InstanceMemory:
    version: int
    instance: str  # Triton's instance name, e.g. "add_sub_0"
    pid: int
    rss_bytes: int | None  # None: the process ended since it was listed (a restart under way)


@dataclass(frozen=True, slots=True)
class ModelMemory:
    model: str
    instances: tuple[InstanceMemory, ...]  # empty: no READY version runs in processes of its own
    serving: bool  # a version is READY

    @property
    def in_processes(self) -> bool:
        """Whether the model's instances run in processes of their own (else its memory is the daemon's)."""
        return bool(self.instances)

    @property
    def rss_bytes(self) -> int | None:
        """The instance processes' sum; None when none could be read."""
        known = [instance.rss_bytes for instance in self.instances if instance.rss_bytes is not None]
        return sum(known) if known else None


def model_memory(manager: ModelRepositoryManager, name: str, proc: Path = PROC) -> ModelMemory:
    """The instance processes of every READY version of ``name`` and their memory now."""
    entry = manager.entry(name)
    found: list[InstanceMemory] = []
    serving = False
    for number, version in sorted(entry.versions.items()) if entry is not None else ():
        if version.state is not ModelState.READY or version.backend_model is None:
            continue
        serving = True
        # Optional in the backend protocol: only backends with instance processes have it.
        listed = getattr(version.backend_model, "instance_processes", None)
        processes: Sequence[tuple[str, int]] = listed() if listed is not None else ()
        found.extend(InstanceMemory(number, instance, pid, tree_memory(pid, proc)) for instance, pid in processes)
    return ModelMemory(name, tuple(found), serving)
