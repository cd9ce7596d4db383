"""Triton's trace extension: the trace settings (global and per model) and the sampling of requests to trace.

``TraceManager`` holds the settings as Triton's tracer does: a global setting, per-model settings that fall back
to it field by field, and a setting object that is replaced (never changed) on every update, so that a trace in
flight is written under the setting it was sampled with. A replaced setting writes what it still buffers once its
last trace is written. Frontends sample (``sample``) only while ``enabled`` is true: with tracing off the hot path
costs one attribute check. The traces and their file are in edged.core.trace_file.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from edged.core.trace_file import LEVEL_TENSORS, LEVEL_TIMESTAMPS, Trace, TraceFile, TraceSink
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

log = logging.getLogger(__name__)

INT32_MAX: Final = 2**31 - 1
UINT32_MAX: Final = 2**32 - 1
# What ``trace_count`` may be: -1 traces without end.
MIN_TRACE_COUNT: Final = -1
SETTING_NAMES: Final = ("trace_level", "trace_rate", "trace_count", "log_frequency")


@dataclass(frozen=True, slots=True)
class TraceValues:
    """One setting's values, as the settings routes report them."""

    level: int = 0  # a mask of LEVEL_TIMESTAMPS and LEVEL_TENSORS; 0 is OFF
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"


@dataclass(frozen=True, slots=True)
class NewSetting:
    """An update: a value to set, or (``clear``) a field to fall back to the global setting again."""

    level: int | None = None
    rate: int | None = None
    count: int | None = None
    log_frequency: int | None = None
    clear: frozenset[str] = frozenset()


class TraceSetting(TraceSink):
    """The values in force for the global setting or one model, which of them the model set itself (the others
    follow the global setting), and the sampling counters (Triton's: every request counts toward the rate)."""

    def __init__(self, values: TraceValues, specified: frozenset[str], file: TraceFile) -> None:
        super().__init__(file, values.log_frequency)
        self.values = values
        self.specified = specified
        self._lock = threading.Lock()
        self._count = values.count
        self._sampled = 0
        if values.level == 0:
            self.invalid = "tracing is disabled"
        elif values.rate == 0:
            self.invalid = "sample rate must be non-zero"
        elif values.mode == "triton" and not values.file:
            self.invalid = "trace file name is not given"
        else:
            self.invalid = ""

    def valid(self) -> bool:
        return not self.invalid and self._count != 0

    def current(self) -> TraceValues:
        """The values with the count still left, as Triton reports it."""
        return replace(self.values, count=self._count)

    def sample(self) -> bool:
        """Whether this request is traced: every ``rate``-th request, while ``count`` allows."""
        with self._lock:
            if not self.valid():
                return False
            self._sampled += 1
            self.requests_seen = self._sampled
            if self._sampled % self.values.rate != 0:
                return False
            if self._count > 0:
                self._count -= 1
            # Triton writes an indexed file once the count is spent and every sampled trace is written.
            self.last_batch = self._count == 0
            return True


def _level_of(text: Sequence[str]) -> int | None:
    """Triton's reading of a list of levels: OFF alone, else the mask of the known names; unknown names are
    ignored, and no known name leaves the level as it was (None)."""
    level: int | None = None
    for name in text:
        if name == "OFF":
            if len(text) != 1:
                raise EdgedError(ErrorCode.INVALID_ARG, "Expect only one trace level 'OFF' is specified")
            level = 0
        elif name == "TIMESTAMPS":
            level = (level or 0) | LEVEL_TIMESTAMPS
        elif name == "TENSORS":
            level = (level or 0) | LEVEL_TENSORS
    return level


def level_names(level: int) -> list[str]:
    if level == 0:
        return ["OFF"]
    return [name for bit, name in ((LEVEL_TIMESTAMPS, "TIMESTAMPS"), (LEVEL_TENSORS, "TENSORS")) if level & bit]


