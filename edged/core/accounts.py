"""Console accounts: users with passwords, their sessions, login throttling, the first-run setup code, CSRF tokens.

The console's login, as ``access`` is the API's: roles are ``access.Role`` (viewer, operator, admin), so a user and
an API token of the same role may do the same things.

- **Passwords** are hashed with argon2id (``PASSWORD_HASHER``'s parameters; a hash made with other parameters is
  redone at the next successful login). The policy (``password_problem``): 12 to 1024 printable characters, not
  containing the user name; no composition rules (NIST SP 800-63B).
- **Sessions**: a 256-bit random secret, given to the caller once (the console puts it in its cookie); only its
  SHA-256 is stored, as for API tokens: so random a secret needs no slow hash. A session ends after ``IDLE_S``
  without use, ``ABSOLUTE_S`` after login, at logout, and when its user's password changes or the user is disabled.
- **Throttling**: failed logins count per client address (``MAX_ADDRESS_FAILURES``, whatever names they tried),
  per user name from that address (``MAX_FAILURES``) and per user name from anywhere (``MAX_NAME_FAILURES``); past
  a limit within ``WINDOW_S``, tries are refused for a delay that doubles with each further failure
  (``lockout_s``). The name-wide count holds back only addresses that have failed themselves: whoever sends wrong
  passwords for a name from one place cannot keep its owner out from another. An IPv6 client counts by its /64 (one
  host has a whole one to pick addresses from). The counts are rows of the state database, at most
  ``MAX_FAILURE_ROWS`` (the oldest go first). An unknown user name costs a password check too and gets the same
  answer as a wrong password, so neither the answer nor its timing says which names exist; a disabled user also
  gets that answer (the audit entry says why).
- **First run**: while no user exists, ``first_run_code()`` is a random code that edged writes to its log at start;
  ``setup_first_admin`` with it makes the first admin (once: the check that no user exists is inside the write).
- **CSRF**: a session's token is an HMAC of its id under a key of its own, compared in constant time.

Every action returns an ``AuditEntry`` (who did what to whom, and how it ended) for the history. Methods are
blocking (SQLite, and argon2 takes tens of milliseconds on purpose): call them off the event loop.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import string
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final, Literal

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError

from edged.core.access import Role

if TYPE_CHECKING:
    from edged.state.accounts import SessionRecord, UserRecord
    from edged.state.store import StateStore

# argon2id, OWASP's first recommended setting: 19 MiB, 2 passes, 1 lane. A check takes about 20 ms on a desktop
# core and 100 to 200 ms on a small ARM board, and its memory is what a device with little RAM can spare for each
# login in progress (MAX_CONCURRENT_HASHES bounds how many): memory hardness matters more than time against GPU
# guessing, and one lane because small devices have few cores and other work to do. RFC 9106's 64 MiB / 4 lanes
# default costs too much there.
PASSWORD_HASHER: Final = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1, type=Type.ID)
# Password checks run at once at most: each holds memory_cost of RAM, and a flood of logins must not exhaust it.
MAX_CONCURRENT_HASHES: Final = 2

PASSWORD_MIN: Final = 12
# argon2 takes any length, but a megabyte password would only cost the device time to hash.
PASSWORD_MAX: Final = 1024
NAME_MAX: Final = 64
NAME_CHARACTERS: Final = frozenset(string.ascii_letters + string.digits + "._@-")

IDLE_S: Final = 30 * 60
ABSOLUTE_S: Final = 12 * 3600
# A session's last use is written at most this often: every write waits on fsync, and pages poll every few seconds.
TOUCH_EVERY_S: Final = 60

# Failed logins before a lockout: of one name from one address; of one address, whatever names it tried (people
# behind one NAT address may each mistype, and a setup code counts here too); of one name from anywhere, which
# holds back only addresses that have failed too.
MAX_FAILURES: Final = 5
MAX_ADDRESS_FAILURES: Final = 2 * MAX_FAILURES
MAX_NAME_FAILURES: Final = MAX_FAILURES
WINDOW_S: Final = 15 * 60
LOCKOUT_BASE_S: Final = 60
LOCKOUT_MAX_S: Final = 15 * 60
# The failed-login table's bound (each failure is a row per count it adds to: three for a login), some 20 MB with its
# index: a flood from many addresses pushes out the oldest rows instead of filling the disk.
MAX_FAILURE_ROWS: Final = 100_000

FIRST_RUN_CODE_S: Final = 60 * 60
# Unambiguous when read from a log and typed: no 0/O, 1/I/L.
_CODE_ALPHABET: Final = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
_CODE_GROUPS: Final = 4  # 4 x 4 characters: about 79 bits

_INVALID: Final = "unknown user name or wrong password"


class AccountError(ValueError):
    """An account action that cannot be done: the message says why, for the person who asked."""


def password_problem(name: str, password: str) -> str | None:
    """Why ``password`` may not be ``name``'s, or None when it may."""
    if len(password) < PASSWORD_MIN:
        return f"a password needs at least {PASSWORD_MIN} characters"
    if len(password) > PASSWORD_MAX:
        return f"a password has at most {PASSWORD_MAX} characters"
    if not password.isprintable():
        return "a password may not contain control characters (tabs, new lines, ...)"
    if name and name.casefold() in password.casefold():
        return "a password may not contain the user name"
    return None


