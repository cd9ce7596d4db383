"""What each ``edged`` command imports: only what it uses, so that a command that needs no database, model or
server starts in the time of the interpreter, and only a database older than this edged pays for Alembic."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

import pytest
from server import REPO_ROOT

TIMEOUT_S = 120
# What serving needs, and what upgrading an old state database needs: no other command imports them.
HEAVY: Final = (
    "alembic",
    "sqlalchemy",
    "numpy",
    "onnxruntime",
    "grpc",
    "google.protobuf",
    "litestar",
    "uvicorn",
    "prometheus_client",
    "msgspec",
    "argon2",
)


def _imported(*args: str) -> set[str]:
    """The modules ``edged ARGS`` imports, as the interpreter itself reports them (-X importtime)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "edged", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    modules = {line.rsplit("|", 1)[1].strip() for line in lines[1:]}  # the first line is the table's heading
    assert "edged.cli" in modules, result.stderr  # the report is read right
    return modules


def _heavy(modules: set[str]) -> list[str]:
    return sorted(name for name in modules if any(name == top or name.startswith(top + ".") for top in HEAVY))


@pytest.mark.parametrize("argv", [["version"], ["--version"]])
def test_version_imports_no_other_module_of_edged(argv: list[str]) -> None:
    modules = _imported(*argv)
    assert sorted(name for name in modules if name.startswith("edged")) == ["edged", "edged.cli"]
    assert _heavy(modules) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["serve", "--help"],
        ["config", "--template"],
        ["config"],
        ["sync", "--help"],
        ["token", "--help"],
        ["admin", "--help"],
    ],
)
def test_commands_without_a_database_import_nothing_heavy(argv: list[str]) -> None:
    assert _heavy(_imported(*argv)) == []


def test_the_state_database_imports_alembic_only_to_upgrade() -> None:
    with tempfile.TemporaryDirectory(prefix="edged-cli-") as state:  # never the user's own state directory
        for database in ("new", "at this edged's revision"):
            modules = _imported("token", "--state-dir", state, "list")
            assert "sqlalchemy" in modules, database
            assert not [name for name in modules if name.split(".")[0] == "alembic"], database
            assert (Path(state) / "edged.db").is_file()
