"""What an option's value may be: the parsers and checks of ``edged.config.options``' table, each raising
ValueError with the problem in words a flag, a config key or a variable can all be told."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Final

from edged.core.access import parse_categories, parse_certificate_role, parse_restricted
from edged.frontends.metrics.config import parse_metrics_config

_TRUE: Final = frozenset({"true", "on", "1", "yes"})
_FALSE: Final = frozenset({"false", "off", "0", "no"})


def parse_bool(text: str) -> bool:
    """Triton's boolean values: true/false/on/off/1/0 (and yes/no), any case."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected a boolean (true/false/on/off/1/0), got '{text}'")


def is_remote(repository: Any) -> bool:
    """An ``s3://``, ``gs://`` or ``as://`` repository (synced into a local mirror), not a local folder."""
    return str(repository).startswith(("s3://", "gs://", "as://"))


def check_repository(path: Any) -> None:
    if is_remote(path):
        from edged.sync.errors import SyncError
        from edged.sync.sources import parse_repository_url

        try:
            parse_repository_url(str(path))
        except SyncError as error:
            raise ValueError(str(error)) from None
    elif not Path(path).is_dir():
        raise ValueError(f"model repository '{path}' is not a readable directory")


_RATE_UNITS: Final = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def parse_rate(text: str) -> int | None:
    """``0`` (no cap) or bytes a second with an optional k, M or G suffix (``500k``, ``2M``); None for no cap."""
    stripped = text.strip()
    number, unit = stripped.rstrip("kKmMgG"), stripped[len(stripped.rstrip("kKmMgG")) :].lower()
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"expected bytes a second such as 500k or 2M (0: no cap), got '{text}'") from None
    if unit not in _RATE_UNITS or not math.isfinite(value) or value < 0:
        raise ValueError(f"expected bytes a second such as 500k or 2M (0: no cap), got '{text}'")
    rate = int(value * _RATE_UNITS[unit])
    return rate or None


def check_rate(value: Any) -> None:
    parse_rate(str(value))


def check_rate_limit(value: Any) -> None:
    if str(value).lower() not in ("execution_count", "off"):
        raise ValueError("invalid argument for --rate-limit")  # Triton's words


def parse_rate_limit_resource(text: str) -> tuple[str, int, int]:
    """Triton's --rate-limit-resource NAME:COUNT[:DEVICE]: (name, count, device; -1 for every device)."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 3:
        raise ValueError(
            "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or '<resource_name>:<count>'. "
            f"Got {text}"
        )
    numbers = []
    for index, part in enumerate(parts[1:]):
        try:
            number = int(part)
        except ValueError:
            number = -2
        if number < (0 if index == 0 else -1):  # a count is at least 0; a device -1 means every device
            raise ValueError(f"Invalid option value. Got {part}")  # Triton's words
        numbers.append(number)
    return parts[0], numbers[0], numbers[1] if len(numbers) > 1 else -1


def check_rate_limit_resource(value: Any) -> None:
    parse_rate_limit_resource(str(value))


def check_channel(value: Any) -> None:
    from edged.sync.fleet import channel_problem

    problem = channel_problem(str(value))
    if problem is not None:
        raise ValueError(problem)


def check_config_name(value: Any) -> None:
    """A --model-config-name: a file name without its extension, never a path (Triton adds ``.pbtxt``)."""
    name = str(value)
    if not name or name in {".", ".."} or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(
            f"expected a configuration name without a path or extension (configs/NAME.pbtxt), got '{name}'"
        )


def check_device_id(value: Any) -> None:
    from edged.sync.fleet import device_id_problem

    problem = device_id_problem(str(value))
    if problem is not None:
        raise ValueError(problem)


def check_backend_config(value: Any) -> None:
    backend, _, setting = str(value).rpartition(",")
    key, sep, item = setting.partition("=")
    if not sep or not key:
        raise ValueError(f"expected [BACKEND,]KEY=VALUE, got '{value}'")
    if not backend and key == "default-max-batch-size" and not item.isdigit():
        raise ValueError(f"default-max-batch-size must be a non-negative integer, got '{item}'")


def check_restricted(value: Any) -> None:
    parse_restricted(str(value), grpc=False)


def check_certificate_role(value: Any) -> None:
    parse_certificate_role(str(value))


def check_header_pattern(value: Any) -> None:
    from edged.frontends.forwarding import header_pattern

    header_pattern(str(value))


def check_categories(value: Any) -> None:
    parse_categories(str(value))


def check_metrics_config(value: Any) -> None:
    try:
        parse_metrics_config([str(value)])
    except ValueError as error:
        # Its messages are written for the flag; the caller names the source instead.
        raise ValueError(str(error).removeprefix("--metrics-config").lstrip(": ")) from None


def describe_value(value: object) -> str:
    if isinstance(value, bool):
        return f"a boolean ({'true' if value else 'false'})"
    if isinstance(value, str):
        return f"a string ('{value}')"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
