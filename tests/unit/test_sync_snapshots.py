"""Local snapshots: building, switching, rollback, and what a run killed at each step leaves behind."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from edged.sync import RemoteEntry, Snapshot, SnapshotStore, SourceProblem, SyncError, plan_delta
from edged.sync.plan import check_listing

URL = "s3://models/repository"


def entry(path: str, data: bytes) -> RemoteEntry:
    return RemoteEntry(path, len(data), "md5:" + hashlib.md5(data).hexdigest())


def publish(store: SnapshotStore, files: dict[str, bytes]) -> Snapshot:
    """Stage ``files`` as a download would leave them, then build and switch to the snapshot they make."""
    current = store.current()
    listing = check_listing(entry(path, data) for path, data in files.items())
    plan = plan_delta(listing, store.intact_files(current) if current else {})
    store.prepare()
    for item in plan.download:
        store.staged(item).write_bytes(files[item.path])
    snapshot = store.build(plan, current, {e.path: hashlib.sha256(files[e.path]).hexdigest() for e in plan.download})
    store.switch(snapshot)
    return snapshot


def content(snapshot: Snapshot) -> dict[str, bytes]:
    root = snapshot.repository
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_switch_keeps_the_previous_snapshot_and_rollback_returns_to_it(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, URL)
    one = publish(store, {"m/config.pbtxt": b"one", "m/1/model.onnx": b"weights"})
    two = publish(store, {"m/config.pbtxt": b"two", "m/1/model.onnx": b"weights"})
    assert store.current() == two and store.previous() == one
    assert os.stat(two.repository / "m/1/model.onnx").st_ino == os.stat(one.repository / "m/1/model.onnx").st_ino
    assert store.rollback() == one
    assert store.current() == one and store.previous() == two
    assert content(one) == {"m/1/model.onnx": b"weights", "m/config.pbtxt": b"one"}


def test_a_run_killed_before_its_switch_leaves_the_current_snapshot_and_its_leftovers_are_removed(
    tmp_path: Path,
) -> None:
    store = SnapshotStore(tmp_path, URL)
    one = publish(store, {"m/config.pbtxt": b"one"})
    # What a killed run can leave: a half-built snapshot, a built one never switched to, a link never renamed.
    (store.next / "repo").mkdir(parents=True)
    (store.next / "repo" / "half").write_bytes(b"x")
    orphan = store.snapshots / "r000009"
    orphan.mkdir()
    os.symlink("snapshots/r000009", store.root / ".current.link")
    partial = store.partial(entry("m/big", b"0123456789"))
    partial.write_bytes(b"01234")

    assert store.current() == one
    store.prepare()
    assert not store.next.exists() and not (store.root / ".current.link").is_symlink()
    assert partial.read_bytes() == b"01234", "a download in progress must survive to resume"
    store.collect_garbage()
    assert not orphan.exists() and store.current() == one


def test_a_current_link_that_points_elsewhere_is_not_followed(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, URL)
    one = publish(store, {"m/config.pbtxt": b"one"})
    # A complete snapshot, but outside the store: a link there is refused, not served.
    elsewhere = tmp_path / "elsewhere" / "snapshots" / one.path.name
    shutil.copytree(one.path, elsewhere)
    os.unlink(store.root / "current")
    os.symlink(os.path.relpath(elsewhere, store.root), store.root / "current")
    assert (store.root / "current" / "manifest.json").is_file()
    assert store.current() is None


def test_a_file_lost_or_replaced_in_a_snapshot_is_not_linked_into_the_next(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, URL)
    one = publish(store, {"a": b"aaaa", "b": b"bbbb", "c": b"cccc", "d": b"dddd"})
    (one.repository / "a").unlink()
    os.chmod(one.repository / "b", 0o644)
    (one.repository / "b").write_bytes(b"bb")
    (one.repository / "c").unlink()
    os.symlink("/etc/hostname", one.repository / "c")
    assert sorted(store.intact_files(one)) == ["d"]


def test_one_run_at_a_time(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, URL)
    with store.locked(), pytest.raises(SyncError) as busy, SnapshotStore(tmp_path, URL).locked():
        pass
    assert busy.value.problem is SourceProblem.BUSY
    with store.locked():
        pass
