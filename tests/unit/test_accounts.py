"""Console accounts over a real state database: passwords, login, throttling, sessions, first run, CSRF."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from argon2 import PasswordHasher, Type

import edged.core.accounts as accounts_module
from edged.core.access import Role
from edged.core.accounts import (
    ABSOLUTE_S,
    FIRST_RUN_CODE_S,
    IDLE_S,
    LOCKOUT_BASE_S,
    LOCKOUT_MAX_S,
    MAX_ADDRESS_FAILURES,
    MAX_FAILURES,
    MAX_NAME_FAILURES,
    PASSWORD_HASHER,
    WINDOW_S,
    AccountError,
    Accounts,
    LoginRefused,
    NewSession,
    lockout_s,
    password_problem,
)
from edged.state.store import DB_NAME, StateStore

PASSWORD = "correct horse battery"
OTHER = "another long passphrase"


@dataclass
class Clock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 11, 26, 8, 0, tzinfo=UTC))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    with StateStore.open(tmp_path) as opened:
        yield opened


@pytest.fixture
def accounts(store: StateStore, clock: Clock) -> Accounts:
    return Accounts(store, clock=clock)


def _logged_in(result: NewSession | LoginRefused) -> NewSession:
    assert isinstance(result, NewSession), result
    return result


def _refused(result: NewSession | LoginRefused) -> LoginRefused:
    assert isinstance(result, LoginRefused), result
    return result


def _rows(tmp_path: Path, sql: str) -> list[tuple[object, ...]]:
    connection = sqlite3.connect(tmp_path / DB_NAME)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def test_passwords_are_stored_as_argon2id_only(accounts: Accounts, tmp_path: Path) -> None:
    view, audit = accounts.create_user("alice", Role.OPERATOR, PASSWORD, actor="cli")
    assert (view.name, view.role, view.disabled_at) == ("alice", Role.OPERATOR, None)
    assert (audit.actor, audit.action, audit.target, audit.outcome) == ("cli", "user-create", "alice", "done")
    [(stored,)] = _rows(tmp_path, "SELECT password_hash FROM users")
    assert isinstance(stored, str)
    assert stored.startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    assert PASSWORD not in stored
    assert PASSWORD_HASHER.verify(stored, PASSWORD)


@pytest.mark.parametrize(
    ("name", "password", "rule"),
    [
        ("alice", "eleven char", "at least 12 characters"),
        ("alice", "x" * 1025, "at most 1024"),
        ("alice", "tab\tinside a passphrase", "control characters"),
        ("alice", "my name is Alice, ok?", "may not contain the user name"),
    ],
)
def test_the_password_policy(accounts: Accounts, name: str, password: str, rule: str) -> None:
    problem = password_problem(name, password)
    assert problem is not None and rule in problem
    with pytest.raises(AccountError, match=rule):
        accounts.create_user(name, Role.VIEWER, password, actor="cli")
    assert accounts.users() == []


def test_the_policy_takes_long_printable_passwords() -> None:
    assert password_problem("alice", "twelve chars") is None
    assert password_problem("alice", "émoji ok 🙂 spaces too") is None


def test_names_are_checked_and_unique(accounts: Accounts) -> None:
    with pytest.raises(AccountError, match="user name"):
        accounts.create_user("bad name", Role.VIEWER, PASSWORD, actor="cli")
    with pytest.raises(AccountError, match="user name"):
        accounts.create_user("", Role.VIEWER, PASSWORD, actor="cli")
    accounts.create_user("bob", Role.VIEWER, PASSWORD, actor="cli")
    with pytest.raises(AccountError, match="exists already"):
        accounts.create_user("bob", Role.ADMIN, OTHER, actor="cli")
    assert [(u.name, u.role) for u in accounts.users()] == [("bob", Role.VIEWER)]


def test_login_opens_a_session_that_stores_only_the_secrets_digest(accounts: Accounts, tmp_path: Path) -> None:
    accounts.create_user("alice", Role.ADMIN, PASSWORD, actor="cli")
    login = _logged_in(accounts.login("alice", PASSWORD, "192.0.2.7"))
    assert len(login.secret) >= 43  # 256 bits, URL-safe base64
    assert (login.audit.actor, login.audit.action, login.audit.outcome) == ("user:alice", "login", "done")
    assert login.audit.peer == "192.0.2.7"
    [(session_id, peer)] = _rows(tmp_path, "SELECT id, peer FROM sessions")
    assert session_id == login.session.id != login.secret
    assert peer == "192.0.2.7"
    assert login.secret not in str(_rows(tmp_path, "SELECT * FROM sessions"))
    session = accounts.session(login.secret)
    assert session is not None
    assert (session.user, session.role, session.id) == ("alice", Role.ADMIN, login.session.id)
    assert accounts.session(login.session.id) is None  # the stored digest is not a secret that opens it
    assert accounts.session("") is None
    assert accounts.session("x" * 10_000) is None


def test_wrong_password_and_unknown_user_get_the_same_answer(accounts: Accounts) -> None:
    accounts.create_user("alice", Role.VIEWER, PASSWORD, actor="cli")
    wrong = _refused(accounts.login("alice", OTHER, "192.0.2.7"))
    unknown = _refused(accounts.login("mallory", OTHER, "192.0.2.8"))
    assert (wrong.reason, wrong.message, wrong.retry_after_s) == (unknown.reason, unknown.message, 0.0)
    assert wrong.reason == "invalid"
    # Only the audit entry, never shown to the client, tells them apart.
    assert (wrong.audit.detail, unknown.audit.detail) == ("wrong password", "unknown user")
    assert wrong.audit.outcome == unknown.audit.outcome == "refused"
    assert (wrong.audit.actor, wrong.audit.target, wrong.audit.peer) == ("anonymous", "alice", "192.0.2.7")


def test_failures_of_a_name_from_one_address_throttle_that_pair_with_a_growing_delay(
    accounts: Accounts, clock: Clock
) -> None:
    accounts.create_user("alice", Role.VIEWER, PASSWORD, actor="cli")
    for _ in range(MAX_FAILURES):
        assert _refused(accounts.login("alice", OTHER, "192.0.2.1")).reason == "invalid"
    throttled = _refused(accounts.login("alice", PASSWORD, "192.0.2.1"))
    assert throttled.reason == "throttled"
    assert throttled.retry_after_s == LOCKOUT_BASE_S
    assert "try again in 60 s" in throttled.message
    # Whoever sent them cannot keep alice out: from an address that has not failed, her password works.
    _logged_in(accounts.login("alice", PASSWORD, "198.51.100.1"))
    # Once the delay is over one try is taken from that address; a failure now doubles the delay.
    clock.advance(LOCKOUT_BASE_S)
    assert _refused(accounts.login("alice", OTHER, "192.0.2.1")).reason == "invalid"
    again = _refused(accounts.login("alice", PASSWORD, "192.0.2.1"))
    assert (again.reason, again.retry_after_s) == ("throttled", 2 * LOCKOUT_BASE_S)
    clock.advance(2 * LOCKOUT_BASE_S)
    _logged_in(accounts.login("alice", PASSWORD, "192.0.2.1"))
    # A success clears the name's counts from that address.
    assert _refused(accounts.login("alice", OTHER, "192.0.2.1")).reason == "invalid"
    _logged_in(accounts.login("alice", PASSWORD, "192.0.2.1"))


def test_failures_of_a_name_from_everywhere_hold_back_only_addresses_that_failed(accounts: Accounts) -> None:
    accounts.create_user("alice", Role.VIEWER, PASSWORD, actor="cli")
    # One wrong password from each of many addresses: no address reaches a count of its own.
    for attempt in range(MAX_NAME_FAILURES):
        assert _refused(accounts.login("alice", OTHER, f"192.0.2.{attempt}")).reason == "invalid"
    # Each of them is held back now, whatever the password...
    throttled = _refused(accounts.login("alice", PASSWORD, "192.0.2.0"))
    assert (throttled.reason, throttled.retry_after_s) == ("throttled", LOCKOUT_BASE_S)
    # ... but not an address that never failed: the right password there logs alice in.
    _logged_in(accounts.login("alice", PASSWORD, "198.51.100.7"))


def test_unknown_names_are_throttled_like_known_ones(accounts: Accounts) -> None:
    for _ in range(MAX_FAILURES):
        _refused(accounts.login("nobody", OTHER, "192.0.2.50"))
    assert _refused(accounts.login("nobody", OTHER, "192.0.2.50")).reason == "throttled"


def test_failures_by_address_throttle_every_name_from_it(accounts: Accounts, clock: Clock) -> None:
    accounts.create_user("alice", Role.VIEWER, PASSWORD, actor="cli")
    for attempt in range(MAX_FAILURES):
        _refused(accounts.login(f"guess{attempt}", OTHER, "203.0.113.9"))
    # Below the address's own limit, another name from it is not held back by the others' failures.
    _logged_in(accounts.login("alice", PASSWORD, "203.0.113.9"))
    for attempt in range(MAX_FAILURES, MAX_ADDRESS_FAILURES):
        _refused(accounts.login(f"guess{attempt}", OTHER, "203.0.113.9"))
    throttled = _refused(accounts.login("alice", PASSWORD, "203.0.113.9"))
    assert throttled.reason == "throttled"
    assert throttled.audit.outcome == "refused"
    # The same user from elsewhere logs in.
    _logged_in(accounts.login("alice", PASSWORD, "203.0.113.10"))
    # A success elsewhere does not clear the address's count; the window's end does.
    clock.advance(LOCKOUT_BASE_S - 1)
    assert _refused(accounts.login("alice", PASSWORD, "203.0.113.9")).reason == "throttled"
    clock.advance(WINDOW_S)
    _logged_in(accounts.login("alice", PASSWORD, "203.0.113.9"))


def test_an_ipv6_client_counts_by_its_64(accounts: Accounts) -> None:
    accounts.create_user("alice", Role.VIEWER, PASSWORD, actor="cli")
    for attempt in range(MAX_FAILURES):
        _refused(accounts.login("alice", OTHER, f"2001:db8:1:2::{attempt + 1:x}"))
    assert _refused(accounts.login("alice", PASSWORD, "2001:db8:1:2::ffff")).reason == "throttled"
    _logged_in(accounts.login("alice", PASSWORD, "2001:db8:1:3::1"))


def test_the_failures_table_is_bounded(
    accounts: Accounts, tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(accounts_module, "MAX_FAILURE_ROWS", 12)
    for attempt in range(10):
        _refused(accounts.login(f"guess{attempt}", OTHER, f"192.0.2.{attempt}"))
        clock.advance(1)
    rows = _rows(tmp_path, "SELECT key FROM login_failures ORDER BY id")
    assert len(rows) == 12
    # The oldest went first: the newest failure's three rows are there.
    assert {"address:192.0.2.9", "pair:192.0.2.9 guess9", "user:guess9"} <= {row[0] for row in rows}
    assert "user:guess0" not in {row[0] for row in rows}
    # Past the window, a failure drops what is older, whatever its key.
    clock.advance(WINDOW_S + 1)
    _refused(accounts.login("late", OTHER, "192.0.2.200"))
    assert len(_rows(tmp_path, "SELECT key FROM login_failures")) == 3


def test_the_lockout_grows_and_is_capped() -> None:
    assert [lockout_s(n) for n in range(MAX_FAILURES)] == [0.0] * MAX_FAILURES
    assert lockout_s(MAX_FAILURES) == LOCKOUT_BASE_S
    assert lockout_s(MAX_FAILURES + 1) == 2 * LOCKOUT_BASE_S
    assert lockout_s(MAX_FAILURES + 100) == LOCKOUT_MAX_S
    assert lockout_s(MAX_ADDRESS_FAILURES - 1, MAX_ADDRESS_FAILURES) == 0.0
    assert lockout_s(MAX_ADDRESS_FAILURES, MAX_ADDRESS_FAILURES) == LOCKOUT_BASE_S


def test_a_session_ends_after_the_idle_time(accounts: Accounts, clock: Clock) -> None:
    accounts.create_user("alice", Role.VIEWER, PASSWORD, actor="cli")
    login = _logged_in(accounts.login("alice", PASSWORD, None))
    # Each use moves the idle end: used every 20 minutes, it lives on.
    for _ in range(3):
        clock.advance(IDLE_S - 600)
        assert accounts.session(login.secret) is not None
    clock.advance(IDLE_S)
    assert accounts.session(login.secret) is None


def test_a_session_ends_at_its_absolute_expiry_however_used(accounts: Accounts, clock: Clock) -> None:
    accounts.create_user("alice", Role.VIEWER, PASSWORD, actor="cli")
    login = _logged_in(accounts.login("alice", PASSWORD, None))
    assert login.session.expires_at == clock.now + timedelta(seconds=ABSOLUTE_S)
    used = 0
    while used + 600 < ABSOLUTE_S:
        clock.advance(600)
        used += 600
        assert accounts.session(login.secret) is not None
    clock.advance(ABSOLUTE_S - used)
    assert accounts.session(login.secret) is None


def test_logout_ends_only_that_session(accounts: Accounts) -> None:
    accounts.create_user("alice", Role.VIEWER, PASSWORD, actor="cli")
    laptop = _logged_in(accounts.login("alice", PASSWORD, "192.0.2.1"))
    phone = _logged_in(accounts.login("alice", PASSWORD, "192.0.2.2"))
    audit = accounts.logout(laptop.secret)
    assert audit is not None
    assert (audit.actor, audit.action, audit.peer) == ("user:alice", "logout", "192.0.2.1")
    assert accounts.session(laptop.secret) is None
    assert accounts.session(phone.secret) is not None
    assert accounts.logout(laptop.secret) is None  # once
    assert accounts.logout("not a session") is None


def test_a_password_change_ends_every_session_of_the_user(accounts: Accounts) -> None:
    accounts.create_user("alice", Role.OPERATOR, PASSWORD, actor="cli")
    accounts.create_user("bob", Role.OPERATOR, PASSWORD, actor="cli")
    sessions = [_logged_in(accounts.login("alice", PASSWORD, None)) for _ in range(2)]
    bobs = _logged_in(accounts.login("bob", PASSWORD, None))
    with pytest.raises(AccountError, match="at least 12"):
        accounts.set_password("alice", "short", actor="user:alice")
    assert all(accounts.session(s.secret) is not None for s in sessions)
    audit = accounts.set_password("alice", OTHER, actor="user:alice")
    assert (audit.action, audit.target, audit.detail) == ("password-set", "alice", "2 session(s) ended")
    assert all(accounts.session(s.secret) is None for s in sessions)
    assert accounts.session(bobs.secret) is not None
    assert _refused(accounts.login("alice", PASSWORD, None)).reason == "invalid"
    _logged_in(accounts.login("alice", OTHER, None))
    with pytest.raises(AccountError, match="no user named 'carol'"):
        accounts.set_password("carol", OTHER, actor="cli")


def test_a_disabled_user_cannot_log_in_and_loses_its_sessions(accounts: Accounts) -> None:
    accounts.create_user("alice", Role.ADMIN, PASSWORD, actor="cli")
    login = _logged_in(accounts.login("alice", PASSWORD, None))
    audit = accounts.disable_user("alice", actor="user:root")
    assert (audit.actor, audit.action, audit.detail) == ("user:root", "user-disable", "1 session(s) ended")
    assert accounts.session(login.secret) is None
    refused = _refused(accounts.login("alice", PASSWORD, None))
    # The answer of a wrong password: a disabled account is not told apart to the client.
    assert (refused.reason, refused.message) == ("invalid", _refused(accounts.login("x", OTHER, None)).message)
    assert refused.audit.detail == "user disabled"
    [view] = accounts.users()
    assert view.disabled_at is not None
    with pytest.raises(AccountError, match="no user named"):
        accounts.disable_user("nobody", actor="cli")


def test_a_hash_with_older_parameters_is_redone_at_login(store: StateStore, clock: Clock) -> None:
    weak = PasswordHasher(time_cost=1, memory_cost=8 * 1024, parallelism=1, type=Type.ID)
    Accounts(store, hasher=weak, clock=clock).create_user("alice", Role.VIEWER, PASSWORD, actor="cli")
    before = store.find_user("alice")
    assert before is not None and "$m=8192,t=1,p=1$" in before.password_hash
    accounts = Accounts(store, clock=clock)
    _refused(accounts.login("alice", OTHER, None))
    assert store.find_user("alice") == before  # a wrong password changes nothing
    _logged_in(accounts.login("alice", PASSWORD, None))
    after = store.find_user("alice")
    assert after is not None and "$m=19456,t=2,p=1$" in after.password_hash
    assert after.password_changed_at == before.password_changed_at
    _logged_in(accounts.login("alice", PASSWORD, None))


def test_the_first_run_code_makes_the_first_admin_once(accounts: Accounts, tmp_path: Path) -> None:
    code = accounts.first_run_code()
    assert code is not None
    wrong = _refused(accounts.setup_first_admin("AAAA-BBBB-CCCC-DDDD", "root", PASSWORD, "192.0.2.1"))
    assert (wrong.reason, wrong.audit.detail) == ("invalid", "wrong setup code")
    # A name or password the policy refuses does not use the code up.
    with pytest.raises(AccountError, match="at least 12"):
        accounts.setup_first_admin(code, "root", "short", "192.0.2.1")
    # Typed from a log: case and dashes do not matter.
    setup = _logged_in(accounts.setup_first_admin(code.lower().replace("-", " "), "root", PASSWORD, "192.0.2.1"))
    assert (setup.audit.actor, setup.audit.action, setup.audit.target) == ("setup-code", "setup", "root")
    assert setup.session.role == Role.ADMIN
    assert accounts.session(setup.secret) is not None
    assert [(u.name, u.role) for u in accounts.users()] == [("root", Role.ADMIN)]
    again = _refused(accounts.setup_first_admin(code, "root2", PASSWORD, "192.0.2.1"))
    assert again.reason == "invalid"
    assert len(accounts.users()) == 1
    assert accounts.first_run_code() is None  # a user exists
    assert _rows(tmp_path, "SELECT count(*) FROM users") == [(1,)]


def test_the_first_run_code_expires_and_a_new_one_replaces_it(accounts: Accounts, clock: Clock) -> None:
    first = accounts.first_run_code()
    assert first is not None
    second = accounts.first_run_code()
    assert second is not None and second != first
    assert _refused(accounts.setup_first_admin(first, "root", PASSWORD, None)).audit.detail == "wrong setup code"
    clock.advance(FIRST_RUN_CODE_S)
    expired = _refused(accounts.setup_first_admin(second, "root", PASSWORD, None))
    assert expired.audit.detail == "expired setup code"
    assert accounts.users() == []


def test_the_first_run_code_is_refused_once_a_user_exists(accounts: Accounts) -> None:
    code = accounts.first_run_code()
    assert code is not None
    # Made meanwhile another way (edged admin create): the code no longer makes an admin.
    accounts.create_user("alice", Role.VIEWER, PASSWORD, actor="cli")
    refused = _refused(accounts.setup_first_admin(code, "root", PASSWORD, None))
    assert refused.audit.detail == "a user exists already"
    assert [u.name for u in accounts.users()] == ["alice"]


def test_wrong_setup_codes_are_throttled_by_address(accounts: Accounts) -> None:
    code = accounts.first_run_code()
    assert code is not None
    for _ in range(MAX_ADDRESS_FAILURES):
        _refused(accounts.setup_first_admin("WRONG", "root", PASSWORD, "192.0.2.5"))
    assert _refused(accounts.setup_first_admin(code, "root", PASSWORD, "192.0.2.5")).reason == "throttled"
    _logged_in(accounts.setup_first_admin(code, "root", PASSWORD, "192.0.2.6"))


def test_csrf_tokens_belong_to_their_session(accounts: Accounts) -> None:
    accounts.create_user("alice", Role.OPERATOR, PASSWORD, actor="cli")
    first = _logged_in(accounts.login("alice", PASSWORD, None))
    second = _logged_in(accounts.login("alice", PASSWORD, None))
    session = accounts.session(first.secret)
    other = accounts.session(second.secret)
    assert session is not None and other is not None
    assert session.csrf_token == first.session.csrf_token  # stable for the session's life
    assert accounts.verify_csrf(session, session.csrf_token)
    assert not accounts.verify_csrf(session, other.csrf_token)
    assert not accounts.verify_csrf(session, "")
    assert not accounts.verify_csrf(session, session.csrf_token[:-1])
    assert not accounts.verify_csrf(session, session.id)
    assert not accounts.verify_csrf(session, "é" * 43)


def test_two_setups_at_once_make_one_admin(store: StateStore, clock: Clock) -> None:
    accounts = Accounts(store, clock=clock)
    code = accounts.first_run_code()
    assert code is not None
    barrier = threading.Barrier(2)
    results: dict[str, NewSession | LoginRefused] = {}

    def setup(name: str) -> None:
        barrier.wait()
        results[name] = accounts.setup_first_admin(code, name, PASSWORD, None)

    threads = [threading.Thread(target=setup, args=(name,)) for name in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    made = [name for name, result in results.items() if isinstance(result, NewSession)]
    assert len(made) == 1
    assert [user.name for user in accounts.users()] == made
