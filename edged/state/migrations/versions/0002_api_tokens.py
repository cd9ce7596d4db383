"""API tokens, and who asked for each change

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # sa.DateTime, not schema.UTCDateTime: see 0001.
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token_id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("role", sa.String(), nullable=False),
        sa.Column("secret_sha256", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("name", name=op.f("uq_api_tokens_name")),
        sa.UniqueConstraint("token_id", name=op.f("uq_api_tokens_token_id")),
    )
    # A nullable column is added in place (SQLite's ALTER TABLE ADD COLUMN): the history table is never rebuilt.
    op.add_column("transitions", sa.Column("actor", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("transitions") as batch_op:
        batch_op.drop_column("actor")
    op.drop_table("api_tokens")
