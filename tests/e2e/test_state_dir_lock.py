"""One daemon per state directory (edged.state.lock): a second ``edged serve`` on a state directory in use exits
non-zero at once, naming the directory and the pid that holds it, and the first serves on; the administration
commands still open the database beside the running daemon; once the first is gone, stopped or SIGKILLed, the
directory is free again. Real daemons, real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from server import REPO_ROOT, TRACEBACK_MARKER, Server, request, run_server

from edged.state.lock import LOCK_NAME

# Generous: the refusal comes before anything slow, but the machine may be loaded.
TIMEOUT_S = 120


def _second_daemon(first: Server) -> subprocess.CompletedProcess[str]:
    """``edged serve`` with the first daemon's very arguments: the same state directory, and the same ports too,
    so that a daemon that bound a port before it looked at the lock would fail on the port instead."""
    return subprocess.run(
        first.args,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _edged(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _live(server: Server) -> bool:
    return request(server.http_url, "GET", "/v2/health/live").status == 200


def test_a_second_daemon_on_the_same_state_dir_is_refused(bundled_repository: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with run_server([bundled_repository], f"--state-dir={state}") as first:
        assert (state / LOCK_NAME).read_text().strip() == str(first.process.pid)
        second = _second_daemon(first)
        output = second.stdout + second.stderr
        assert second.returncode != 0, output
        assert f"state directory {state} is in use by another edged (pid {first.process.pid})" in output, output
        assert TRACEBACK_MARKER not in output, output
        # Refused before the ports: a port in use would have been the complaint otherwise; and before the models.
        assert "address already in use" not in output.lower(), output
        assert "loaded" not in output, output
        assert _live(first) and first.process.poll() is None

        # The administration commands share the database with the running daemon on purpose.
        made = _edged("token", "--state-dir", str(state), "create", "--name", "ci", "--role", "viewer")
        assert made.returncode == 0, made.stdout + made.stderr
        listed = _edged("token", "--state-dir", str(state), "list")
        assert listed.returncode == 0 and "ci" in listed.stdout, listed.stdout + listed.stderr
        assert _live(first)

    # Stopped in order: the directory is free, and the file names no process any more.
    assert (state / LOCK_NAME).read_text() == ""
    with run_server([bundled_repository], f"--state-dir={state}") as again:
        assert _live(again)


def test_a_killed_daemon_leaves_no_stale_lock(bundled_repository: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with run_server([bundled_repository], f"--state-dir={state}") as first:
        first.killed = True
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(TIMEOUT_S)
    # The dead daemon's pid is still in the file: only the kernel's lock counts, and it went with the process.
    assert (state / LOCK_NAME).read_text().strip() == str(first.process.pid)
    with run_server([bundled_repository], f"--state-dir={state}") as again:
        assert (state / LOCK_NAME).read_text().strip() == str(again.process.pid)
        assert _live(again)
