"""grpc's core as a frontend worker's relay imports it (edged/frontends/grpc/core.py): with its settings, the
environment left as it was for child processes, and no setting grpc does not know."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# Imports the relay as a frontend worker does, then reports what the environment holds afterwards.
PROBE = "import os, edged.frontends.grpc.relay; print(repr(os.environ.get('GRPC_EXPERIMENTS')))"


def _probe(experiments: str | None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "GRPC_EXPERIMENTS"}
    if experiments is not None:
        env["GRPC_EXPERIMENTS"] = experiments
    return subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True, timeout=60
    )


def test_importing_the_relay_leaves_the_environment_as_it_was_and_grpc_knows_the_setting() -> None:
    done = _probe(None)
    assert done.stdout.strip() == "None"
    # A grpc that dropped the experiment says so on stderr: then the setting in core.py has to go.
    assert "Unknown experiment" not in done.stderr, done.stderr


@pytest.mark.parametrize("chosen", ["", "event_engine_listener"])
def test_an_operators_grpc_experiments_is_kept(chosen: str) -> None:
    assert _probe(chosen).stdout.strip() == repr(chosen)
