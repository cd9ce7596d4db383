"""Each API token's last use: when, and from which client address

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # sa.DateTime, not schema.UTCDateTime: see 0001. Nullable columns are added in place (SQLite's ALTER TABLE ADD
    # COLUMN): the tokens keep their rows, and a token not used since reads as never used.
    op.add_column("api_tokens", sa.Column("last_used_at", sa.DateTime(), nullable=True))
    op.add_column("api_tokens", sa.Column("last_used_peer", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch_op:
        batch_op.drop_column("last_used_peer")
        batch_op.drop_column("last_used_at")
