"""Who may call what: the access policy every frontend asks before it serves a request.

Requests fall in Triton's API categories (``Category``), plus the metrics port. A request is let through by, in
order:

1. **Triton's restricted APIs** (``--http-restricted-api`` / ``--grpc-restricted-protocol``): a category in such a
   group needs its header with its value, whoever sends it, exactly as Triton asks (a deployment written for Triton
   keeps its configuration and its clients). The header is then also who asked ("restricted-header").
2. **Guarded categories** (by default the ones that change the server: model-repository, shared-memory, logging,
   trace): a client needs an API token whose role grants the category, or a client certificate mapped to such a
   role, or to be on the loopback interface (tools on the device itself) while loopback is trusted.
3. Every other category is open: inference, health and metadata stay reachable for every Triton client.

Loopback's trust stops short of what would make a local process more than a client: **token management** (it would
hand out every category, to the network too) and **requests that bring code** (``check(..., code=True)``: a model
upload, a load with a ``config`` or ``file:`` override, see ``load_brings_code``), whose files or settings the
daemon would run as its own user. These need a credential from every address; the first token comes from
``edged token create``, which needs the state directory's file permissions, not a socket.

A token presented where none is needed is not checked (the hot inference path pays nothing); a token presented for
a guarded category must be valid, and the request is judged by it, on loopback too (a viewer's token there is a
viewer). Secrets are compared in constant time and never logged. Tokens live in the state database
(``edged token``); a revoked token stops working within ``TOKEN_CACHE_S`` seconds. A valid token's last use (when,
from which address) is kept in memory and written to the database at most every ``TOKEN_USE_WRITE_S`` seconds per
token, on a thread of its own: the request that presents it never waits on the write.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final, Literal, Protocol

if TYPE_CHECKING:
    from edged.state.store import TokenRecord

log = logging.getLogger("edged.access")

# Who asked for what is being served ("token:<name>", "loopback", ...): set by the frontend that let the request in,
# read where model changes are recorded. A context variable, because a load passes through the service, the control
# and the manager, none of which has a reason to know about callers, and the history needs it only at the end.
ACTOR: ContextVar[str | None] = ContextVar("edged_actor", default=None)
# The door the request came through, when it is not the API's own ("console"): the history's source for the changes
# it causes. The console calls the same service the API does, so only this tells its clicks from API calls.
DOOR: ContextVar[str | None] = ContextVar("edged_door", default=None)

TOKEN_PREFIX: Final = "edged_"
# How long a looked-up token is trusted before the database is asked again.
TOKEN_CACHE_S: Final = 2.0
# Looked-up token ids kept at most: ids made up by clients must not grow the cache without bound.
TOKEN_CACHE_MAX: Final = 4096
# A token's last use is written at most this often: each write waits on fsync, and a client may present its token a
# thousand times a second. Between writes the newest use is kept in memory, and the token list shows it from there.
TOKEN_USE_WRITE_S: Final = 60.0


class Category(enum.Enum):
    """Triton's API categories (as ``--http-restricted-api`` names them), and the metrics port."""

    HEALTH = "health"
    METADATA = "metadata"
    INFERENCE = "inference"
    SHARED_MEMORY = "shared-memory"
    MODEL_CONFIG = "model-config"
    MODEL_REPOSITORY = "model-repository"
    STATISTICS = "statistics"
    TRACE = "trace"
    LOGGING = "logging"
    METRICS = "metrics"
    # edged's own: who may call what (API tokens). Always guarded, granted to the admin role only, never to loopback.
    TOKENS = "tokens"


# Triton's categories: the ones a restricted-API group may name.
TRITON_CATEGORIES: Final = frozenset(Category) - {Category.METRICS, Category.TOKENS}
GUARDED_BY_DEFAULT: Final = frozenset(
    {Category.MODEL_REPOSITORY, Category.SHARED_MEMORY, Category.LOGGING, Category.TRACE}
)


