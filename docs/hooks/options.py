"""The settings tables of the documentation, made from ``edged.config.OPTIONS`` while the site is built.

``edged.config.options`` is the one table of ``edged serve``'s settings: the flags, the keys of edged.toml, the
``EDGED_*`` variables, ``edged config`` and the packaged edged.toml are all derived from it, and so are the tables
in these pages. A page asks for one with a line of its own:

    <!-- options -->                                  every setting, in the table's order
    <!-- options: sync-* device-id -->                the settings these names (fnmatch patterns) select

and the line is replaced by a Markdown table of the settings: flag, key and variable, default (and the packaged
edged.toml's value where it sets one), meaning, with the limits and choices the option checks. A name that selects
nothing fails the build, so a renamed or removed setting cannot leave a page describing it.

mkdocs.yml names this file under ``hooks:``; tests/unit/test_docs.py calls ``expand`` directly.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

from edged.config.options import OPTIONS

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

    from edged.config.option import Option

MARKER: Final = re.compile(r"^<!-- options(?::(?P<names>[^>]*))? -->[ \t]*$", re.MULTILINE)
HEADER: Final = "| setting | default | meaning |\n|---|---|---|\n"
MIB: Final = 1024 * 1024
# A flag named in a help text (--http-min-body-rate) is shown as code.
FLAG_IN_TEXT: Final = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# What Markdown would take for markup in a help text; each is written escaped (< and > as entities: Markdown has
# no backslash escape for them).
MARKUP: Final = re.compile(r"([\\`*_\[\]|])")


class UnknownOptionError(ValueError):
    """A marker names a setting that edged.config.OPTIONS does not have."""


def select(patterns: Sequence[str], options: Sequence[Option] = OPTIONS) -> list[Option]:
    """The options whose names match one of ``patterns``, in the table's order; every pattern must match one."""
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(option.name, pattern) for option in options):
            raise UnknownOptionError(f"no setting of edged serve is named '{pattern}' (edged/config/options.py)")
    return [option for option in options if any(fnmatch.fnmatchcase(option.name, p) for p in patterns)]


def table(options: Iterable[Option]) -> str:
    """A Markdown table of ``options``, one row each."""
    return HEADER + "".join(_row(option) for option in options)


def expand(markdown: str) -> str:
    """``markdown`` with every options marker replaced by its table."""

    def replace(match: re.Match[str]) -> str:
        names = match.group("names")
        chosen = OPTIONS if names is None else select(names.split())
        return table(chosen).rstrip("\n")

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files, **kwargs: Any) -> str:
    """MkDocs' hook: every page is expanded before it is rendered."""
    return expand(markdown)


def _row(option: Option) -> str:
    flag = f"`{option.flag} {option.metavar}`" if option.metavar else f"`{option.flag}`"
    names = [flag, *(f"`--{alias}`" for alias in option.aliases), f"`{option.key}`", f"`{option.env}`"]
    return f"| {'<br>'.join(names)} | {_default(option)} | {_meaning(option)} |\n"


def _default(option: Option) -> str:
    value = option.default_value()
    if value is None or value == []:
        shown = _text(option.unset) if option.unset else "none"
    else:
        shown = f"`{option.literal(value)}`"
        if option.metavar == "BYTES" and isinstance(value, int) and value >= MIB and value % MIB == 0:
            shown += f" ({_size(value)})"
    if option.packaged is not None:
        shown += f"<br>packaged: `{option.packaged}`"
    return shown


def _meaning(option: Option) -> str:
    help_text = _text(option.help)
    parts = [help_text if help_text.endswith(".") else help_text + "."]
    if option.choices:
        parts.append("One of " + ", ".join(f"`{choice}`" for choice in option.choices) + ".")
    if option.low is not None or option.high is not None:
        parts.append(_bounds(option))
    if option.repeatable:
        parts.append("Repeatable.")
    return " ".join(parts)


def _bounds(option: Option) -> str:
    low = _number(option.low) if option.low is not None else None
    high = _number(option.high) if option.high is not None else None
    if low is not None and high is not None:
        return f"From {low} to {high}."
    return f"At least {low}." if low is not None else f"At most {high}."


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _size(value: int) -> str:
    return f"{value // (1024 * MIB)} GiB" if value % (1024 * MIB) == 0 else f"{value // MIB} MiB"


def _text(text: str) -> str:
    escaped = MARKUP.sub(r"\\\1", text).replace("<", "&lt;").replace(">", "&gt;")
    return FLAG_IN_TEXT.sub(lambda match: f"`{match.group(0)}`", escaped)