def stoi(text: str) -> int | None:
    """``std::stoi`` as Triton parses a setting: leading blanks, a sign, then digits (what follows is ignored);
    None when no digit comes first. Out of int32's range raises OverflowError."""
    stripped = text.lstrip(" \t\n\v\f\r")
    sign = 1
    if stripped[:1] in ("+", "-"):
        sign = -1 if stripped[0] == "-" else 1
        stripped = stripped[1:]
    digits = ""
    for char in stripped:
        if not char.isascii() or not char.isdigit():
            break
        digits += char
    if not digits:
        return None
    value = sign * int(digits)
    if not -(2**31) <= value <= INT32_MAX:
        raise OverflowError
    return value


def parse_number(name: str, text: str, http: bool) -> int:
    """A rate, count or log frequency given as text, with Triton's errors (their spelling differs by protocol)."""
    try:
        value = stoi(text)
    except OverflowError:
        low, high = (MIN_TRACE_COUNT, INT32_MAX) if name == "trace_count" else (0, UINT32_MAX)
        raise EdgedError(
            ErrorCode.INVALID_ARG,
            f"Unable to parse '{name}', value is out of range [ {low}, {high} ], got: {text}",
        ) from None
    if value is None:
        raise EdgedError(ErrorCode.INVALID_ARG, f"Unable to parse '{name}', got: {text}")
    if name == "trace_count":
        if value < MIN_TRACE_COUNT:
            got = f"got:{text}" if http else f"got: {text}"
            raise EdgedError(
                ErrorCode.INVALID_ARG, f"Unable to parse '{name}'. Expecting value >= {MIN_TRACE_COUNT}, {got}"
            )
        return value
    # Triton stores a rate and a log frequency as unsigned 32-bit numbers: -1 becomes 4294967295.
    return value & UINT32_MAX


def new_setting(values: Mapping[str, Sequence[str] | None], http: bool) -> NewSetting:
    """An update from a settings request: each known name with its values as text, or None to clear it."""
    if "trace_file" in values:
        raise EdgedError(ErrorCode.UNSUPPORTED, "trace file location can not be updated through network protocol")
    clear: set[str] = set()
    found: dict[str, int] = {}
    for name in SETTING_NAMES:
        if name not in values:
            continue
        given = values[name]
        if given is None:
            clear.add(name)
            continue
        if name == "trace_level":
            level = _level_of(given)
            if level is not None:
                found[name] = level
            continue
        if len(given) != 1:
            raise EdgedError(ErrorCode.INVALID_ARG, f"expect only 1 value for '{name}'")
        found[name] = parse_number(name, given[0], http)
    return NewSetting(
        level=found.get("trace_level"),
        rate=found.get("trace_rate"),
        count=found.get("trace_count"),
        log_frequency=found.get("log_frequency"),
        clear=frozenset(clear),
    )


_FIELDS: Final = {
    "trace_level": "level",
    "trace_rate": "rate",
    "trace_count": "count",
    "log_frequency": "log_frequency",
}


