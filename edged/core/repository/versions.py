"""Which versions of a model serve, when an operator chooses: activating one, and rolling back (explicit mode).

``activate(name, version)`` serves exactly that version. It loads through model control, so it loads beside the
version serving and takes requests once READY, and the one it replaces retires only then: a client that names no
version sees no failure. The activation pins the model to that version: the loads that are not a request's own (a
restart, a sync's refresh) serve it again, and explicit mode's desired set keeps it with its version, so a restart
comes back serving it. A request's plain load (``POST /v2/repository/models/{name}/load``, an upload loaded with
``activate``) re-reads the repository, as Triton's does: it drops the pin and serves what the config's
version_policy selects. An unload drops the desired set's pin (a later load or activation sets anew what serves).

``rollback(name)`` activates the versions that served before the last change of the served versions: an
activation, a rollback, or a load (an upload, a sync) that brought a new version. Each such change is recorded in
the model history as a model-level event (ACTIVATED, ROLLED_BACK or SERVING) whose reason ends ``(was 1, 2)``:
"previous" is read from that record, so it survives a restart; within one run it is also kept here. A rollback is
itself a change, so a second rollback goes forward again. A model's first load (nothing served before) is no
change to roll back.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from edged.core.names import model_name_problem, printable
from edged.core.repository.modes import ControlMode, Origin
from edged.core.repository.scan import ModelSource, version_numbers
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.core.repository.control import ModelController
    from edged.core.repository.manager import ModelRepositoryManager
    from edged.core.repository.records import ControlRecords

# The model-level history states of a change of served versions, and how their reasons end.
ACTIVATED: Final = "ACTIVATED"
ROLLED_BACK: Final = "ROLLED_BACK"
SERVING: Final = "SERVING"
_CHANGES: Final = frozenset({ACTIVATED, ROLLED_BACK, SERVING})
# A model's deletion (deletion.py): what its history holds from before is a model that is gone, not this one's past.
_DELETED: Final = "DELETED"
_WAS: Final = re.compile(r"\(was (\d+(?:, \d+)*)\)$")
# How many of a model's newest events a rollback after a restart reads for the last change (each load writes a
# handful): far enough back for any model an operator still rolls back.
_LOOKBACK: Final = 1000


@dataclass(frozen=True, slots=True)
class Activation:
    """What a load serves when an operator chose: exactly ``versions``; ``rollback``: as a rollback."""

    versions: tuple[int, ...]
    rollback: bool = False


@dataclass(frozen=True, slots=True)
class ServedVersions:
    """The answer to an activation or a rollback: the versions serving now, and those that served before."""

    model: str
    versions: list[int]
    previous: list[int]

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "versions": self.versions, "previous": self.previous}


class Transition(Protocol):
    """Model control's way of recording a transition (with the actor of the request, when one made it)."""

    def __call__(self, name: str, version: int | None, state: str, origin: Origin, reason: str = "") -> None: ...


