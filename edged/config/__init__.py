"""Layered configuration of ``edged serve``: built-in defaults < a TOML file < ``EDGED_*`` environment < flags.

``OPTIONS`` (edged.config.options) is the one table of the daemon's settings. The ``serve`` flags, the config file's
keys, the environment variables, ``edged config`` and the packaged ``edged.toml`` are all derived from it, so a
setting is added in one place. The names follow one rule from the flag: ``--http-port`` is the key ``http_port``
and the variable ``EDGED_HTTP_PORT``.

``resolve(argv, environ)`` reads every layer again each time it is called, so the daemon can call it on SIGHUP; it
raises ``ConfigError`` whose text is the one line to print, naming the source (file and key, variable or flag).
"""

from __future__ import annotations

import argparse
import difflib
import textwrap
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from edged.config.options import BY_KEY, OPTIONS
from edged.config.settings import Settings

if TYPE_CHECKING:
    from edged.config.option import Option

DEFAULT_CONFIG_FILE: Final = Path("/etc/edged/edged.toml")
CONFIG_ENV: Final = "EDGED_CONFIG"
# A list in one environment variable: separated as PATH is, or written as a TOML array when a value holds a colon.
ENV_LIST_SEPARATOR: Final = ":"
DEFAULT_SOURCE: Final = "default"
# The exit status for a command line that names no model repository: argparse's usage error, as before files.
USAGE_STATUS: Final = 2


class ConfigError(Exception):
    """A configuration that cannot be served; ``str()`` is one line naming where the value came from."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


# --- the command line ---------------------------------------------------------------------------------------


def add_serve_options(parser: argparse.ArgumentParser, *, typed: bool) -> None:
    """Adds ``--config`` and every option's flag.

    ``typed``: convert and check each value while parsing (a bad one is argparse's usage error) and fill in the
    defaults, so the namespace alone makes ``Settings.from_args``. Otherwise each flag keeps its text and is only
    present when given, for ``resolve`` to layer over the file and the environment and check as it checks them.
    """
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=None,
        help=f"the configuration file (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG_FILE} when it exists)",
    )
    for option in OPTIONS:
        # argparse expands "%" in help texts; a help that says "10%" must reach it as "10%%".
        help_text = option.help_text().replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": option.key, "help": help_text, "metavar": option.metavar}
        if typed:
            kwargs["type"] = _argparse_type(option)
            kwargs["default"] = option.default_value()
        else:
            kwargs["default"] = argparse.SUPPRESS
        if option.kind == "bool":
            # `--flag` alone means true, `--flag=false` turns it off, as Triton's flags read.
            kwargs.update(nargs="?", const=True if typed else "true")
        if option.repeatable:
            kwargs["action"] = "append"
        parser.add_argument(option.flag, *(f"--{alias}" for alias in option.aliases), **kwargs)


def _argparse_type(option: Option) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return option.from_text(text, Path.cwd())
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = option.key
    return convert


class _FlagParser(argparse.ArgumentParser):
    # resolve() runs inside the daemon on SIGHUP too, where printing usage and exiting is no answer.
    def error(self, message: str) -> Any:
        raise ConfigError(message, USAGE_STATUS)


def _flag_parser() -> argparse.ArgumentParser:
    parser = _FlagParser(prog="edged serve", add_help=False)
    add_serve_options(parser, typed=False)
    return parser


# --- the layers ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Layered:
    """Every option's effective value, by key, and where it came from: ``default``, the file's path, the variable
    or the flag."""

    values: dict[str, Any]
    sources: dict[str, str]
    config_file: Path | None = None


def load(argv: Sequence[str], environ: Mapping[str, str]) -> Layered:
    """Every option's value from the layers; ``argv`` holds ``serve``'s flags (a leading ``serve`` is skipped)."""
    args = list(argv)
    if args[:1] == ["serve"]:
        args = args[1:]
    flags = vars(_flag_parser().parse_args(args))
    values = {option.key: option.default_value() for option in OPTIONS}
    sources = dict.fromkeys(values, DEFAULT_SOURCE)

    path, reason = _config_file(flags.pop("config", None), environ)
    if path is not None:
        for key, value in _read_file(path, reason).items():
            values[key], sources[key] = value, str(path)

    for option in OPTIONS:
        text = environ.get(option.env, "")
        # An empty variable is unset, as systemd's `Environment=EDGED_X=` and a shell's `EDGED_X=` mean.
        if not text:
            continue
        try:
            values[option.key] = _from_env(option, text)
        except ValueError as error:
            raise ConfigError(f"environment variable {option.env}: {error}") from None
        sources[option.key] = option.env

    cwd = Path.cwd()
    for key, given in flags.items():
        option = BY_KEY[key]
        try:
            if option.repeatable:
                values[key] = [option.from_text(text, cwd) for text in given]
            else:
                values[key] = option.from_text(given, cwd)
        except ValueError as error:
            raise ConfigError(f"{option.flag}: {error}") from None
        sources[key] = option.flag
    return Layered(values, sources, path)


def resolve(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """The daemon's settings from every layer, read afresh: what ``edged serve`` starts with and what SIGHUP
    reloads. ``argv`` is ``serve``'s flags, with or without the leading ``serve``. Raises ``ConfigError``."""
    return settings_from(load(argv, environ), environ)


def settings_from(layered: Layered, environ: Mapping[str, str]) -> Settings:
    if not layered.values["model_repository"]:
        raise ConfigError(
            f"no model repository: give --model-repository PATH, model_repository in the config file or "
            f"{BY_KEY['model_repository'].env}",
            USAGE_STATUS,
        )
    try:
        return Settings.from_options(layered.values, environ, config_file=layered.config_file)
    except ValueError as error:
        # Each value was checked on its own; this is a check across several, so it names the settings it read.
        raise ConfigError(str(error)) from None


def _config_file(flag: str | None, environ: Mapping[str, str]) -> tuple[Path | None, str]:
    """The file to read and why: named (then it must exist) or the default one when it exists."""
    if flag:
        return Path(flag), "--config"
    if named := environ.get(CONFIG_ENV):
        return Path(named), CONFIG_ENV
    if DEFAULT_CONFIG_FILE.is_file():
        return DEFAULT_CONFIG_FILE, "default"
    return None, ""


def _read_file(path: Path, reason: str) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as error:
        named = f" (named by {reason})" if reason != "default" else ""
        raise ConfigError(f"config file {path}{named}: cannot read it: {error.strerror or error}") from None
    except ValueError as error:  # tomllib.TOMLDecodeError, or bytes that are not UTF-8
        raise ConfigError(f"config file {path}: not valid TOML: {error}") from None
    base = path.parent.absolute()
    values: dict[str, Any] = {}
    for key, value in data.items():
        option = BY_KEY.get(key)
        if option is None:
            close = difflib.get_close_matches(key, BY_KEY, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"config file {path}: unknown key '{key}'{hint}")
        try:
            if option.repeatable:
                items = value if isinstance(value, list) else [value]
                values[key] = [option.from_toml(item, base) for item in items]
            else:
                values[key] = option.from_toml(value, base)
        except ValueError as error:
            raise ConfigError(f"config file {path}: key {key}: {error}") from None
    return values


def _from_env(option: Option, text: str) -> Any:
    cwd = Path.cwd()
    if not option.repeatable:
        return option.from_text(text, cwd)
    if text.lstrip().startswith("["):
        try:
            items = tomllib.loads(f"value = {text}")["value"]
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"not a TOML array: {error}") from None
        return [option.from_toml(item, cwd) for item in items]
    items = [item for item in text.split(ENV_LIST_SEPARATOR) if item]
    try:
        return [option.from_text(item, cwd) for item in items]
    except ValueError as error:
        if len(items) < 2:
            raise
        raise ValueError(
            f"{error} (values are separated by '{ENV_LIST_SEPARATOR}'; write a TOML array, "
            f"{option.env}='[\"...\"]', for a value that holds one)"
        ) from None


