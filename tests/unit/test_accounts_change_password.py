"""Changing one's own password (the console's account page) over a real state database: the old password proven
as a login proves it, wrong ones counted and throttled as failed logins, every session ended on success."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from argon2 import PasswordHasher, Type

from edged.core.access import Role
from edged.core.accounts import MAX_FAILURES, AccountError, Accounts, LoginRefused, NewSession
from edged.state.store import StateStore

PASSWORD = "correct horse battery"
NEW = "another long passphrase"
# Cheap argon2 parameters: these tests are about the rules, not the hash's cost.
FAST = PasswordHasher(time_cost=1, memory_cost=64, parallelism=1, type=Type.ID)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def accounts(tmp_path: Path, clock: Clock) -> Iterator[Accounts]:
    with StateStore.open(tmp_path) as store:
        made = Accounts(store, hasher=FAST, clock=clock)
        made.create_user("alice", Role.OPERATOR, PASSWORD, actor="cli")
        yield made


def test_the_old_password_is_proven_and_every_session_ends(accounts: Accounts) -> None:
    opened = accounts.login("alice", PASSWORD, "10.0.0.1")
    assert isinstance(opened, NewSession)
    entry = accounts.change_password("alice", PASSWORD, NEW, "10.0.0.1")
    assert (entry.actor, entry.action, entry.target, entry.outcome) == ("user:alice", "password-set", "alice", "done")
    assert accounts.session(opened.secret) is None
    assert isinstance(accounts.login("alice", NEW, "10.0.0.1"), NewSession)
    assert not isinstance(accounts.login("alice", PASSWORD, "10.0.0.1"), NewSession)


def test_a_wrong_old_password_changes_nothing_and_counts_as_a_failed_login(accounts: Accounts, clock: Clock) -> None:
    for _ in range(MAX_FAILURES):
        with pytest.raises(AccountError, match="the current password is wrong"):
            accounts.change_password("alice", "not the password at all", NEW, "10.0.0.2")
    # Throttled now, even with the right one: a session left open is no way to guess the password.
    with pytest.raises(AccountError, match="too many failed tries"):
        accounts.change_password("alice", PASSWORD, NEW, "10.0.0.2")
    assert isinstance(accounts.login("alice", PASSWORD, "10.0.0.2"), LoginRefused)  # the same counts as a login's
    # From an address that has not failed, the password works: failures elsewhere lock no one out.
    assert isinstance(accounts.login("alice", PASSWORD, "10.0.0.3"), NewSession)
    clock.now += timedelta(hours=1)
    assert isinstance(accounts.login("alice", PASSWORD, "10.0.0.2"), NewSession)


def test_the_policy_and_a_same_password_are_refused(accounts: Accounts) -> None:
    with pytest.raises(AccountError, match="at least 12"):
        accounts.change_password("alice", PASSWORD, "short", None)
    with pytest.raises(AccountError, match="is the current one"):
        accounts.change_password("alice", PASSWORD, PASSWORD, None)
    with pytest.raises(AccountError, match="no user named"):
        accounts.change_password("nobody", PASSWORD, NEW, None)
    assert isinstance(accounts.login("alice", PASSWORD, None), NewSession)
