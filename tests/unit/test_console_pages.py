"""Where the console's setup page says the first-run code is, for each way edged is started."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

from edged.daemon.console import _setup_code_where
from edged.frontends.console.pages import CodeWhere

if TYPE_CHECKING:
    import pytest

    from edged.config.settings import Settings


def _settings(log_file: Path | None) -> Settings:
    return cast("Settings", SimpleNamespace(log_file=log_file))


def test_the_code_is_where_the_log_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    assert _setup_code_where(_settings(None)) == CodeWhere(
        "in the terminal edged was started from, among its first lines"
    )
    monkeypatch.setenv("INVOCATION_ID", "0123456789abcdef")  # what systemd sets for a unit's processes
    assert _setup_code_where(_settings(None)) == CodeWhere("in the journal", 'journalctl -u edged | grep "setup code"')
    # A log file wins: that is where the lines go, under systemd too.
    assert _setup_code_where(_settings(Path("/var/log/edged.log"))) == CodeWhere(
        "in edged's log file, /var/log/edged.log", 'grep "setup code" /var/log/edged.log'
    )
