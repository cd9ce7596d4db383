"""Where the state database lives when ``--state-dir`` is not given.

The order, first match wins:

1. ``$EDGED_STATE_DIR``, as the operator set it.
2. ``$STATE_DIRECTORY``: systemd sets it for a unit with ``StateDirectory=edged`` and has already created the
   directory with the service user as owner, so it is the exact path to use (the first one, if several).
3. ``/var/lib/edged`` when running as a systemd system service: ``$INVOCATION_ID`` is set (systemd sets it for
   every unit it starts) and the process either runs as root or can write to ``/var/lib/edged`` already (a
   dedicated user whose directory tmpfiles.d or the package made). A ``systemd --user`` unit sets
   ``$INVOCATION_ID`` as well but can write to neither, so it falls through to the per-user directory.
4. The per-user directory of the XDG base directory spec: ``$XDG_STATE_HOME/edged`` or ``~/.local/state/edged``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

SYSTEM_STATE_DIR: Final = Path("/var/lib/edged")


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The state directory to use when none was configured; ``environ`` defaults to ``os.environ``."""
    env = os.environ if environ is None else environ
    if explicit := env.get("EDGED_STATE_DIR"):
        return Path(explicit)
    if systemd_dirs := env.get("STATE_DIRECTORY"):
        return Path(systemd_dirs.split(":")[0])
    if env.get("INVOCATION_ID") and (os.geteuid() == 0 or os.access(SYSTEM_STATE_DIR, os.W_OK | os.X_OK)):
        return SYSTEM_STATE_DIR
    xdg_state = env.get("XDG_STATE_HOME", "")
    # The spec says a relative XDG_STATE_HOME is invalid and must be ignored.
    if xdg_state and Path(xdg_state).is_absolute():
        return Path(xdg_state) / "edged"
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".local" / "state" / "edged"
