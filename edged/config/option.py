"""What one setting of ``edged serve`` is (``Option``): its name, type, default, limits and help, and how its value is
read from a flag, an ``EDGED_*`` variable or the config file and written back. The table of them is
edged.config.options."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from edged.config.values import describe_value, is_remote, number_text, parse_bool

ENV_PREFIX: Final = "EDGED_"

Kind = Literal["str", "int", "float", "bool", "path", "choice"]


@dataclass(frozen=True, slots=True)
class Option:
    """One setting of ``edged serve``: its flag ``--<name>``, key ``<key>`` and variable ``EDGED_<KEY>``."""

    name: str
    kind: Kind
    default: Any
    help: str
    repeatable: bool = False
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    # What an unset value (default None) means, for the printed configuration.
    unset: str = ""
    # A further check of one value; raises ValueError with the problem.
    check: Callable[[Any], None] | None = None
    # The value the packaged edged.toml sets (a TOML literal); every other key stays commented at its default.
    packaged: str | None = None
    # A "path" that may also be an s3:// or gs:// URL, kept as the string it is (never made relative to a base).
    remote: bool = False

    @property
    def key(self) -> str:
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    def default_value(self) -> Any:
        return list(self.default) if self.repeatable else self.default

    # --- one value, from text (a flag or a variable) or from TOML ---------------------------------------------

    def from_text(self, text: str, base: Path) -> Any:
        if not text and self.default is None:
            return None
        value: Any = text
        if self.kind == "bool":
            value = parse_bool(text)
        elif self.kind == "int":
            try:
                value = int(text.strip())
            except ValueError:
                raise ValueError(f"expected an integer, got '{text}'") from None
        elif self.kind == "float":
            try:
                value = float(text.strip())
            except ValueError:
                raise ValueError(f"expected a number, got '{text}'") from None
        elif self.kind == "path":
            if not text:
                raise ValueError("expected a path, got an empty string")
            value = text if self.remote and is_remote(text) else base / text
        return self._checked(value)

    def from_toml(self, value: object, base: Path) -> Any:
        if self.kind == "bool":
            if isinstance(value, bool):
                return self._checked(value)
            if isinstance(value, str):
                return self.from_text(value, base)  # "" is unset where the default is
            raise ValueError(f"expected a boolean, got {describe_value(value)}")
        if self.kind == "int":
            if isinstance(value, int) and not isinstance(value, bool):
                return self._checked(value)
            raise ValueError(f"expected an integer, got {describe_value(value)}")
        if self.kind == "float":
            if isinstance(value, int | float) and not isinstance(value, bool):
                return self._checked(float(value))
            raise ValueError(f"expected a number, got {describe_value(value)}")
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {describe_value(value)}")
        return self.from_text(value, base)

    def _checked(self, value: Any) -> Any:
        if self.kind in ("int", "float"):
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"expected a finite number, got {value}")
            if self.low is not None and self.high is not None and not self.low <= value <= self.high:
                raise ValueError(f"{value} is outside {number_text(self.low)}-{number_text(self.high)}")
            if self.low is not None and value < self.low:
                raise ValueError(f"must be at least {number_text(self.low)}, got {value}")
        if self.choices and value not in self.choices:
            raise ValueError(f"expected one of {', '.join(self.choices)}, got '{value}'")
        if self.check is not None:
            self.check(value)
        return value

    # --- what the help, the printer and the template show -----------------------------------------------------

    def literal(self, value: Any) -> str:
        """``value`` as a TOML literal."""
        if isinstance(value, list):
            return "[" + ", ".join(self.literal(item) for item in value) + "]"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float):
            return repr(value)
        return json.dumps(str(value), ensure_ascii=False)

    def help_text(self) -> str:
        unset = self.default is None or self.default == []
        shown = self.unset if unset else self.literal(self.default).strip('"')
        return f"{self.help} (default: {shown})" if shown else self.help
