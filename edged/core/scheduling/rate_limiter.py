"""Triton's rate limiter (--rate-limit execution_count): an instance executes only when every resource its instance
group's ``rate_limiter`` names is free in the count it asks for, and instances waiting for resources are served
by priority.

As Triton's (core/src/rate_limiter.cc): a resource is counted per device (the instance's), or once for the whole
server when the config marks it ``global``. How many of a resource there are is --rate-limit-resource's count
when given, else the most any loaded instance asks for; once any --rate-limit-resource is given, an instance that
asks for more than it provides (or for a resource it does not list) fails to load. Waiting instances are served by
their scaled priority, the times the instance has executed times its ``priority`` (0 counts as 1), lowest first,
so an instance of priority 2 gets half the executions of one of priority 1 when both always wait; among equals,
the one that asked first. The one waiting ahead is not passed over for one that would fit: a large ask is not
starved by small ones.

``RATE_LIMITER`` is the process's one limiter, configured once by the daemon; while it is off, the schedulers'
batch runner checks ``RATE_LIMITER.on`` and nothing else. Everything but registration runs on the event loop.
"""

from __future__ import annotations

import heapq
import logging
import threading
from typing import TYPE_CHECKING, Final

from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from edged.core.backend_api import BackendModel
    from edged.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

# Triton's keys of its resource maps: a global resource, and a --rate-limit-resource given without a device.
GLOBAL: Final = -2
PER_DEVICE: Final = -1

Key = tuple[int, str]  # (device id or GLOBAL, resource name)


class InstanceContext:
    """What the limiter knows of one model instance: what it asks for, its priority and how often it ran."""

    __slots__ = ("executions", "name", "needs", "weight")

    def __init__(self, name: str, needs: dict[Key, int], priority: int) -> None:
        self.name = name  # the model's and the instance group's, for the log
        self.needs = needs
        self.weight = max(priority, 1)
        self.executions = 0


