"""Alerts an admin turns on in the console: the rules, the webhook they are sent to, and the alerts fired

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # sa.DateTime, not schema.UTCDateTime: see 0001. New tables only: nothing an older edged wrote changes.
    op.create_table(
        "alert_rules",
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("threshold", sa.Double(), nullable=True),
        sa.Column("changed_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("kind", name=op.f("pk_alert_rules")),
    )
    op.create_table(
        "alert_webhook",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(), nullable=False),
        sa.Column("set_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_alert_webhook_one_webhook")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_webhook")),
    )
    op.create_table(
        "alerts_fired",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("subject", sa.String(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("delivery", sa.String(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.CheckConstraint(
            "delivery IN ('pending', 'delivered', 'failed', 'unsent')", name=op.f("ck_alerts_fired_delivery_known")
        ),
        sa.CheckConstraint("tries >= 0", name=op.f("ck_alerts_fired_tries_not_negative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts_fired")),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("alerts_fired")
    op.drop_table("alert_webhook")
    op.drop_table("alert_rules")