class Role(enum.Enum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


_READ_ONLY: Final = frozenset(
    {
        Category.HEALTH,
        Category.METADATA,
        Category.INFERENCE,
        Category.MODEL_CONFIG,
        Category.STATISTICS,
        Category.METRICS,
    }
)
# viewer: what changes nothing; operator: also what changes the server; admin: also who may (token management).
GRANTS: Final[Mapping[Role, frozenset[Category]]] = {
    Role.VIEWER: _READ_ONLY,
    Role.OPERATOR: frozenset(Category) - {Category.TOKENS},
    Role.ADMIN: frozenset(Category),
}


class Refusal(enum.Enum):
    """Why a request was refused; each frontend answers it in its own wire's terms."""

    RESTRICTED = "restricted"  # Triton's restricted API: HTTP 403, gRPC UNAVAILABLE (as Triton answers)
    UNAUTHENTICATED = "unauthenticated"  # no valid credentials: HTTP 401, gRPC UNAUTHENTICATED
    FORBIDDEN = "forbidden"  # valid credentials, a role without the category: HTTP 403, gRPC PERMISSION_DENIED


class AccessDenied(Exception):
    def __init__(self, refusal: Refusal, message: str, *, header: str | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal
        self.message = message
        self.header = header


@dataclass(frozen=True, slots=True)
class Caller:
    """What a frontend knows of who sent a request. ``headers``: lower-case names (gRPC metadata or HTTP headers);
    ``peer``: the client's IP address; ``certificate``: the subject CN of a verified client certificate."""

    wire: Literal["http", "grpc", "metrics"]
    peer: str | None
    headers: Mapping[str, str]
    certificate: str | None = None


@dataclass(frozen=True, slots=True)
class RestrictedGroup:
    """One ``<categories>:<key>=<value>`` of Triton's restricted-API flags."""

    categories: frozenset[Category]
    key: str
    value: str


def parse_restricted(text: str, *, grpc: bool) -> RestrictedGroup:
    """``model-repository,logging:admin-key=secret`` -> RestrictedGroup; ValueError says what is wrong. For gRPC the
    header clients send is ``triton-grpc-protocol-<key>``, as in Triton."""
    apis, colon, setting = text.partition(":")
    key, equals, value = setting.partition("=")
    if not colon or not equals or not apis or not key.strip():
        raise ValueError(f"expected <apis>:<key>=<value>, got '{text}'")
    categories: set[Category] = set()
    for name in apis.split(","):
        try:
            category = Category(name.strip())
        except ValueError:
            category = Category.METRICS
        if category not in TRITON_CATEGORIES:
            known = ", ".join(sorted(c.value for c in TRITON_CATEGORIES))
            raise ValueError(f"unknown API '{name.strip()}' (known: {known})") from None
        categories.add(category)
    header = key.strip().lower()
    return RestrictedGroup(frozenset(categories), f"triton-grpc-protocol-{header}" if grpc else header, value)


def parse_certificate_role(text: str) -> tuple[str, Role]:
    """``--client-certificate-role``: ``<subject CN>=<role>``, e.g. ``camera-17.plant.example=operator``."""
    name, equals, role = text.rpartition("=")
    if not equals or not name.strip():
        raise ValueError(f"expected <certificate CN>=<role>, got '{text}'")
    try:
        return name.strip(), Role(role.strip())
    except ValueError:
        raise ValueError(f"unknown role '{role.strip()}' (known: viewer, operator, admin)") from None


def parse_categories(text: str) -> frozenset[Category]:
    """``--guarded-apis``: a comma-separated list of categories, ``all`` or ``none``."""
    words = [word.strip() for word in text.split(",") if word.strip()]
    if words == ["none"]:
        return frozenset()
    if words == ["all"]:
        return frozenset(Category)
    found = set()
    for word in words:
        try:
            found.add(Category(word))
        except ValueError:
            known = ", ".join(c.value for c in Category)
            raise ValueError(f"unknown API '{word}' (known: {known}, or all / none)") from None
    return frozenset(found)


# --- tokens ---------------------------------------------------------------------------------------------------


class TokenStore(Protocol):
    def find_token(self, token_id: str) -> TokenRecord | None: ...

    def add_token(self, token: TokenRecord) -> None: ...

    def tokens(self) -> list[TokenRecord]: ...

    def revoke_token(self, name: str) -> bool: ...

    def touch_token(self, token_id: str, at: datetime, peer: str | None) -> None: ...


@dataclass(frozen=True, slots=True)
class TokenView:
    """What may be shown of a token: never its secret or its hash."""

    name: str
    role: str
    state: Literal["active", "revoked", "expired"]
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None = None
    last_used_peer: str | None = None  # the client address of that use

    @classmethod
    def of(cls, record: TokenRecord, use: TokenUse | None = None) -> TokenView:
        """``use``: this daemon's newest use of the token, when it is newer than the stored one."""
        state: Literal["active", "revoked", "expired"] = "revoked" if record.revoked_at else "active"
        if state == "active" and record.expires_at is not None and record.expires_at <= datetime.now(UTC):
            state = "expired"
        used_at, peer = record.last_used_at, record.last_used_peer
        if use is not None and (used_at is None or use.at > used_at):
            used_at, peer = use.at, use.peer
        return cls(record.name, record.role, state, record.created_at, record.expires_at, used_at, peer)


@dataclass(slots=True)
class TokenUse:
    """A token's newest use as this daemon saw it, and when (its clock) it was last written."""

    at: datetime
    peer: str | None
    written: float | None = None  # None: not written by this daemon yet


@dataclass(frozen=True, slots=True)
class NewToken:
    """A token just made: ``secret`` is the whole token a client sends, shown once; ``record`` what is stored."""

    secret: str
    record: TokenRecord


def new_token(name: str, role: Role, expires_at: datetime | None) -> NewToken:
    """``edged_<id>_<secret>``: the id finds the record, the secret (256 random bits) proves the holder. Only the
    secret's SHA-256 is stored: a random secret of that length needs no slow hash to resist guessing."""
    from edged.state.store import TokenRecord

    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    record = TokenRecord(token_id, name, role.value, _digest(secret), datetime.now(UTC), expires_at, None)
    return NewToken(f"{TOKEN_PREFIX}{token_id}_{secret}", record)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an ``authorization: Bearer <token>`` header (any case of "Bearer"), or None."""
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


@dataclass
class _Cached:
    record: TokenRecord | None
    until: float


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class TokenVerifier:
    """Checks presented tokens against the store, keeping each lookup for TOKEN_CACHE_S seconds, and records each
    valid token's last use. ``clock`` paces the cache and the writes; ``wall`` is the time a use is recorded at;
    ``run_write`` runs a write of a last use (by default on a thread of the verifier's own)."""

    store: TokenStore | None
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], datetime] = _utcnow
    run_write: Callable[[Callable[[], None]], object] | None = None
    _cache: dict[str, _Cached] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # By token id, of valid tokens only: as many entries as there are tokens, whatever clients send.
    _uses: dict[str, TokenUse] = field(default_factory=dict)
    _writer: ThreadPoolExecutor | None = None

    def verify(self, token: str, peer: str | None = None) -> TokenRecord | None:
        """The valid (known, unrevoked, unexpired) token's record, or None. A valid token's use from ``peer`` (the
        client's address) is recorded."""
        if not token.startswith(TOKEN_PREFIX) or self.store is None:
            return None
        token_id, _, secret = token.removeprefix(TOKEN_PREFIX).partition("_")
        if not token_id or not secret:
            return None
        record = self._lookup(token_id)
        if record is None or not hmac.compare_digest(record.secret_sha256, _digest(secret)):
            return None
        if record.revoked_at is not None:
            return None
        if record.expires_at is not None and record.expires_at <= datetime.now(UTC):
            return None
        self._used(record.token_id, peer)
        return record

    # --- management (admin): edged token, and the HTTP API ---

    def create(self, name: str, role: Role, expires_at: datetime | None) -> tuple[str, TokenView]:
        """Makes and stores a token: its secret (shown this once) and what may be shown of it. Blocking (SQLite):
        call it off the event loop. ValueError says why a token cannot be made (a name taken, no database)."""
        from edged.state.records import StateError

        if not name or len(name) > 64 or not name.isprintable():
            raise ValueError("a token name is 1 to 64 printable characters")
        made = new_token(name, role, expires_at)
        try:
            self._store_or_fail().add_token(made.record)
        except StateError as error:
            raise ValueError(str(error)) from None
        return made.secret, TokenView.of(made.record)

    def list(self) -> list[TokenView]:
        records = self._store_or_fail().tokens()
        with self._lock:
            uses = {token_id: TokenUse(use.at, use.peer) for token_id, use in self._uses.items()}
        return [TokenView.of(record, uses.get(record.token_id)) for record in records]

    def revoke(self, name: str) -> bool:
        revoked = self._store_or_fail().revoke_token(name)
        with self._lock:
            self._cache.clear()  # this daemon stops honouring it at once, not within TOKEN_CACHE_S
        return revoked

    def _used(self, token_id: str, peer: str | None) -> None:
        now, at = self.clock(), self.wall()
        with self._lock:
            use = self._uses.get(token_id)
            if use is None:
                use = self._uses[token_id] = TokenUse(at, peer)
            else:
                use.at, use.peer = at, peer
            if use.written is not None and now - use.written < TOKEN_USE_WRITE_S:
                return  # kept in memory: the next use after the interval writes it
            use.written = now
        store = self.store
        assert store is not None

        def write() -> None:
            try:
                store.touch_token(token_id, at, peer)
            except Exception as error:  # the record of a use is worth no failed request, nor a dead writer thread
                log.warning("could not record the last use of an API token: %s", error)

        if self.run_write is not None:
            self.run_write(write)
            return
        with self._lock:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="edged-token-use")
            writer = self._writer
        writer.submit(write)

    def _store_or_fail(self) -> TokenStore:
        if self.store is None:
            raise ValueError("API tokens need the state database (--state-dir)")
        return self.store

    def _lookup(self, token_id: str) -> TokenRecord | None:
        now = self.clock()
        with self._lock:
            cached = self._cache.get(token_id)
            if cached is not None and cached.until > now:
                return cached.record
        assert self.store is not None
        record = self.store.find_token(token_id)
        with self._lock:
            if len(self._cache) > TOKEN_CACHE_MAX:
                self._cache.clear()
            self._cache[token_id] = _Cached(record, now + TOKEN_CACHE_S)
        return record


