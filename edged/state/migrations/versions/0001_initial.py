"""Initial schema: models, versions seen, state transitions, explicit mode's desired set

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Timestamps are sa.DateTime here, not schema.UTCDateTime: a revision must keep meaning what it meant when
    # written, whatever schema.py later becomes; UTCDateTime stores exactly a DateTime.
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("name", name=op.f("uq_models_name")),
    )
    op.create_table(
        "model_versions",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("checksum", sa.String(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("first_seen", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=False),
        sa.CheckConstraint("size >= 0", name=op.f("ck_model_versions_size_not_negative")),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_model_versions_model_id_models"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("model_id", "version", name=op.f("pk_model_versions")),
    )
    op.create_table(
        "transitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("previous", sa.String(), nullable=True),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("duration_s", sa.Double(), nullable=True),
        sa.CheckConstraint("duration_s IS NULL OR duration_s >= 0", name=op.f("ck_transitions_duration_not_negative")),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_transitions_model_id_models"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_transitions")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_transitions_model_id_id", "transitions", ["model_id", "id"])
    op.create_index("ix_transitions_model_id_version_id", "transitions", ["model_id", "version", "id"])
    op.create_table(
        "desired_models",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("by_policy", sa.Boolean(), nullable=False),
        sa.Column("set_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_desired_models_model_id_models"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("model_id", name=op.f("pk_desired_models")),
    )
    op.create_table(
        "desired_versions",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["desired_models.model_id"],
            name=op.f("fk_desired_versions_model_id_desired_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", "version", name=op.f("pk_desired_versions")),
    )


def downgrade() -> None:
    op.drop_table("desired_versions")
    op.drop_table("desired_models")
    op.drop_index("ix_transitions_model_id_version_id", table_name="transitions")
    op.drop_index("ix_transitions_model_id_id", table_name="transitions")
    op.drop_table("transitions")
    op.drop_table("model_versions")
    op.drop_table("models")