class TraceManager:
    """The trace settings of one server and the traces sampled under them."""

    def __init__(self, values: TraceValues | None = None) -> None:
        values = values or TraceValues()
        self._files: dict[str, TraceFile] = {}
        self._default = values
        self._global = TraceSetting(values, frozenset(), self._file(values.file))
        self._models: dict[str, TraceSetting] = {}
        # Models whose setting follows the global one in some field: a global update rebuilds them.
        self._following: set[str] = set()
        self._ids = 0
        self._lock = threading.Lock()
        # True while some setting may sample: the one check the inference paths make when tracing is off.
        self.enabled = False
        self._refresh()

    def _file(self, name: str) -> TraceFile:
        file = self._files.get(name)
        if file is None:
            file = self._files[name] = TraceFile(name)
        return file

    def _refresh(self) -> None:
        self.enabled = self._global.valid() or any(s.valid() for s in self._models.values())

    # --- settings -------------------------------------------------------------------------------------------

    def setting(self, model: str) -> TraceValues:
        return self._models.get(model, self._global).current()

    def update(self, model: str, change: NewSetting) -> None:
        """Update the global setting (``model`` empty) or one model's, as Triton's UpdateTraceSetting does."""
        with self._lock:
            self._update(model, change)
            if not model:
                for name in sorted(self._following):
                    self._update(name, NewSetting())
            self._refresh()

    def _update(self, model: str, change: NewSetting) -> None:
        current = self._models.get(model) if model else self._global
        fallback = self._global.current() if model else self._default
        specified = set(current.specified) if current is not None else set()
        values = fallback
        for name, field in _FIELDS.items():
            given = getattr(change, field)
            if name in change.clear:
                specified.discard(name)
                continue
            if given is not None:
                specified.add(name)
                values = replace(values, **{field: given})
            elif name in specified and current is not None:
                values = replace(values, **{field: getattr(current.current(), field)})
        if model:
            if not specified:
                old = self._models.pop(model, None)
                self._following.discard(model)
                if old is not None:
                    old.retire()
                return
            # A model never sets its own file: it always follows the global setting in something.
            self._following.add(model)
        setting = TraceSetting(values, frozenset(specified), self._file(values.file))
        if setting.invalid and values.level != 0:
            raise EdgedError(ErrorCode.INVALID_ARG, f"Attempting to set invalid trace setting :{setting.invalid}")
        if not setting.invalid and setting.values.count == 0:
            raise EdgedError(ErrorCode.INVALID_ARG, "Attempting to set invalid trace setting :")
        old = current
        if model:
            self._models[model] = setting
        else:
            self._global = setting
        if old is not None:
            old.retire()

    # --- sampling -------------------------------------------------------------------------------------------

    def sample(self, model: str) -> Trace | None:
        """A trace for a request to ``model`` when its setting samples this one; called only while ``enabled``."""
        setting = self._models.get(model, self._global)
        with self._lock:
            if not setting.sample():
                if not setting.valid():
                    self._refresh()
                return None
            self._ids += 1
            trace_id = self._ids
        return Trace(trace_id, 0, setting, setting.values.level, self._next_id)

    def _next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    def close(self) -> None:
        """At shutdown: write what every setting still buffers, and close the files."""
        with self._lock:
            for setting in (self._global, *self._models.values()):
                setting.retire()
            for file in self._files.values():
                file.close()
            self.enabled = False


def parse_trace_config(entries: Sequence[str]) -> TraceValues:
    """``--trace-config`` as Triton reads it: ``level=``, ``rate=``, ``count=``, ``log_frequency=``, ``mode=`` and
    ``triton,file=`` (or ``triton,log-frequency=``); raises ValueError naming a value it cannot use."""
    values = TraceValues()
    for entry in entries:
        scope, _, setting = entry.rpartition(",")
        key, sep, value = setting.partition("=")
        if not sep:
            raise ValueError(f"--trace-config expects [MODE,]KEY=VALUE, got '{entry}'")
        if scope not in ("", "triton", "opentelemetry"):
            raise ValueError(f"--trace-config: unknown trace mode '{scope}'")
        if scope == "opentelemetry":
            raise ValueError("--trace-config: the opentelemetry trace mode is not supported by this server")
        if key == "file" and scope == "triton":
            values = replace(values, file=value)
        elif key in ("log-frequency", "log_frequency"):
            values = replace(values, log_frequency=_whole(entry, value, UINT32_MAX))
        elif scope:
            raise ValueError(f"--trace-config: unknown setting '{key}' for the {scope} mode")
        elif key == "level":
            level = _level_of([value.upper()])
            if level is None:
                raise ValueError(f"--trace-config: unknown trace level '{value}' (OFF, TIMESTAMPS or TENSORS)")
            values = replace(values, level=values.level | level if level else 0)
        elif key == "rate":
            values = replace(values, rate=_whole(entry, value, UINT32_MAX))
        elif key == "count":
            values = replace(values, count=_whole(entry, value, INT32_MAX, low=MIN_TRACE_COUNT))
        elif key == "mode":
            if value != "triton":
                raise ValueError(f"--trace-config: trace mode '{value}' is not supported by this server (triton)")
        else:
            raise ValueError(f"--trace-config: unknown setting '{key}'")
    return values


def _whole(entry: str, text: str, high: int, low: int = 0) -> int:
    if not text.lstrip("-").isdigit() or not low <= int(text) <= high:
        raise ValueError(f"--trace-config {entry}: expected a whole number from {low} to {high}")
    return int(text)


def check_trace_config(value: object) -> None:
    """The option table's check of ``--trace-config``."""
    if isinstance(value, list):
        parse_trace_config([str(v) for v in value])
