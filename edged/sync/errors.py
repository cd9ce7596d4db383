"""How a sync run fails: one exception, with the kind of failure an operator has to act on."""

from __future__ import annotations

import enum
from typing import Final

from edged.core.names import escape_controls

# Where the object-store clients come from (MISSING_CLIENT): the edged-sync package on a device installed from the
# .deb, the sync extra where edged was installed with pip.
INSTALL_HINT: Final = "install the edged-sync package, or edged[sync] with pip"


class SourceProblem(enum.Enum):
    """Why a sync run failed, as an operator must tell the cases apart."""

    BAD_URL = "bad repository URL"
    MISSING_CLIENT = "object-store client not installed"
    CREDENTIALS = "credentials missing or malformed"
    UNREACHABLE = "endpoint unreachable"
    DENIED = "access denied (wrong or expired credentials, or no permission)"
    WRONG_REGION = "wrong region for the bucket"
    NOT_FOUND = "bucket or object not found"
    CHANGED = "object changed during the sync"
    REFUSED = "repository refused"
    VERIFY_FAILED = "verification failed"
    # A signed source whose metadata fails TUF's checks (wrong key, expired, rolled back, mixed, endless, absent).
    UNTRUSTED = "signed metadata refused"
    BUSY = "another sync of the same source is running"
    NO_SPACE = "not enough free disk space"
    OTHER = "remote error"


class SyncError(Exception):
    """A sync run failed; the current snapshot is untouched. ``problem`` says which kind of failure it was."""

    def __init__(self, problem: SourceProblem, message: str) -> None:
        # A message quotes what the remote chose (a key, an error text of the store): its control characters are
        # escaped here, the one place every sync failure passes, before it reaches the journal, the sync API and
        # the console.
        super().__init__(f"{problem.value}: {escape_controls(message)}")
        self.problem = problem