def name_problem(name: str) -> str | None:
    if not 1 <= len(name) <= NAME_MAX or not set(name) <= NAME_CHARACTERS:
        return f"a user name is 1 to {NAME_MAX} characters among letters, digits and . _ @ -"
    return None


def lockout_s(failures: int, limit: int = MAX_FAILURES) -> float:
    """How long tries are refused after ``failures`` recent failures: none below ``limit``, then LOCKOUT_BASE_S
    doubling with each further failure, up to LOCKOUT_MAX_S."""
    if failures < limit:
        return 0.0
    return float(min(LOCKOUT_BASE_S * 2 ** min(failures - limit, 16), LOCKOUT_MAX_S))


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One account action for the history: ``actor`` did ``action`` to ``target`` (a user name) from ``peer``.
    ``actor``: "user:<name>" (a logged-in user, or one that just logged in), "anonymous" (a refused login: the
    name tried is the target), "setup-code" (the first-run setup), or what the caller passed ("cli").
    ``outcome``: done or refused; ``detail`` says why, for the history only (never for the client)."""

    actor: str
    action: Literal[
        "user-create",
        "user-disable",
        "password-set",
        "login",
        "logout",
        "setup",
        "token-create",
        "token-revoke",
        "sync-now",
        "sync-pause",
        "sync-resume",
        "alert-rules-set",
        "alert-webhook-set",
        "alert-webhook-remove",
        "alert-test",
    ]
    target: str
    outcome: Literal["done", "refused"]
    detail: str = ""
    peer: str | None = None


@dataclass(frozen=True, slots=True)
class UserView:
    """What may be shown of a user: never the password hash."""

    name: str
    role: Role
    created_at: datetime
    password_changed_at: datetime
    disabled_at: datetime | None

    @classmethod
    def of(cls, record: UserRecord) -> UserView:
        return cls(record.name, Role(record.role), record.created_at, record.password_changed_at, record.disabled_at)


@dataclass(frozen=True, slots=True)
class Session:
    """A valid session: whose, with what role, until when, and the CSRF token its forms carry."""

    id: str  # the SHA-256 of the secret, as stored; never the secret
    user: str
    role: Role
    created_at: datetime
    expires_at: datetime  # the absolute end; the idle end moves with each use
    csrf_token: str


@dataclass(frozen=True, slots=True)
class NewSession:
    """A login that succeeded: ``secret`` goes into the cookie (shown this once), ``session`` is what it opens."""

    secret: str
    session: Session
    audit: AuditEntry


@dataclass(frozen=True, slots=True)
class LoginRefused:
    """A login refused: ``reason`` "invalid" (the same for an unknown name, a wrong password, a disabled user, a
    wrong setup code) or "throttled" (``retry_after_s`` until a try is taken again); ``message`` may be shown."""

    reason: Literal["invalid", "throttled"]
    message: str
    retry_after_s: float
    audit: AuditEntry


@dataclass
class _Code:
    digest: bytes
    expires_at: datetime


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Accounts:
    """Users and sessions over the state database. ``clock`` is the time (tests move it); ``hasher`` argon2's
    parameters. Thread-safe: the store serialises its transactions, the first-run code has a lock."""

    store: StateStore
    hasher: PasswordHasher = PASSWORD_HASHER
    clock: Callable[[], datetime] = _utcnow
    _code: _Code | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _hashing: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(MAX_CONCURRENT_HASHES), init=False
    )
    _dummy_hash: str | None = field(default=None, init=False)

    # --- users (admins, and edged admin) --------------------------------------------------------------------

    def create_user(self, name: str, role: Role, password: str, *, actor: str) -> tuple[UserView, AuditEntry]:
        """Makes a user; AccountError says why not (a name or password the policy refuses, a name taken)."""
        from edged.state.records import StateError

        record = self._new_user(name, role, password)
        try:
            stored = self.store.add_user(record)
        except StateError as error:
            raise AccountError(str(error)) from None
        assert stored is not None
        return UserView.of(stored), AuditEntry(actor, "user-create", name, "done", f"role {role.value}")

    def has_users(self) -> bool:
        """Whether any user exists (none: the console asks for the first-run setup)."""
        return self.store.count_users() > 0

    def users(self) -> list[UserView]:
        return [UserView.of(record) for record in self.store.users()]

    def disable_user(self, name: str, *, actor: str) -> AuditEntry:
        """Disables ``name`` (it can no longer log in) and ends its sessions; AccountError when there is none."""
        revoked = self.store.disable_user(name, self.clock())
        if revoked is None:
            raise AccountError(f"no user named '{name}'")
        return AuditEntry(actor, "user-disable", name, "done", f"{revoked} session(s) ended")

    def set_password(self, name: str, password: str, *, actor: str) -> AuditEntry:
        """Sets ``name``'s password and ends all its sessions (including the caller's: it logs in again)."""
        problem = password_problem(name, password)
        if problem is not None:
            raise AccountError(problem)
        revoked = self.store.set_password(name, self._hash(password), self.clock())
        if revoked is None:
            raise AccountError(f"no user named '{name}'")
        return AuditEntry(actor, "password-set", name, "done", f"{revoked} session(s) ended")

    def change_password(self, name: str, old: str, new: str, peer: str | None) -> AuditEntry:
        """``name`` sets their own password, proving the old one first as a login does (a wrong one counts as a
        failed login, so an open session left behind cannot be used to guess it); AccountError says why not."""
        now = self.clock()
        keys = _FailureKeys.of(name, peer)
        retry_after = self._retry_after(keys, now)
        if retry_after > 0:
            raise AccountError(f"too many failed tries: try again in {int(retry_after + 0.999)} s")
        user = self.store.find_user(name)
        if user is None or user.disabled_at is not None:
            raise AccountError(f"no user named '{name}'")
        if len(old) > PASSWORD_MAX or not self._verify(user.password_hash, old):
            self._failed(keys, now)
            raise AccountError("the current password is wrong")
        if old == new:
            raise AccountError("the new password is the current one")
        return self.set_password(name, new, actor=f"user:{name}")

    # --- login ---------------------------------------------------------------------------------------------

    def login(self, name: str, password: str, peer: str | None) -> NewSession | LoginRefused:
        """Checks a name and password from the client at ``peer``; a new session, or why not."""
        now = self.clock()
        keys = _FailureKeys.of(name, peer)
        retry_after = self._retry_after(keys, now)
        if retry_after > 0:
            return self._throttled(name, peer, retry_after)
        # An unknown name costs a check against a hash of the same parameters: the same time as a known one. The
        # hash is made before the lookup, so that the first login pays for it whichever kind of name it tries.
        dummy = self._dummy()
        user = self.store.find_user(name)
        stored_hash = user.password_hash if user is not None else dummy
        # Longer than any password may be set to: wrong, and not worth hashing.
        matches = len(password) <= PASSWORD_MAX and self._verify(stored_hash, password)
        if user is None or not matches or user.disabled_at is not None:
            detail = "unknown user" if user is None else "wrong password" if not matches else "user disabled"
            self._failed(keys, now)
            return LoginRefused(
                "invalid", _INVALID, 0.0, AuditEntry("anonymous", "login", name, "refused", detail, peer)
            )
        # Only the name's counts: an attacker who knows one password must not reset an address's count with it.
        for key in keys.of_name():
            self.store.clear_login_failures(key)
        if self._needs_rehash(user.password_hash):
            self.store.rehash_password(name, user.password_hash, self._hash(password))
        return self._open_session(user.name, Role(user.role), peer, now, "login")

    def session(self, secret: str) -> Session | None:
        """The valid session whose secret (the cookie's value) this is, its last use moved to now; None for an
        unknown, revoked, idle or expired session, or one whose user is disabled."""
        if not secret or len(secret) > 256:
            return None
        found = self.store.find_session(_digest(secret))
        if found is None:
            return None
        record, user = found
        now = self.clock()
        if record.revoked_at is not None or user.disabled_at is not None:
            return None
        if now >= record.expires_at or now >= record.last_seen_at + timedelta(seconds=IDLE_S):
            return None
        if now - record.last_seen_at >= timedelta(seconds=TOUCH_EVERY_S):
            self.store.touch_session(record.id, now)
        return _session(record, Role(user.role))

    def logout(self, secret: str) -> AuditEntry | None:
        """Ends the session of ``secret``; None when there was no open one."""
        found = self.store.find_session(_digest(secret)) if secret and len(secret) <= 256 else None
        if found is None or not self.store.revoke_session(found[0].id, self.clock()):
            return None
        return AuditEntry(f"user:{found[0].user}", "logout", found[0].user, "done", peer=found[0].peer)

    # --- first run -----------------------------------------------------------------------------------------

    def first_run_code(self) -> str | None:
        """While no user exists: a new setup code, valid for FIRST_RUN_CODE_S, for edged to write to its log at
        start (it replaces any earlier one); None once a user exists. Only its digest is kept."""
        if self.store.count_users():
            return None
        now = self.clock()
        with self._lock:
            code = "-".join("".join(secrets.choice(_CODE_ALPHABET) for _ in range(4)) for _ in range(_CODE_GROUPS))
            self._code = _Code(_code_digest(code), now + timedelta(seconds=FIRST_RUN_CODE_S))
            return code

    def setup_first_admin(self, code: str, name: str, password: str, peer: str | None) -> NewSession | LoginRefused:
        """Makes the first admin with the setup code and logs it in. A wrong or expired code counts as a failed
        login of the address; AccountError for a name or password the policy refuses (the code stays valid)."""
        now = self.clock()
        # By address only: the code has about 79 bits, and a count of its own would let anyone lock the
        # technician out of the setup by sending wrong codes.
        keys = _FailureKeys.of(None, peer)
        retry_after = self._retry_after(keys, now)
        if retry_after > 0:
            return self._throttled(name, peer, retry_after, action="setup")
        with self._lock:
            current = self._code
            valid = (
                current is not None
                and current.expires_at > now
                and hmac.compare_digest(current.digest, _code_digest(code))
            )
        if not valid:
            self._failed(keys, now)
            detail = "expired setup code" if current is not None and current.expires_at <= now else "wrong setup code"
            audit = AuditEntry("setup-code", "setup", name, "refused", detail, peer)
            return LoginRefused("invalid", "the setup code is wrong or has expired", 0.0, audit)
        record = self._new_user(name, Role.ADMIN, password)
        if self.store.add_user(record, only_if_none=True) is None:
            with self._lock:
                self._code = None
            audit = AuditEntry("setup-code", "setup", name, "refused", "a user exists already", peer)
            return LoginRefused("invalid", "the setup code is wrong or has expired", 0.0, audit)
        with self._lock:
            self._code = None  # used: it works once
        return self._open_session(name, Role.ADMIN, peer, now, "setup")

    # --- CSRF ----------------------------------------------------------------------------------------------

    def verify_csrf(self, session: Session, token: str) -> bool:
        """Whether ``token`` (from a form or the X-CSRF-Token header) is ``session``'s, in constant time."""
        return hmac.compare_digest(session.csrf_token.encode(), token.encode("utf-8", "replace"))

    # --- inside --------------------------------------------------------------------------------------------

    def _new_user(self, name: str, role: Role, password: str) -> UserRecord:
        from edged.state.accounts import UserRecord

        problem = name_problem(name) or password_problem(name, password)
        if problem is not None:
            raise AccountError(problem)
        now = self.clock()
        return UserRecord(name, role.value, self._hash(password), now, now, None)

    def _open_session(
        self, name: str, role: Role, peer: str | None, now: datetime, action: Literal["login", "setup"]
    ) -> NewSession:
        from edged.state.accounts import SessionRecord

        secret = secrets.token_urlsafe(32)  # 256 bits
        record = SessionRecord(
            _digest(secret), name, secrets.token_hex(32), peer, now, now, now + timedelta(seconds=ABSOLUTE_S), None
        )
        self.store.add_session(record)
        audit = AuditEntry(f"user:{name}" if action == "login" else "setup-code", action, name, "done", "", peer)
        return NewSession(secret, _session(record, role), audit)

    def _retry_after(self, keys: _FailureKeys, now: datetime) -> float:
        """Seconds until a try from these keys is taken again (0: now)."""
        since = now - timedelta(seconds=WINDOW_S)
        address = self.store.login_failures(keys.address, since)
        counts = [(address, MAX_ADDRESS_FAILURES)]
        if keys.pair is not None and keys.name is not None:
            counts.append((self.store.login_failures(keys.pair, since), MAX_FAILURES))
            if address:  # the name-wide count holds back only an address that has failed itself
                counts.append((self.store.login_failures(keys.name, since), MAX_NAME_FAILURES))
        longest = 0.0
        for failures, limit in counts:
            if failures:
                until = failures[-1] + timedelta(seconds=lockout_s(len(failures), limit))
                longest = max(longest, (until - now).total_seconds())
        return longest

    def _failed(self, keys: _FailureKeys, now: datetime) -> None:
        self.store.add_login_failure(keys.all(), now, now - timedelta(seconds=WINDOW_S), MAX_FAILURE_ROWS)

    @staticmethod
    def _throttled(
        name: str, peer: str | None, retry_after: float, action: Literal["login", "setup"] = "login"
    ) -> LoginRefused:
        seconds = int(retry_after + 0.999)
        message = f"too many failed logins: try again in {seconds} s"
        actor = "anonymous" if action == "login" else "setup-code"
        return LoginRefused(
            "throttled", message, retry_after, AuditEntry(actor, action, name, "refused", message, peer)
        )

    def _hash(self, password: str) -> str:
        with self._hashing:
            return self.hasher.hash(password)

    def _verify(self, stored_hash: str, password: str) -> bool:
        with self._hashing:
            try:
                return self.hasher.verify(stored_hash, password)
            except (VerificationError, InvalidHashError):
                return False

    def _needs_rehash(self, stored_hash: str) -> bool:
        try:
            return self.hasher.check_needs_rehash(stored_hash)
        except InvalidHashError:
            return True

    def _dummy(self) -> str:
        if self._dummy_hash is None:
            self._dummy_hash = self._hash(secrets.token_urlsafe(16))
        return self._dummy_hash


def csrf_token(session_id: str, csrf_key: str) -> str:
    """HMAC-SHA256 of the session id under the session's own key, URL-safe base64."""
    mac = hmac.new(bytes.fromhex(csrf_key), session_id.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def _session(record: SessionRecord, role: Role) -> Session:
    return Session(
        record.id, record.user, role, record.created_at, record.expires_at, csrf_token(record.id, record.csrf_key)
    )


@dataclass(frozen=True, slots=True)
class _FailureKeys:
    """What a failed login counts against: its address, and when a name was tried, that name from that address
    (``pair``) and that name from anywhere (``name``)."""

    address: str
    pair: str | None
    name: str | None

    @classmethod
    def of(cls, name: str | None, peer: str | None) -> _FailureKeys:
        client = _client(peer)
        if name is None:
            return cls(f"address:{client}", None, None)
        tried = name[: NAME_MAX * 4]
        # An address holds no space, so the pair's key reads one way only.
        return cls(f"address:{client}", f"pair:{client} {tried}", f"user:{tried}")

    def of_name(self) -> list[str]:
        return [key for key in (self.pair, self.name) if key is not None]

    def all(self) -> list[str]:
        return [self.address, *self.of_name()]


def _client(peer: str | None) -> str:
    """Whom an address's failures count against: the address, or an IPv6 address's /64."""
    if not peer:
        return "unknown"
    try:
        ip = ipaddress.ip_address(peer)
    except ValueError:
        return peer[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _code_digest(code: str) -> bytes:
    # Typed from a log: case and the dashes do not matter.
    return hashlib.sha256(code.upper().replace("-", "").replace(" ", "").encode()).digest()
