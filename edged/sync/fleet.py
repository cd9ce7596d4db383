"""The fleet view: channels, and the status objects devices write back to the bucket they sync from.

A device configured with repository URL ``BASE`` and channel ``C`` syncs the repository at ``BASE/C`` (without a
channel, ``BASE`` itself), and, when its operator enables it, writes ``BASE/.edged/devices/<device id>.json`` after
each sync run. ``edged fleet status BASE`` reads them all back. The bucket is the only thing between devices and
operators: no server of edged's relays either.

Everything read back is treated as untrusted: any device with write access to the bucket could write anything
there, so an object is read only up to ``MAX_STATUS_BYTES``, decoded against ``DeviceStatus``'s schema, and every
string it holds is escaped before it reaches a terminal.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Final

import msgspec

from edged.core.names import model_name_problem, printable
from edged.sync import paths
from edged.sync.errors import SourceProblem, SyncError
from edged.sync.plan import RemoteEntry
from edged.sync.runner import METADATA_DIR

if TYPE_CHECKING:
    from edged.sync.sources import RemoteRepository

DEVICES_DIR: Final = f"{METADATA_DIR}/devices"
# A status with a few hundred models is a few tens of KB; anything far beyond is not a status object.
MAX_STATUS_BYTES: Final = 256 << 10
# An error message is kept to its useful beginning (S3 error bodies can run long).
MAX_ERROR_CHARS: Final = 1000
# A device id becomes an object key and a row of a table: letters, digits, '.', '_' and '-', starting with a letter
# or digit (hostnames, serial numbers and UUIDs fit), so it can never be read as a folder, a hidden file or an
# option, whatever the store or the shell does with it.
_DEVICE_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Device objects read at once by ``fleet``: enough to hide the latency of a few hundred small reads.
READ_CONCURRENCY: Final = 16
STALE_AFTER: Final = timedelta(hours=1)

# Only timestamps with a zone are accepted: a naive one is ambiguous across a fleet's clocks.
Timestamp = Annotated[datetime, msgspec.Meta(tz=True)]


class ModelStatus(msgspec.Struct, frozen=True):
    """One model on a device: its state in Triton's words (READY, UNAVAILABLE, LOADING, UNLOADING, UNKNOWN) and
    the version it serves, if any."""

    state: str
    version: str | None = None


class DeviceStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What a device reports after a sync run. Unknown fields are ignored when read, so that a newer edged's
    reports stay readable by an older one."""

    device: str
    channel: str | None
    # The revision being served (None: no sync has succeeded yet), and whether it came from signed metadata.
    revision: str | None
    signed: bool = False
    models: dict[str, ModelStatus] = {}
    last_error: str | None = None
    last_sync: Timestamp | None = None
    updated_at: Timestamp
    edged_version: str

    @property
    def ready(self) -> int:
        return sum(1 for model in self.models.values() if model.state == "READY")


@dataclass(frozen=True)
class Unreadable:
    """A device object that could not be read or is not a device status: its key and why."""

    key: str
    reason: str