# --- what `edged config` prints -----------------------------------------------------------------------------

_COMMENT_COLUMN: Final = 48


def render(layered: Layered) -> str:
    """The effective configuration as a config file: one ``key = value`` line per option, with its source in a
    trailing comment; an unset option is a comment saying what it means."""
    if layered.config_file is not None:
        file_line = f"# config file: {layered.config_file}"
    else:
        file_line = f"# config file: none ({DEFAULT_CONFIG_FILE} does not exist)"
    lines = [
        "# edged: effective configuration of `edged serve`",
        "# precedence: default < config file < EDGED_* environment < flags; each line ends with its source",
        file_line,
    ]
    for option in OPTIONS:
        value = layered.values[option.key]
        source = layered.sources[option.key]
        if value is None:
            # An empty string reads back as unset, so the printed configuration still works as a config file.
            setting, source = f'{option.key} = ""', f"{source} (unset: {option.unset})"
        else:
            setting = f"{option.key} = {option.literal(_plain(value))}"
        lines.append(f"{setting.ljust(_COMMENT_COLUMN)}  # {source}")
    return "\n".join(lines) + "\n"


def template() -> str:
    """The packaged ``edged.toml``: every key with a line of explanation, commented out at its default."""
    lines = [
        "# edged configuration (TOML): /etc/edged/edged.toml, or the file named by --config PATH or $EDGED_CONFIG.",
        "#",
        "# Precedence: built-in defaults < this file < EDGED_* environment variables < `edged serve` flags.",
        "# A key is its flag without the dashes, with _ for - (--http-port: http_port); its environment variable",
        "# is EDGED_ and the key in upper case (EDGED_HTTP_PORT). Booleans take true/false (or on/off, 1/0).",
        "# A repeatable flag is an array here; in the environment its values are separated by ':', or written",
        '# as a TOML array when one holds a colon: EDGED_LOAD_MODEL=a:b, EDGED_LOAD_MODEL=\'["a", "b"]\'.',
        "# Relative paths here are relative to this file's directory. `edged config` prints the effective values.",
        "#",
        "# Each commented line shows the built-in default; uncomment it to change the value. The lines that are set",
        "# are the service's own choices; each names the default of `edged serve` that it replaces.",
    ]
    for option in OPTIONS:
        unset = f"; unset: {option.unset}" if option.default is None else ""
        explanation = f"{option.help} ({option.flag}, {option.env}){unset}."
        lines += [
            "",
            *textwrap.wrap(
                explanation,
                width=116,
                initial_indent="# ",
                subsequent_indent="#   ",
                break_on_hyphens=False,
                break_long_words=False,
            ),
        ]
        if option.packaged is not None:
            default = "unset" if option.default is None else option.literal(option.default)
            lines.append(f"# (edged serve's default: {default})")
            lines.append(f"{option.key} = {option.packaged}")
        elif option.default is None:
            lines.append(f'#{option.key} = ""')
        else:
            lines.append(f"#{option.key} = {option.literal(option.default)}")
    return "\n".join(lines) + "\n"


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value
