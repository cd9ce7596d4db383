"""The temperatures the kernel exposes, read from sysfs: thermal zones (``class/thermal/thermal_zone<N>``: ``temp``,
with its ``type``, e.g. ``cpu-thermal`` or ``x86_pkg_temp``) and hardware monitors (``class/hwmon/hwmon<N>``:
``temp<M>_input``, named by the monitor's ``name`` and the sensor's ``temp<M>_label`` where it has one).

A container, a virtual machine or a board without sensors has neither: the list is then empty. A sensor whose value
cannot be read (some zones answer EINVAL or ENODATA while disabled) or is no temperature (below absolute zero, or
hotter than any chip survives) is left out. Both values are in millidegrees Celsius.

Blocking, and some hwmon drivers ask their chip over I2C on each read (milliseconds): read off the event loop, and
not more often than the console shows them (edged.core.device_conditions caches them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

SYSFS: Final = Path("/sys")
# Sensors listed at most: a server's coretemp has one per core, and the console's card is not the place for 128.
MAX_SENSORS: Final = 32
_PLAUSIBLE_C: Final = (-100.0, 300.0)
_NUMBERED: Final = re.compile(r"(\D*)(\d+)")
_HWMON_INPUT: Final = re.compile(r"temp(\d+)_input")


@dataclass(frozen=True, slots=True)
class Temperature:
    source: str  # where it was read: "thermal_zone0", "hwmon1/temp2"
    name: str  # what it measures, as the kernel names it: "x86_pkg_temp", "coretemp Package id 0"
    celsius: float


def read_temperatures(sysfs: Path = SYSFS, limit: int = MAX_SENSORS) -> list[Temperature]:
    """Every thermal zone's temperature, then every hwmon sensor's, in the kernel's numbering; at most ``limit``."""
    found = _thermal_zones(sysfs / "class" / "thermal") + _hwmon(sysfs / "class" / "hwmon")
    return found[:limit]


def _thermal_zones(root: Path) -> list[Temperature]:
    found: list[Temperature] = []
    for zone in _numbered(root, "thermal_zone"):
        celsius = _millidegrees(zone / "temp")
        if celsius is not None:
            found.append(Temperature(zone.name, _text(zone / "type") or zone.name, celsius))
    return found


def _hwmon(root: Path) -> list[Temperature]:
    found: list[Temperature] = []
    for monitor in _numbered(root, "hwmon"):
        name = _text(monitor / "name") or monitor.name
        try:
            inputs = sorted(
                (int(match.group(1)), entry.name)
                for entry in monitor.iterdir()
                if (match := _HWMON_INPUT.fullmatch(entry.name)) is not None
            )
        except OSError:
            continue
        for number, file_name in inputs:
            celsius = _millidegrees(monitor / file_name)
            if celsius is None:
                continue
            label = _text(monitor / f"temp{number}_label")
            found.append(Temperature(f"{monitor.name}/temp{number}", f"{name} {label}" if label else name, celsius))
    return found


def _numbered(root: Path, prefix: str) -> list[Path]:
    """``root``'s entries named ``<prefix><N>``, by N (thermal_zone10 after thermal_zone9)."""
    try:
        entries = list(root.iterdir())
    except OSError:  # no such class: no sensors of this kind
        return []
    numbered: list[tuple[int, Path]] = []
    for entry in entries:
        match = _NUMBERED.fullmatch(entry.name)
        if match is not None and match.group(1) == prefix:
            numbered.append((int(match.group(2)), entry))
    return [entry for _, entry in sorted(numbered)]


def _millidegrees(path: Path) -> float | None:
    try:
        celsius = int(path.read_text(encoding="ascii").strip()) / 1000
    except (OSError, ValueError):
        return None
    low, high = _PLAUSIBLE_C
    return celsius if low <= celsius <= high else None


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""
