"""Repository sync: its runs, and the verdicts of the probations

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # sa.DateTime, not schema.UTCDateTime: see 0001.
    op.create_table(
        "sync_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.Column("revision", sa.String(), nullable=True),
        sa.Column("previous", sa.String(), nullable=True),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("problem", sa.String(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("duration_s", sa.Double(), nullable=True),
        sa.CheckConstraint("bytes >= 0", name=op.f("ck_sync_runs_bytes_not_negative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sync_runs")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_sync_runs_source_id", "sync_runs", ["source", "id"], unique=False)
    op.create_table(
        "sync_verdicts",
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("revision", sa.String(), nullable=False),
        sa.Column("verdict", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("source", "revision", name=op.f("pk_sync_verdicts")),
    )


def downgrade() -> None:
    op.drop_table("sync_verdicts")
    op.drop_index("ix_sync_runs_source_id", table_name="sync_runs")
    op.drop_table("sync_runs")
