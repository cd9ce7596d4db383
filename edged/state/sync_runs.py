"""The state database's side of repository sync: its runs and the verdicts of its probations (table models in
edged.state.schema)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import delete, func, select

from edged.state.records import Records
from edged.state.schema import SyncRun, SyncVerdict

# Old runs are dropped every this many runs written (as the model history's events are).
_PRUNE_EVERY: Final = 256


@dataclass(frozen=True, slots=True)
class SyncRunRecord:
    """One run of a repository sync as the history keeps it (``id`` 0 before it is stored)."""

    source: str
    outcome: str  # updated, unchanged, held-back, failed, rolled-back, committed
    revision: str | None
    previous: str | None
    files: int
    bytes: int
    problem: str | None
    message: str
    at: datetime  # tz-aware, UTC
    duration_s: float | None
    id: int = 0


class SyncRecords(Records):
    """Sync runs and probation verdicts; mixed into edged.state.store.StateStore."""

    def add_sync_run(self, run: SyncRunRecord) -> SyncRunRecord:
        """Stores a run; keeps the newest ``history_per_model`` runs of its source."""
        with self._session(write=True) as session:
            row = SyncRun(
                source=run.source,
                outcome=run.outcome,
                revision=run.revision,
                previous=run.previous,
                files=run.files,
                bytes=run.bytes,
                problem=run.problem,
                message=run.message,
                at=run.at,
                duration_s=run.duration_s,
            )
            session.add(row)
            session.flush()
            if row.id % _PRUNE_EVERY == 0:
                oldest_kept = session.scalar(
                    select(SyncRun.id)
                    .where(SyncRun.source == run.source)
                    .order_by(SyncRun.id.desc())
                    .offset(self._history_per_model - 1)
                    .limit(1)
                )
                if oldest_kept is not None:
                    session.execute(delete(SyncRun).where(SyncRun.source == run.source, SyncRun.id < oldest_kept))
            return _sync_run(row)

    def sync_runs(self, source: str | None, *, offset: int = 0, limit: int = 50) -> tuple[list[SyncRunRecord], int]:
        """A page of sync runs, newest first, and how many there are; ``source`` None: every source's."""
        if offset < 0 or limit < 1:
            raise ValueError(f"sync history needs offset >= 0 and limit >= 1, got offset {offset} and limit {limit}")
        with self._session(write=False) as session:
            page = select(SyncRun)
            count = select(func.count()).select_from(SyncRun)
            if source is not None:
                page, count = page.where(SyncRun.source == source), count.where(SyncRun.source == source)
            total = session.scalar(count) or 0
            rows = session.scalars(page.order_by(SyncRun.id.desc()).offset(offset).limit(limit))
            return [_sync_run(row) for row in rows], total

    def set_verdict(self, source: str, revision: str, verdict: str, reason: str) -> None:
        """Records what a probation decided of ``revision`` (good or bad), replacing an earlier verdict."""
        with self._session(write=True) as session:
            row = session.get(SyncVerdict, (source, revision))
            if row is None:
                session.add(SyncVerdict(source=source, revision=revision, verdict=verdict, reason=reason, at=_now()))
            else:
                row.verdict, row.reason, row.at = verdict, reason, _now()

    def verdicts(self, source: str) -> dict[str, str]:
        """Revision -> verdict, for one source."""
        with self._session(write=False) as session:
            rows = session.execute(
                select(SyncVerdict.revision, SyncVerdict.verdict).where(SyncVerdict.source == source)
            )
            return {revision: verdict for revision, verdict in rows}


def _sync_run(row: SyncRun) -> SyncRunRecord:
    return SyncRunRecord(
        row.source,
        row.outcome,
        row.revision,
        row.previous,
        row.files,
        row.bytes,
        row.problem,
        row.message,
        row.at,
        row.duration_s,
        row.id,
    )


def _now() -> datetime:
    return datetime.now(UTC)
