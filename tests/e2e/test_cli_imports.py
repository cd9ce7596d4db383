"""What each ``edged`` command imports: only what it uses, so that a command that needs no database, model or
server starts in the time of the interpreter, and only a database older than this edged pays for Alembic; the
state database is used through SQLAlchemy Core alone, by the commands and the daemon alike."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from console_session import console_server, create_user, http_login
from server import REPO_ROOT, request

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


# SQLAlchemy's ORM and extensions: the state store uses Core only, and the ORM costs megabytes to import.
ORM: Final = ("sqlalchemy.orm", "sqlalchemy.ext")


def _imported(*args: str, stdin: str | None = None) -> set[str]:
    """The modules ``edged ARGS`` imports, as the interpreter itself reports them (-X importtime)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "edged", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=REPO_ROOT,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    modules = _reported(result.stderr)
    assert "edged.cli" in modules, result.stderr  # the report is read right
    return modules


def _reported(output: str) -> set[str]:
    """The modules named in the interpreter's import time report within ``output``, other lines ignored."""
    lines = [line for line in output.splitlines() if line.startswith("import time:")]
    return {line.rsplit("|", 1)[1].strip() for line in lines} - {"imported package"}  # less the table's heading


def _heavy(modules: set[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    return sorted(name for name in modules if any(name == top or name.startswith(top + ".") for top in heavy))


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


def test_the_commands_use_the_state_database_without_the_orm() -> None:
    with tempfile.TemporaryDirectory(prefix="edged-cli-") as state:
        password = "correct-horse-battery-staple\n"
        for argv, stdin in (
            (["token", "--state-dir", state, "create", "--name", "ci", "--role", "viewer"], None),
            (["token", "--state-dir", state, "list"], None),
            (["token", "--state-dir", state, "revoke", "ci"], None),
            (
                ["admin", "--state-dir", state, "create", "--name", "ada", "--role", "admin", "--password-stdin"],
                password,
            ),
            (["admin", "--state-dir", state, "list"], None),
            (["admin", "--state-dir", state, "disable", "ada"], None),
        ):
            modules = _imported(*argv, stdin=stdin)
            assert "edged.state.store" in modules, argv  # the command did open the database
            assert _heavy(modules, ORM) == [], argv


def test_the_daemon_uses_the_state_database_without_the_orm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon at work: start-up (models loaded, the desired set), a console login (a session, an audit event),
    the history of both, a model unloaded and loaded again through the API, a gRPC call."""
    state = tmp_path / "state"
    state.mkdir()
    create_user(state, "ada", "admin")
    # The daemon inherits the environment: it writes the import time report to its log.
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    with console_server([REPO_ROOT / "model_repository"], state, users={}) as server:
        console = http_login(server.console_port, "ada")
        status, _, page = console.request("GET", "/history")
        assert status == 200 and "add_sub" in page, page[:500]
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.unload_model("add_sub")
            client.load_model("add_sub")
            assert client.is_model_ready("add_sub")
        reply = request(server.http_url, "GET", "/v2/edged/models/add_sub/history")
        assert reply.status == 200, reply.body
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc_client.is_server_live()
        grpc_client.close()
        log = server.log()  # read before the daemon stops: its log goes with it
    modules = _reported(log)
    assert {"sqlalchemy", "edged.state.store", "edged.state.accounts"} <= modules, log[-3000:]
    assert _heavy(modules, ORM) == []
    # The gRPC endpoint is edged's own HTTP/2: grpc's core (about 10 MiB resident) is a frontend worker's alone.
    assert "edged.frontends.grpc.server" in modules
    assert _heavy(modules, ("grpc",)) == []
