"""The fleet view's pure parts: channel URLs, device ids, status objects as bytes, and the table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from edged.sync import SourceProblem, SyncError
from edged.sync.fleet import (
    MAX_ERROR_CHARS,
    MAX_STATUS_BYTES,
    DeviceStatus,
    ModelStatus,
    Unreadable,
    channel_url,
    decode,
    device_id_problem,
    encode,
    format_table,
    parse_duration,
    status_key,
)

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def status(device: str = "edge-01", **changes: object) -> DeviceStatus:
    made = DeviceStatus(
        device=device,
        channel="stable",
        revision="3f2a9c0d11e4b5a6",
        models={"add_sub": ModelStatus("READY", "1"), "resnet": ModelStatus("UNAVAILABLE", None)},
        last_sync=NOW - timedelta(minutes=5),
        updated_at=NOW - timedelta(minutes=1),
        edged_version="0.1.0",
    )
    return msgspec.structs.replace(made, **changes)


@pytest.mark.parametrize(
    ("base", "channel", "url"),
    [
        ("s3://bucket/fleet", "stable", "s3://bucket/fleet/stable"),
        ("s3://host:9000/bucket/fleet/", "canary", "s3://host:9000/bucket/fleet/canary"),
        ("gs://bucket", "stable", "gs://bucket/stable"),
        ("gs://bucket/fleet/", None, "gs://bucket/fleet"),
    ],
)
def test_a_channel_is_a_folder_of_the_base(base: str, channel: str | None, url: str) -> None:
    assert channel_url(base, channel) == url


@pytest.mark.parametrize("channel", ["", ".", "..", "../x", "a/b", "a\\b", "a\x00b", "a\x1bb", ".edged", "x" * 256])
def test_a_channel_that_is_not_one_folder_is_refused(channel: str) -> None:
    with pytest.raises(SyncError) as refused:
        channel_url("s3://bucket/fleet", channel)
    assert refused.value.problem is SourceProblem.BAD_URL


@pytest.mark.parametrize("device", ["edge-01", "a", "0f8e2c7a-1b2c-4d5e-8f90-123456789abc", "cam.lab_3", "x" * 128])
def test_device_ids(device: str) -> None:
    assert device_id_problem(device) is None
    assert status_key(device) == f".edged/devices/{device}.json"


@pytest.mark.parametrize(
    "device", ["", "../x", "a/b", "..", ".hidden", "-rf", "a b", "a\\b", "a\x00", "é", "x" * 129, "a\n"]
)
def test_unsafe_device_ids_are_refused(device: str) -> None:
    assert device_id_problem(device) is not None
    with pytest.raises(ValueError, match="device id"):
        status_key(device)
    with pytest.raises(ValueError, match="device id"):
        encode(status(device))


def test_a_status_reads_back_as_written() -> None:
    written = status(last_error="access denied: s3://bucket/fleet/stable")
    data = encode(written)
    assert decode(".edged/devices/edge-01.json", data) == written
    assert msgspec.json.decode(data)["models"]["add_sub"] == {"state": "READY", "version": "1"}


def test_a_long_error_is_shortened_and_a_huge_status_refused() -> None:
    data = encode(status(last_error="x" * (10 * MAX_ERROR_CHARS)))
    read = decode(".edged/devices/edge-01.json", data)
    assert isinstance(read, DeviceStatus) and read.last_error is not None
    assert len(read.last_error) == MAX_ERROR_CHARS and read.last_error.endswith("...")
    many = {f"model-{i:05d}": ModelStatus("READY", "1") for i in range(MAX_STATUS_BYTES // 20)}
    with pytest.raises(ValueError, match="over"):
        encode(status(models=many))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not json", "not a device status"),
        (b"[]", "not a device status"),
        (b'{"device": "edge-01"}', "not a device status"),
        # A timestamp without a zone means a different instant on every device.
        (
            b'{"device":"edge-01","channel":null,"revision":null,"updated_at":"2026-11-26T12:00:00",'
            b'"edged_version":"0.1.0"}',
            "not a device status",
        ),
        (encode(status("edge-02")), "names device 'edge-02'"),
        (b" " * (MAX_STATUS_BYTES + 1), "larger than"),
    ],
    ids=["garbage", "array", "incomplete", "naive-time", "other-device", "oversized"],
)
def test_what_is_not_a_status_of_its_device_is_unreadable(data: bytes, reason: str) -> None:
    read = decode(".edged/devices/edge-01.json", data)
    assert isinstance(read, Unreadable) and read.key == ".edged/devices/edge-01.json"
    assert reason in read.reason


def test_unknown_fields_of_a_newer_edged_are_ignored() -> None:
    fields = msgspec.json.decode(encode(status()))
    fields["disk_free"] = 123
    read = decode(".edged/devices/edge-01.json", msgspec.json.encode(fields))
    assert read == status()


def test_the_table_shows_every_device_and_marks_stale_ones() -> None:
    reports: list[DeviceStatus | Unreadable] = [
        status("edge-01"),
        status("edge-02", channel=None, revision=None, models={}, last_sync=None, last_error="endpoint unreachable"),
        status("edge-03", updated_at=NOW - timedelta(hours=3), signed=True),
        Unreadable(".edged/devices/bad.json", "not a device status: JSON is malformed"),
    ]
    lines = format_table(reports, NOW, timedelta(hours=1)).splitlines()
    assert lines[0].split() == ["DEVICE", "CHANNEL", "REVISION", "READY", "LAST", "SYNC", "REPORTED", "LAST", "ERROR"]
    one, two, three, bad = lines[1:]
    assert one.split() == ["edge-01", "stable", "3f2a9c0d11e4b5a6", "1/2", "5m", "ago", "1m", "ago", "-"]
    assert two.split()[:5] == ["edge-02", "-", "-", "0/0", "never"] and two.endswith("endpoint unreachable")
    assert "3h ago STALE" in three and "(signed)" in three and "STALE" not in one + two
    assert bad.startswith(".edged/devices/bad.json") and "unreadable: not a device status" in bad


def test_the_table_escapes_what_a_device_wrote() -> None:
    hostile = status(channel="st\x1b[2Jable", last_error="\x1b]0;owned\x07 boom\nline")
    text = format_table([hostile], NOW)
    assert "\x1b" not in text and "\x07" not in text and len(text.splitlines()) == 2
    assert "\\x1b[2J" in text


def test_an_empty_fleet_says_so() -> None:
    assert format_table([], NOW) == "no device has reported"


def test_durations() -> None:
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("2h") == timedelta(hours=2)
    for bad in ("", "h", "0m", "1w", "-1h", "1.5h"):
        with pytest.raises(ValueError):
            parse_duration(bad)
