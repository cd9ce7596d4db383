"""Alembic's environment for the state database, run programmatically by ``StateStore.open``.

There is no alembic.ini: the store builds the ``Config`` itself (``edged.state.store.alembic_config``) and hands
over its own connection, already inside a ``BEGIN IMMEDIATE`` transaction, in ``config.attributes["connection"]``.
All revisions then run in that one transaction, so an interrupted upgrade leaves the previous schema intact
(SQLite's DDL is transactional).

A new revision, after changing ``edged/state/schema.py``::

    .venv/bin/python -c 'from pathlib import Path; from alembic import command; \
        from edged.state.store import alembic_config; \
        command.revision(alembic_config(Path("/tmp/edged-rev.db")), autogenerate=True, rev_id="0002", message="...")'

(against a database at the current head, e.g. one ``StateStore.open`` just made).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from edged.state.schema import metadata

config = context.config


def run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=True,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


given = config.attributes.get("connection")
if isinstance(given, Connection):
    run_migrations(given)
else:
    # Only the revision command gets here (autogenerate), with the URL alembic_config put in the Config.
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("edged's migrations need a connection or sqlalchemy.url in the alembic Config")
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            run_migrations(connection)
    finally:
        engine.dispose()