def device_id_problem(device: str) -> str | None:
    """Why ``device`` cannot be a device id, or None when it can."""
    if _DEVICE_ID.fullmatch(device) is None:
        return (
            f"device id '{printable(device)}' must be 1 to 128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return None


def channel_problem(channel: str) -> str | None:
    """Why ``channel`` cannot name a channel (one folder of the base repository), or None when it can."""
    problem = model_name_problem(channel)
    if problem is not None:
        return f"channel '{printable(channel)}' is refused: {problem}"
    if channel == METADATA_DIR:
        return f"channel '{METADATA_DIR}' is edged's own folder, not a repository"
    return None


def channel_url(base: str, channel: str | None) -> str:
    """The repository a device on ``channel`` syncs: ``base/channel``, or ``base`` without a channel. Raises
    SyncError(BAD_URL) for a channel that is not a single folder name."""
    problem = channel_problem(channel) if channel is not None else None
    if problem is not None:
        raise SyncError(SourceProblem.BAD_URL, problem)
    return paths.channel_url(base, channel)


def status_key(device: str) -> str:
    """The key of a device's status object, relative to the base repository; raises ValueError for a bad id."""
    problem = device_id_problem(device)
    if problem is not None:
        raise ValueError(problem)
    return f"{DEVICES_DIR}/{device}.json"


def encode(status: DeviceStatus) -> bytes:
    """The status object's bytes: the last error shortened; ValueError for a bad device id or channel, or an object
    over MAX_STATUS_BYTES."""
    status_key(status.device)
    if status.channel is not None and (problem := channel_problem(status.channel)) is not None:
        raise ValueError(problem)
    if status.last_error is not None and len(status.last_error) > MAX_ERROR_CHARS:
        status = msgspec.structs.replace(status, last_error=status.last_error[: MAX_ERROR_CHARS - 3] + "...")
    data = msgspec.json.encode(status)
    if len(data) > MAX_STATUS_BYTES:
        raise ValueError(f"device {status.device}: status of {len(data)} bytes is over {MAX_STATUS_BYTES}")
    return data


def decode(key: str, data: bytes) -> DeviceStatus | Unreadable:
    """A device object's content, or why it is not a status of the device its key names."""
    if len(data) > MAX_STATUS_BYTES:
        return Unreadable(key, f"larger than {MAX_STATUS_BYTES} bytes")
    try:
        status = msgspec.json.decode(data, type=DeviceStatus)
    except msgspec.DecodeError as exc:
        return Unreadable(key, f"not a device status: {exc}")
    # A device writes only its own key; an object naming another device is a copy or a forgery, not its report.
    if key != f"{DEVICES_DIR}/{status.device}.json":
        return Unreadable(key, f"names device '{printable(status.device)}', not the one its key names")
    return status


async def report(base: RemoteRepository, status: DeviceStatus) -> None:
    """Write ``status`` to ``base/.edged/devices/<device>.json``, replacing the device's last report. Raises
    ValueError for a status that cannot be written (bad id or channel, too large), SyncError when the store
    refuses it."""
    await base.write(status_key(status.device), encode(status))


async def fleet(base: RemoteRepository) -> list[DeviceStatus | Unreadable]:
    """Every device object of ``base``, read (at most MAX_STATUS_BYTES each) and decoded, sorted by key; a malformed,
    oversized or vanished object is an ``Unreadable``. Raises SyncError when the repository cannot be listed."""
    folder = f"{DEVICES_DIR}/"
    entries = sorted(
        (entry for entry in await base.list() if entry.path.startswith(folder) and entry.path.endswith(".json")),
        key=lambda entry: entry.path,
    )
    limit = asyncio.Semaphore(READ_CONCURRENCY)

    async def one(entry: RemoteEntry) -> DeviceStatus | Unreadable:
        if entry.size > MAX_STATUS_BYTES:
            return Unreadable(entry.path, f"{entry.size} bytes, larger than {MAX_STATUS_BYTES}")
        async with limit:
            try:
                data = await _read_capped(base, entry.path)
            except SyncError as exc:
                return Unreadable(entry.path, str(exc))
        return decode(entry.path, data)

    return list(await asyncio.gather(*(one(entry) for entry in entries)))


async def _read_capped(base: RemoteRepository, key: str) -> bytes:
    # Unconditional and whole (no digest, no version): the object may have been replaced since the listing, and
    # whatever it is now is the latest report. One byte past the cap is enough to know it is over.
    data = bytearray()
    chunks = base.read(RemoteEntry(key, 0, "", None), 0)
    try:
        async for chunk in chunks:
            data += chunk
            if len(data) > MAX_STATUS_BYTES:
                break
    finally:
        # Leaving the read early must still end its request, not leave it to the garbage collector.
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()
    return bytes(data)


# --- the table --------------------------------------------------------------------------------------------------


def is_stale(status: DeviceStatus, now: datetime, stale_after: timedelta = STALE_AFTER) -> bool:
    return now - status.updated_at > stale_after


def format_table(
    reports: Sequence[DeviceStatus | Unreadable], now: datetime | None = None, stale_after: timedelta = STALE_AFTER
) -> str:
    """One row per device: device, channel, revision, models ready/total, last successful sync, age of the report
    (``stale`` past ``stale_after``), last error. Every value from the bucket is escaped for the terminal."""
    now = now or datetime.now(UTC)
    header = ("DEVICE", "CHANNEL", "REVISION", "READY", "LAST SYNC", "REPORTED", "LAST ERROR")
    rows: list[tuple[str, ...]] = []
    for item in reports:
        if isinstance(item, Unreadable):
            rows.append((printable(item.key, 40), "-", "-", "-", "-", "-", f"unreadable: {printable(item.reason)}"))
            continue
        reported = _ago(now, item.updated_at)
        rows.append(
            (
                printable(item.device, 40),
                printable(item.channel, 24) if item.channel is not None else "-",
                _revision(item),
                f"{item.ready}/{len(item.models)}",
                _ago(now, item.last_sync) if item.last_sync is not None else "never",
                f"{reported} STALE" if is_stale(item, now, stale_after) else reported,
                printable(item.last_error) if item.last_error else "-",
            )
        )
    if not rows:
        return "no device has reported"
    widths = [max(len(row[column]) for row in (header, *rows)) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    head = "  ".join(cell.ljust(width) for cell, width in zip(header, widths, strict=True)).rstrip()
    return "\n".join([head, *lines])


def _revision(status: DeviceStatus) -> str:
    if status.revision is None:
        return "-"
    shown = printable(status.revision, 24)
    return f"{shown} (signed)" if status.signed else shown


def _ago(now: datetime, then: datetime) -> str:
    seconds = int((now - then).total_seconds())
    if seconds < 0:
        # The device's clock runs ahead of this one's: say so rather than show a negative age.
        return "ahead"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def to_json(reports: Iterable[DeviceStatus | Unreadable], now: datetime, stale_after: timedelta) -> list[object]:
    """The reports as ``edged fleet status --json`` prints them: each status with ``stale``, each unreadable object
    as its key and reason."""
    out: list[object] = []
    for item in reports:
        if isinstance(item, Unreadable):
            out.append({"key": item.key, "unreadable": item.reason})
        else:
            out.append({**msgspec.to_builtins(item), "stale": is_stale(item, now, stale_after)})
    return out


def parse_duration(text: str) -> timedelta:
    """``90s``, ``30m``, ``2h`` or ``1d``; ValueError otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = text[:-1], text[-1:]
    if unit not in units or not number.isdigit() or int(number) == 0:
        raise ValueError(f"expected a duration such as 90s, 30m, 2h or 1d, got '{text}'")
    return timedelta(seconds=int(number) * units[unit])
