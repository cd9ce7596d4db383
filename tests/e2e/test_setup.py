"""``scripts/setup`` without ``EDGED_SETUP_FOR_TESTS`` (what ``scripts/run`` runs): a virtualenv that runs edged and
holds none of the test extra: no test framework, no machine learning framework, no browser driver, no emulator.

It runs the script itself, in a copy of this checkout (what git sees), so that it checks the packages the script
asks pip for, not only what pyproject.toml declares: the test extra was declared apart all along, and it was the
script that installed it for running too. pip's cache makes a second run quick; a cold one downloads about 100 MB
from PyPI and compiles systemd-python.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Final

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from server import REPO_ROOT

pytestmark = pytest.mark.slow

SETUP_TIMEOUT_S: Final = 1800
# What running needs stays in a few hundred MB (about 310 MiB: ONNX Runtime, numpy and SQLAlchemy are most of it);
# the test extra is gigabytes.
MAX_VENV_MIB: Final = 400
# Named as well as derived from the extra below, so that a renamed extra cannot make the check pass empty-handed.
NEVER: Final = {"pytest", "playwright", "moto", "torch", "tensorflow", "tensorflow-cpu", "openvino"}


def _copy_checkout(destination: Path) -> None:
    listed = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        path = REPO_ROOT / name
        if path.is_symlink() or path.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination / name, follow_symlinks=False)


def _du_mib(path: Path) -> float:
    """The space the tree takes on disk, as du counts it (hard links once)."""
    seen: set[tuple[int, int]] = set()
    blocks = 0
    for directory, _, files in os.walk(path):
        for name in [".", *files]:
            info = os.lstat(os.path.join(directory, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                blocks += info.st_blocks
    return blocks * 512 / 2**20


def _setup(checkout: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("EDGED_SETUP_FOR_TESTS", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(checkout / "scripts/setup")],
        capture_output=True,
        text=True,
        env=env,
        timeout=SETUP_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_setup_for_running_installs_edged_and_none_of_the_tests_packages(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    _copy_checkout(checkout)
    first = _setup(checkout)
    assert first.returncode == 0, first.stdout + first.stderr
    venv = checkout / ".venv"

    listed = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = {canonicalize_name(package["name"]) for package in json.loads(listed)}
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = {canonicalize_name(Requirement(line).name) for line in project["dependencies"]}
    for_tests = {canonicalize_name(Requirement(line).name) for line in project["optional-dependencies"]["test"]}
    assert {"edged", "onnxruntime"} <= installed
    assert runtime <= installed | {"systemd-python"}  # not on every platform
    assert installed & (NEVER | (for_tests - runtime)) == set()

    help_text = subprocess.run(
        [str(venv / "bin/edged"), "serve", "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "--model-control-mode" in help_text
    size = _du_mib(venv)
    assert size < MAX_VENV_MIB, f"the virtualenv takes {size:.0f} MiB"

    again = _setup(checkout)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "setup: up to date" in again.stdout, again.stdout
