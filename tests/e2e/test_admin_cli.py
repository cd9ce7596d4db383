"""``edged admin``: console users made, listed, disabled and given new passwords from the command line, as an
installer script or a technician on the device does; checked in the state database and by logging in."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from server import REPO_ROOT, TRACEBACK_MARKER

from edged.core.access import Role
from edged.core.accounts import Accounts, LoginRefused, NewSession
from edged.state.store import DB_NAME, StateStore

TIMEOUT_S = 120
PASSWORD = "correct horse battery"
OTHER = "another long passphrase"


def _admin(
    state_dir: Path | None, *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    where = ["--state-dir", str(state_dir)] if state_dir is not None else []
    result = subprocess.run(
        [sys.executable, "-m", "edged", "admin", *where, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=REPO_ROOT,
        env=env,
        check=False,
        # No controlling terminal, even when the tests run in one: getpass then reads standard input, not /dev/tty.
        start_new_session=True,
    )
    assert TRACEBACK_MARKER not in result.stdout + result.stderr, result.stdout + result.stderr
    return result


def _login(state_dir: Path, name: str, password: str) -> NewSession | LoginRefused:
    with StateStore.open(state_dir) as store:
        return Accounts(store).login(name, password, "192.0.2.1")


def test_create_then_list_shows_users_without_hashes(tmp_path: Path) -> None:
    made = _admin(tmp_path, "create", "--name", "alice", "--role", "admin", "--password-stdin", stdin=PASSWORD + "\n")
    assert made.returncode == 0, made.stderr
    assert made.stdout == ""
    assert "user 'alice' (admin) created" in made.stderr
    viewer = _admin(tmp_path, "create", "--name", "bob", "--role", "viewer", "--password-stdin", stdin=OTHER)
    assert viewer.returncode == 0, viewer.stderr

    listed = _admin(tmp_path, "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "ROLE", "STATE"]
    assert [line.split()[:3] for line in lines[1:]] == [["alice", "admin", "active"], ["bob", "viewer", "active"]]
    assert "argon2" not in listed.stdout and "$" not in listed.stdout
    assert PASSWORD not in listed.stdout + listed.stderr + made.stderr

    hashes = sqlite3.connect(tmp_path / DB_NAME).execute("SELECT password_hash FROM users").fetchall()
    assert all(str(stored).startswith("$argon2id$") for (stored,) in hashes)
    login = _login(tmp_path, "alice", PASSWORD)
    assert isinstance(login, NewSession) and login.session.role == Role.ADMIN


def test_a_weak_password_is_refused_with_the_rule(tmp_path: Path) -> None:
    short = _admin(tmp_path, "create", "--name", "alice", "--role", "admin", "--password-stdin", stdin="hunter2\n")
    assert short.returncode == 1
    assert short.stderr == "edged: a password needs at least 12 characters\n"
    named = _admin(
        tmp_path, "create", "--name", "alice", "--role", "admin", "--password-stdin", stdin="alice-alice-alice\n"
    )
    assert named.returncode == 1
    assert "may not contain the user name" in named.stderr
    empty = _admin(tmp_path, "create", "--name", "alice", "--role", "admin", "--password-stdin")
    assert empty.returncode == 1
    assert "standard input is empty" in empty.stderr
    assert _admin(tmp_path, "list").stdout.splitlines()[1:] == []


def test_a_taken_name_and_a_bad_role_are_refused(tmp_path: Path) -> None:
    assert (
        _admin(tmp_path, "create", "--name", "al", "--role", "operator", "--password-stdin", stdin=PASSWORD).returncode
        == 0
    )
    again = _admin(tmp_path, "create", "--name", "al", "--role", "viewer", "--password-stdin", stdin=OTHER)
    assert again.returncode == 1
    assert "a user named 'al' exists already" in again.stderr
    bad_role = _admin(tmp_path, "create", "--name", "x", "--role", "root", "--password-stdin", stdin=PASSWORD)
    assert bad_role.returncode == 2  # argparse's usage error
    assert "invalid choice: 'root'" in bad_role.stderr
    bad_name = _admin(tmp_path, "create", "--name", "a b", "--role", "viewer", "--password-stdin", stdin=PASSWORD)
    assert bad_name.returncode == 1
    assert "user name is 1 to 64 characters" in bad_name.stderr


def test_passwd_changes_the_password_and_ends_sessions(tmp_path: Path) -> None:
    _admin(tmp_path, "create", "--name", "alice", "--role", "operator", "--password-stdin", stdin=PASSWORD)
    before = _login(tmp_path, "alice", PASSWORD)
    assert isinstance(before, NewSession)
    weak = _admin(tmp_path, "passwd", "alice", "--password-stdin", stdin="short\n")
    assert weak.returncode == 1 and "at least 12 characters" in weak.stderr
    changed = _admin(tmp_path, "passwd", "alice", "--password-stdin", stdin=OTHER + "\n")
    assert changed.returncode == 0, changed.stderr
    assert "1 session(s) ended" in changed.stderr
    with StateStore.open(tmp_path) as store:
        assert Accounts(store).session(before.secret) is None
    assert isinstance(_login(tmp_path, "alice", PASSWORD), LoginRefused)
    assert isinstance(_login(tmp_path, "alice", OTHER), NewSession)
    unknown = _admin(tmp_path, "passwd", "carol", "--password-stdin", stdin=OTHER)
    assert unknown.returncode == 1 and "no user named 'carol'" in unknown.stderr


def test_disable_stops_logins(tmp_path: Path) -> None:
    _admin(tmp_path, "create", "--name", "alice", "--role", "viewer", "--password-stdin", stdin=PASSWORD)
    disabled = _admin(tmp_path, "disable", "alice")
    assert disabled.returncode == 0, disabled.stderr
    assert [line.split()[:3] for line in _admin(tmp_path, "list").stdout.splitlines()[1:]] == [
        ["alice", "viewer", "disabled"]
    ]
    assert isinstance(_login(tmp_path, "alice", PASSWORD), LoginRefused)
    missing = _admin(tmp_path, "disable", "nobody")
    assert missing.returncode == 1 and "no user named 'nobody'" in missing.stderr


def test_the_state_dir_comes_from_the_config_file_or_the_environment(tmp_path: Path) -> None:
    from_file, from_env = tmp_path / "from-file", tmp_path / "from-env"
    config = tmp_path / "edged.toml"
    config.write_text(f'state_dir = "{from_file}"\n')
    env = {key: value for key, value in os.environ.items() if key not in ("EDGED_STATE_DIR", "STATE_DIRECTORY")}
    made = _admin(
        None,
        "--config",
        str(config),
        "create",
        "--name",
        "filed",
        "--role",
        "viewer",
        "--password-stdin",
        stdin=PASSWORD,
        env=env,
    )
    assert made.returncode == 0, made.stderr
    with StateStore.open(from_file) as store:
        assert [user.name for user in store.users()] == ["filed"]
    env["EDGED_STATE_DIR"] = str(from_env)
    made = _admin(None, "create", "--name", "envy", "--role", "viewer", "--password-stdin", stdin=PASSWORD, env=env)
    assert made.returncode == 0, made.stderr
    with StateStore.open(from_env) as store:
        assert [user.name for user in store.users()] == ["envy"]


def test_without_password_stdin_the_password_is_asked_twice(tmp_path: Path) -> None:
    # No terminal here: getpass reads the two answers from standard input (and warns that they may echo).
    differ = _admin(tmp_path, "create", "--name", "alice", "--role", "admin", stdin=f"{PASSWORD}\n{OTHER}\n")
    assert differ.returncode == 1
    assert "the two passwords differ" in differ.stderr
    made = _admin(tmp_path, "create", "--name", "alice", "--role", "admin", stdin=f"{PASSWORD}\n{PASSWORD}\n")
    assert made.returncode == 0, made.stderr
    assert isinstance(_login(tmp_path, "alice", PASSWORD), NewSession)
