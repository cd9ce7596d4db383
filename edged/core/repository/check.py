"""``edged check-repo``: every problem that would keep a model or version of a repository from loading, found
the way the manager loads it, without serving."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from edged.core.devices import DeviceInventory
from edged.core.repository.manager import ManagerOptions, ModelRepositoryManager, ModelState, VersionsUnavailable
from edged.core.repository.scan import scan_repositories
from edged.core.scheduling.rate_limiter import RATE_LIMITER
from edged.errors import EdgedError

if TYPE_CHECKING:
    from pathlib import Path

    from edged.core.backend_api import Backends


def check_repositories(repositories: list[Path], backends: Backends, *, auto_complete: bool) -> list[str]:
    """Every problem that would keep a model or version from loading, one line each, without serving."""
    problems: list[str] = []
    try:
        scan = scan_repositories(repositories)
    except EdgedError as exc:
        return [exc.message]
    for name in sorted(scan.duplicates):
        problems.append(f"{name}: model appears in two or more repositories")
    with ThreadPoolExecutor(1) as executor:
        options = ManagerOptions(repositories, auto_complete=auto_complete, devices=DeviceInventory.discover())
        manager = ModelRepositoryManager(options, executor, backends)
        for name, source in sorted(scan.models.items()):
            try:
                config, versions = manager.read_config(source)
            except VersionsUnavailable as exc:
                problems.append(f"{name}: {exc.error.message}")
                continue
            except EdgedError as exc:
                problems.append(f"{name}: {exc.message}")
                continue
            if config.platform == "ensemble":
                continue  # its steps are checked against the models it is made of, which only a daemon has
            for number in versions:
                version = manager.load_version(source, config, number)
                if version.state is not ModelState.READY:
                    problems.append(f"{name} version {number}: {version.reason}")
                elif version.backend_model is not None:
                    RATE_LIMITER.forget(version.backend_model)
                    version.backend_model.unload()
    return problems
