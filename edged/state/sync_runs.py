"""The state database's side of repository sync: its runs and the verdicts of its probations (tables in
edged.state.schema)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import delete, func, insert, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from edged.state import schema
from edged.state.records import Records, inserted_id

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


# The tables by other names: a method is called sync_runs() too.
_RUNS: Final = schema.sync_runs
_VERDICTS: Final = schema.sync_verdicts
# A run's columns, named as SyncRunRecord's fields.
_RUN: Final = (
    _RUNS.c.source,
    _RUNS.c.outcome,
    _RUNS.c.revision,
    _RUNS.c.previous,
    _RUNS.c.files,
    _RUNS.c.bytes,
    _RUNS.c.problem,
    _RUNS.c.message,
    _RUNS.c.at,
    _RUNS.c.duration_s,
    _RUNS.c.id,
)


class SyncRecords(Records):
    """Sync runs and probation verdicts; mixed into edged.state.store.StateStore."""

    def add_sync_run(self, run: SyncRunRecord) -> SyncRunRecord:
        """Stores a run; keeps the newest ``history_per_model`` runs of its source."""
        with self._transaction(write=True) as connection:
            added = connection.execute(
                insert(_RUNS).values(
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
            )
            run_id = inserted_id(added)
            if run_id % _PRUNE_EVERY == 0:
                oldest_kept = connection.scalar(
                    select(_RUNS.c.id)
                    .where(_RUNS.c.source == run.source)
                    .order_by(_RUNS.c.id.desc())
                    .offset(self._history_per_model - 1)
                    .limit(1)
                )
                if oldest_kept is not None:
                    connection.execute(delete(_RUNS).where(_RUNS.c.source == run.source, _RUNS.c.id < oldest_kept))
            return replace(run, id=run_id)

    def sync_runs(self, source: str | None, *, offset: int = 0, limit: int = 50) -> tuple[list[SyncRunRecord], int]:
        """A page of sync runs, newest first, and how many there are; ``source`` None: every source's."""
        if offset < 0 or limit < 1:
            raise ValueError(f"sync history needs offset >= 0 and limit >= 1, got offset {offset} and limit {limit}")
        with self._transaction(write=False) as connection:
            page = select(*_RUN)
            count = select(func.count()).select_from(_RUNS)
            if source is not None:
                page, count = page.where(_RUNS.c.source == source), count.where(_RUNS.c.source == source)
            total = connection.scalar(count) or 0
            rows = connection.execute(page.order_by(_RUNS.c.id.desc()).offset(offset).limit(limit)).mappings()
            return [SyncRunRecord(**row) for row in rows], total

    def set_verdict(self, source: str, revision: str, verdict: str, reason: str) -> None:
        """Records what a probation decided of ``revision`` (good or bad), replacing an earlier verdict."""
        with self._transaction(write=True) as connection:
            upsert = sqlite_insert(_VERDICTS).values(
                source=source, revision=revision, verdict=verdict, reason=reason, at=_now()
            )
            connection.execute(
                upsert.on_conflict_do_update(
                    index_elements=[_VERDICTS.c.source, _VERDICTS.c.revision],
                    set_={
                        "verdict": upsert.excluded.verdict,
                        "reason": upsert.excluded.reason,
                        "at": upsert.excluded.at,
                    },
                )
            )

    def verdicts(self, source: str) -> dict[str, str]:
        """Revision -> verdict, for one source."""
        with self._transaction(write=False) as connection:
            rows = connection.execute(
                select(_VERDICTS.c.revision, _VERDICTS.c.verdict).where(_VERDICTS.c.source == source)
            )
            return {revision: verdict for revision, verdict in rows}


def _now() -> datetime:
    return datetime.now(UTC)
