"""Poll mode's decision, apart from its I/O: given the model folders as a poll found them, which models to unload
(their folder is gone) and which to (re)load (their folder changed since they were loaded and has settled).

A folder still being written is never loaded: a change is acted on once two consecutive polls saw the folder
identical (names, sizes, modification times) and nothing in it changed for ``SETTLE_S`` seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from edged.core.repository.files import FolderPrint, is_settled

if TYPE_CHECKING:
    from edged.core.repository.manager import ModelEntry

log = logging.getLogger(__name__)

# A changed folder must have been left alone this long before poll mode loads it.
SETTLE_S: Final = 2.0


class FolderWatch:
    """Each folder's fingerprint at the previous poll, to see that it stopped changing."""

    def __init__(self) -> None:
        self._previous: dict[str, Any] = {}
        # Models whose folder went away: one that comes back is loaded even when its files are the very ones it
        # had (a copy that keeps modification times), since what was loaded from them is gone.
        self._gone: set[str] = set()

    def changes(
        self,
        prints: Mapping[str, FolderPrint | None],
        loaded: list[str],
        entry: Callable[[str], ModelEntry | None],
        serves: Callable[[str], bool],
    ) -> tuple[list[str], list[str]]:
        """(models to unload, models to load) for the folders ``prints`` found, beside the ``loaded`` models."""
        unload: list[str] = []
        load: list[str] = []
        for name in sorted(set(prints) | set(loaded)):
            folder = prints.get(name)
            if folder is None:
                self._previous.pop(name, None)
                if entry(name) is not None:
                    self._gone.add(name)
                if serves(name):
                    log.info("model '%s' was removed from the repository: unloading it", name)
                    unload.append(name)
                continue
            key = folder.key()
            previous, self._previous[name] = self._previous.get(name), key
            current = entry(name)
            back = name in self._gone
            if not back and current is not None and current.folder is not None and current.folder.key() == key:
                continue  # unchanged since it was loaded
            if previous != key or not is_settled(folder, SETTLE_S):
                log.debug("model folder '%s' changed; waiting for it to settle", name)
                continue
            log.info("model folder '%s' %s: loading it", name, "is back" if back else "changed")
            self._gone.discard(name)
            load.append(name)
        return unload, load