# --- the policy -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AccessOptions:
    http_restricted: tuple[RestrictedGroup, ...] = ()
    grpc_restricted: tuple[RestrictedGroup, ...] = ()
    guarded: frozenset[Category] = GUARDED_BY_DEFAULT
    trust_loopback: bool = True
    # Subject CN of a verified client certificate -> its role (a device identity).
    certificate_roles: Mapping[str, Role] = field(default_factory=dict)


class AccessPolicy:
    """``check(category, caller)`` returns who asked (for the model history) or raises AccessDenied. Every refusal
    is logged with the client's address and reported to ``on_refused(wire, category, refusal)`` (a counter)."""

    def __init__(
        self,
        options: AccessOptions,
        tokens: TokenVerifier,
        on_refused: Callable[[str, Category, Refusal], None] | None = None,
    ) -> None:
        self._options = options
        self._tokens = tokens
        self._on_refused = on_refused
        self._restricted = {
            "http": restricted_by_category(options.http_restricted),
            "grpc": restricted_by_category(options.grpc_restricted),
            "metrics": {},
        }

    @property
    def tokens(self) -> TokenVerifier:
        return self._tokens

    def is_open(self, category: Category, wire: str) -> bool:
        """Whether every caller may use ``category`` over ``wire`` (nothing to check, nothing to record)."""
        return category not in self._restricted[wire] and not self._guarded(category)

    def check(self, category: Category, caller: Caller, *, code: bool = False) -> str:
        """``code``: the request brings code or settings the daemon would run (an upload, a load with overrides):
        loopback's trust does not reach it."""
        try:
            return self._check(category, caller, code)
        except AccessDenied as denied:
            log.warning(
                "refused %s request (%s) from %s: %s",
                caller.wire,
                category.value,
                caller.peer or "an unknown address",
                denied.message,
            )
            if self._on_refused is not None:
                self._on_refused(caller.wire, category, denied.refusal)
            raise

    def _check(self, category: Category, caller: Caller, code: bool) -> str:
        group = self._restricted[caller.wire].get(category)
        if group is not None:
            presented = caller.headers.get(group.key)
            if presented is None or not hmac.compare_digest(presented.encode(), group.value.encode()):
                what = "protocol" if caller.wire == "grpc" else "API"
                raise AccessDenied(
                    Refusal.RESTRICTED, f"This {what} is restricted, expecting header '{group.key}'", header=group.key
                )
            return "restricted-header"
        if not self._guarded(category):
            return open_actor(caller.peer)
        token = bearer(caller.headers)
        if token is not None:
            record = self._tokens.verify(token, caller.peer)
            if record is None:
                raise AccessDenied(Refusal.UNAUTHENTICATED, "the API token is not valid (unknown, revoked or expired)")
            return self._granted(category, Role(record.role), f"token:{record.name}")
        role = self._options.certificate_roles.get(caller.certificate or "")
        if caller.certificate is not None and role is not None:
            return self._granted(category, role, f"certificate:{caller.certificate}")
        if self._options.trust_loopback and is_loopback(caller.peer):
            if not code and category is not Category.TOKENS:
                return "loopback"
            what = "token management" if category is Category.TOKENS else "sending a model's files or config"
            raise AccessDenied(
                Refusal.UNAUTHENTICATED,
                f"{what} needs an API token, from this machine too: send 'Authorization: Bearer <token>' (make the "
                "first one with edged token create)",
            )
        raise AccessDenied(
            Refusal.UNAUTHENTICATED,
            f"the {category.value} API needs an API token from this address: send 'Authorization: Bearer <token>' "
            "(edged token create)",
        )

    def _guarded(self, category: Category) -> bool:
        # Token management is never open, whatever --guarded-apis says: it would hand out every other category.
        return category in self._options.guarded or category is Category.TOKENS

    @staticmethod
    def _granted(category: Category, role: Role, actor: str) -> str:
        if category not in GRANTS[role]:
            raise AccessDenied(Refusal.FORBIDDEN, f"the {role.value} role does not grant the {category.value} API")
        return actor


def load_brings_code(parameters: Iterable[str]) -> bool:
    """Whether a load request with these parameter names brings what the daemon would run: a ``config`` override
    (it may name another backend, a Python environment to execute, paths to write to) or ``file:`` contents (a
    model.py, a plan with its plugins, ...). Which settings of which backend run code is no list worth keeping: any
    override counts. The names are those kserve.load_overrides reads; a load of the model as the repository holds
    it brings nothing."""
    return any(name == "config" or name.startswith("file:") for name in parameters)


def restricted_by_category(groups: Iterable[RestrictedGroup]) -> dict[Category, RestrictedGroup]:
    """Each category's group; ValueError when one is in two groups (Triton refuses that too)."""
    found: dict[Category, RestrictedGroup] = {}
    for group in groups:
        for category in group.categories:
            if category in found:
                raise ValueError(f"{category.value} is in more than one restricted group")
            found[category] = group
    return found


def open_actor(peer: str | None) -> str:
    """Who asked, where a category is open to all: nothing but the address is known of the caller."""
    return "loopback" if is_loopback(peer) else "anonymous"


def is_loopback(address: str | None) -> bool:
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.removeprefix("[").removesuffix("]").split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))