class VersionActivation:
    """Activation and rollback for the service, and the pins and changes model control's loads consult (on the
    event loop, under the model's lock where control calls them)."""

    def __init__(
        self,
        controller: ModelController,
        manager: ModelRepositoryManager,
        records: ControlRecords,
        transition: Transition,
    ) -> None:
        self._controller = controller
        self._manager = manager
        self._records = records
        self._transition = transition
        self._pins: dict[str, list[int]] = {}
        self._previous: dict[str, list[int]] = {}

    # --- the operator's requests --------------------------------------------------------------------------------

    async def activate(self, name: str, version: int) -> ServedVersions:
        """Serve exactly ``version`` of model ``name``; INVALID_ARG naming the versions it has when it has no such
        version, NOT_FOUND when the repository has no such model."""
        what = f"failed to activate version {version} of '{printable(name)}'"
        source = await self._source(name, what)
        available = await asyncio.to_thread(version_numbers, source)
        if version not in available:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"{what}: it has no version {version} (its versions: {_listed(available) or 'none'})",
            )
        return await self._serve(name, Activation((version,)))

    async def rollback(self, name: str) -> ServedVersions:
        """Serve the versions that served before the last change of the served versions; INVALID_ARG when there
        is none, or when those versions are gone from the repository."""
        what = f"failed to roll back '{printable(name)}'"
        source = await self._source(name, what)
        previous = await self.previous(name)
        if not previous:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"{what}: there is nothing to roll back to (the versions it serves have not changed since it was "
                "first loaded)",
            )
        available = await asyncio.to_thread(version_numbers, source)
        missing = [number for number in previous if number not in available]
        if missing:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"{what} to {_words(previous)}: version {_listed(missing)} is no longer in the model repository",
            )
        return await self._serve(name, Activation(tuple(previous), rollback=True))

    async def previous(self, name: str) -> list[int]:
        """The versions a rollback of ``name`` would serve (empty: there is nothing to roll back to). Read from the
        history once per run, then kept: within a run every later change goes through ``changed``, which keeps it
        too, so the console can ask on every refresh of a model's page."""
        if name not in self._previous:
            recorded = await self._recorded_previous(name) or []
            # (setdefault: a change made while the history was read is newer than what the read found.)
            self._previous.setdefault(name, recorded)
        return list(self._previous[name])

    async def _serve(self, name: str, activation: Activation) -> ServedVersions:
        before = self._manager.ready_versions(name)
        await self._controller.load(name, activation=activation)
        return ServedVersions(name, self._manager.ready_versions(name), before)

    async def _source(self, name: str, what: str) -> ModelSource:
        """The model's folder, after the checks every activation and rollback makes first."""
        if self._controller.mode is not ControlMode.EXPLICIT:
            raise EdgedError(ErrorCode.UNAVAILABLE, "explicit model load / unload is not allowed if polling is enabled")
        problem = model_name_problem(name)
        if problem is not None:
            raise EdgedError(ErrorCode.INVALID_ARG, f"{what}: it cannot be a model name ({problem})")
        scan = await asyncio.to_thread(self._manager.scan)
        source: ModelSource | None = scan.models.get(name)
        if source is None:
            raise EdgedError(ErrorCode.NOT_FOUND, f"{what}: there is no model '{name}' in the model repository")
        return source

    async def _recorded_previous(self, name: str) -> list[int] | None:
        """The versions served before the last change, as the history recorded it (after a restart)."""
        events, _ = await self._records.history(name, 0, _LOOKBACK)
        for event in events:
            if event.version is None and event.state == _DELETED:
                return None
            if event.version is None and event.state in _CHANGES:
                found = _WAS.search(event.reason)
                return [int(number) for number in found.group(1).split(", ")] if found else None
        return None

    def forget(self, name: str) -> None:
        """The model was deleted: one uploaded under its name later has nothing to roll back to and no pin."""
        self._pins.pop(name, None)
        self._previous[name] = []

    # --- what model control's loads consult ---------------------------------------------------------------------

    def restore(self, desired: dict[str, list[int] | None]) -> set[str]:
        """At start: the pins explicit mode's desired set kept; returns the models it names."""
        self._pins = {name: versions for name, versions in desired.items() if versions}
        return set(desired)

    def pin_for(self, name: str, desired: bool, activation: Activation | None) -> list[int] | None:
        """The versions a load serves (None: the config's version_policy's): an activation's; none for a request's
        plain load (``desired``); for any other load, those the model is pinned to."""
        if activation is not None:
            return list(activation.versions)
        return None if desired else self._pins.get(name)

    def settle(self, name: str, pin: list[int] | None) -> None:
        """A request's load succeeded: from now on the model serves ``pin`` (None: its version_policy's)."""
        if pin is None:
            self._pins.pop(name, None)
        else:
            self._pins[name] = pin

    def changed(
        self, name: str, before: list[int], after: list[int], origin: Origin, activation: Activation | None
    ) -> None:
        """After a load: when the served versions went from some to others, remember and record what served."""
        if not before or not after or before == after:
            return
        self._previous[name] = before
        if activation is None:
            state, reason = SERVING, f"now serving {_words(after)}"
        elif activation.rollback:
            state, reason = ROLLED_BACK, f"rolled back to {_words(after)}"
        else:
            state, reason = ACTIVATED, f"{_words(after)} activated"
        self._transition(name, None, state, origin, f"{reason} (was {_listed(before)})")


def _listed(versions: list[int]) -> str:
    return ", ".join(str(number) for number in versions)


def _words(versions: list[int]) -> str:
    return f"version{'s' if len(versions) > 1 else ''} {_listed(versions)}"