class RateLimiter:
    def __init__(self) -> None:
        self.on = False
        self._explicit: dict[int, dict[str, int]] = {}
        self._lock = threading.Lock()  # models load on several threads
        self._owned: dict[int, list[InstanceContext]] = {}  # by id() of the BackendModel
        self._by_instance: dict[int, InstanceContext] = {}  # by id() of the scheduler's instance
        self._instances_of: dict[int, list[int]] = {}  # the keys of _by_instance, by id() of the BackendModel
        self._available: dict[Key, int] = {}
        self._allocated: dict[Key, int] = {}
        self._staged: list[tuple[int, int, InstanceContext, Callable[[], None]]] = []
        self._arrivals = 0
        self._allocating = False

    def configure(self, on: bool, resources: Iterable[tuple[str, int, int]]) -> None:
        """--rate-limit and each --rate-limit-resource (name, count, device; device -1: every device)."""
        self.on = on
        self._explicit = {}
        for name, count, device in resources:
            counts = self._explicit.setdefault(device, {})
            # Triton keeps the smaller of two counts given for one resource on one device.
            counts[name] = min(count, counts.get(name, count))

    # --- loading and unloading (any thread) --------------------------------------------------------------------

    def admit(self, model: BackendModel, config: ModelConfig) -> None:
        """Register a loaded model's instances; EdgedError (Triton's text) when the resources cannot serve them."""
        if not self.on:
            return
        contexts: dict[tuple[int, int], InstanceContext] = {}
        by_instance: dict[int, InstanceContext] = {}
        for instance in model.instances:
            placement = getattr(instance, "placement", None)
            group_index, device = (placement.group, placement.device_id) if placement is not None else (0, 0)
            context = contexts.get((group_index, device))
            if context is None:
                group = config.instance_group[group_index] if config.instance_group else None
                limits = group.rate_limiter if group is not None else None
                needs: dict[Key, int] = {}
                for resource in limits.resources if limits is not None else ():
                    needs[(GLOBAL if getattr(resource, "global") else device, resource.name)] = resource.count
                context = contexts[(group_index, device)] = InstanceContext(
                    f"model '{config.name}' instance group {group.name if group else ''} on device {device}",
                    needs,
                    limits.priority if limits else 0,
                )
            by_instance[id(instance)] = context
        with self._lock:
            self._owned[id(model)] = list(contexts.values())
            try:
                self._available = self._limits()
            except EdgedError:
                del self._owned[id(model)]
                raise
            self._by_instance.update(by_instance)
            self._instances_of[id(model)] = list(by_instance)

    def forget(self, model: BackendModel | None) -> None:
        """An unloaded model's instances no longer count towards the resources' sizes."""
        if model is None or not self.on:
            return
        with self._lock:
            if self._owned.pop(id(model), None) is None:
                return
            for key in self._instances_of.pop(id(model), []):
                self._by_instance.pop(key, None)
            self._available = self._limits()

    def _limits(self) -> dict[Key, int]:
        """Each resource's size, as Triton's ResourceManager works it out (ParseAndValidateResources)."""
        most: dict[Key, int] = {}
        for contexts in self._owned.values():
            for context in contexts:
                for key, count in context.needs.items():
                    most[key] = max(most.get(key, 0), count)
        if self._explicit:
            for (device, name), needed in most.items():
                if device == GLOBAL:
                    given = [c.get(name, 0) for c in self._explicit.values()]
                else:
                    given = [
                        self._explicit.get(device, {}).get(name, 0),
                        self._explicit.get(PER_DEVICE, {}).get(name, 0),
                    ]
                count = max(given, default=0)
                if count < needed:
                    raise EdgedError(
                        ErrorCode.INVALID_ARG,
                        f'Resource count for "{name}" is limited to {count} which will prevent scheduling of one or '
                        f"more model instances, the minimum required count is {needed}",
                    )
                most[(device, name)] = count
        global_names = {name for device, name in most if device == GLOBAL}
        for device, name in most:
            if device != GLOBAL and name in global_names:
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f'Resource "{name}" is present as both global and device-specific resource in the model '
                    "configuration.",
                )
        return most

    # --- executions (the event loop) ---------------------------------------------------------------------------

    def context(self, instance: object) -> InstanceContext | None:
        """The instance's context; None for one the limiter does not know (it runs as soon as it is free)."""
        return self._by_instance.get(id(instance))

    def request(self, context: InstanceContext, start: Callable[[], None]) -> None:
        """Call ``start`` once the instance's resources are allocated to it (now, if they are free and no
        instance is served before it); the caller calls ``release`` when the execution ends."""
        self._arrivals += 1
        heapq.heappush(self._staged, (context.executions * context.weight, self._arrivals, context, start))
        self._allocate()
        if self._staged and log.isEnabledFor(logging.DEBUG) and any(item[2] is context for item in self._staged):
            log.debug("%s waits for its rate limiter resources", context.name)

    def release(self, context: InstanceContext) -> None:
        context.executions += 1
        for key, count in context.needs.items():
            self._allocated[key] -= count
        self._allocate()

    def _allocate(self) -> None:
        # An execution that ends inline releases from inside ``start``: the outer loop goes on from there.
        if self._allocating:
            return
        self._allocating = True
        try:
            while self._staged:
                context = self._staged[0][2]
                if not self._fits(context.needs):
                    return
                start = heapq.heappop(self._staged)[3]
                for key, count in context.needs.items():
                    self._allocated[key] = self._allocated.get(key, 0) + count
                start()
        finally:
            self._allocating = False

    def _fits(self, needs: dict[Key, int]) -> bool:
        available, allocated = self._available, self._allocated
        # A resource no loaded instance declares any more (its model went) has no limit to wait for.
        return all(allocated.get(key, 0) + count <= available.get(key, count) for key, count in needs.items())


RATE_LIMITER: Final = RateLimiter()
