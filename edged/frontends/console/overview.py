"""The first page: the device at a glance. Health, uptime and version; the devices with the instances placed on
each; the models by state; requests and latency now; sync; the latest events. ``/overview/live`` is the part that
moves, which htmx reloads every few seconds."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from litestar import Request, get
from litestar.response import Template

from edged.core.audit import transition_event
from edged.frontends.console.figures import device_figures, model_figures
from edged.frontends.console.history import page_rows, table
from edged.frontends.console.pages import console, render

if TYPE_CHECKING:
    from edged.core.repository.summary import ModelSummary
    from edged.core.service import InferenceService

# How many of the latest actions the overview lists, each with its steps folded under it (the history page has
# them all), and in how many events at most: an action is a few (an activation six); fewer rows are shown when the
# actions were longer. Twice as many events are read (history.page_rows).
RECENT_EVENTS = 8
_EVENTS_SHOWN = RECENT_EVENTS * 6


@dataclass(slots=True)
class DeviceRow:
    """One processor of the device and the model instances placed on it."""

    name: str
    detail: str
    instances: list[str] = field(default_factory=list)


@get("/")
async def overview_page(request: Request[Any, Any, Any]) -> Template:
    return render(request, "overview.html", **await _live(request))


@get("/overview/live")
async def overview_live(request: Request[Any, Any, Any]) -> Template:
    return render(request, "overview_live.html", **await _live(request))


async def _live(request: Request[Any, Any, Any]) -> dict[str, Any]:
    context = console(request)
    service = context.service
    models = service.model_summaries()
    figures = model_figures(service)
    device = device_figures(service)
    history, _ = await service.model_history(None, 0, 2 * _EVENTS_SHOWN)
    rows, _ = page_rows([transition_event(event) for event in history], _EVENTS_SHOWN)
    # statvfs and sysfs reads: off the event loop (a hwmon chip may be asked over I2C).
    conditions = await asyncio.to_thread(service.device_conditions)
    states = Counter(model.state or "NOT LOADED" for model in models)
    return {
        "live": service.is_live(),
        "ready": service.is_ready(),
        "uptime_s": time.time() - context.started_at,
        "control_mode": service.control_mode,
        "devices": _devices(service, models),
        "device": device,
        # The Device card (overview_device.html): disk space and temperatures; None when the daemon reads none.
        "conditions": conditions,
        "models": models,
        # What keeps the device from being ready (strict readiness): the models that should serve and do not.
        "holding": [model for model in models if model.wanted and model.state != "READY"],
        "starting": not service.started,
        "states": sorted(states.items()),
        # Requests for no served model are traffic too, every one answered with an error.
        "request_rate": sum(f.request_rate for f in figures.values()) + device.unknown_model_error_rate,
        # Every error a client was answered: each model's, and those for no served model.
        "error_rate": sum(f.error_rate for f in figures.values()) + device.unknown_model_error_rate,
        "busiest": sorted(figures.items(), key=lambda item: -item[1].request_rate)[:5],
        "sync": service.sync.status() if service.sync is not None else None,
        **table(rows[:RECENT_EVENTS]),
    }


def _devices(service: InferenceService, models: list[ModelSummary]) -> list[DeviceRow]:
    inventory = service.devices
    rows = {"CPU": DeviceRow("CPU", f"{inventory.cpu_count} cores")}
    for gpu in inventory.gpus:
        rows[f"GPU {gpu.id}"] = DeviceRow(f"GPU {gpu.id}", gpu.name)
    for npu in inventory.npus:
        rows[f"NPU {npu.id}"] = DeviceRow(f"NPU {npu.id}", npu.name)
    for model in models:
        if not model.serving:
            continue
        for instance in model.instances:
            rows.setdefault(instance.device, DeviceRow(instance.device, "")).instances.append(
                f"{model.name}/{instance.name}"
            )
    return list(rows.values())


ROUTES = [overview_page, overview_live]
