"""The audit history: account actions (logins, users made and disabled, passwords set) beside model transitions,
and the index that reads both newest first

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # sa.DateTime, not schema.UTCDateTime: see 0001.
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("target", sa.String(), nullable=False),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("peer", sa.String(), nullable=True),
        sa.Column("source", sa.String(), nullable=False),
        sa.CheckConstraint("outcome IN ('done', 'refused')", name=op.f("ck_audit_events_outcome_known")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_events_at", "audit_events", ["at"], unique=False)
    op.create_index("ix_transitions_at", "transitions", ["at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_transitions_at", table_name="transitions")
    op.drop_index("ix_audit_events_at", table_name="audit_events")
    op.drop_table("audit_events")
