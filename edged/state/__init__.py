"""The daemon's persistent state: models and versions seen, every state transition, the desired set.

Only ``store.py`` issues SQL; everything else calls ``StateStore``'s typed methods. The package itself imports
nothing: ``directory`` (where the state lives) is read by every command, the store (SQLAlchemy, Alembic) only by the
daemon. ``lock`` keeps one daemon per state directory (only ``edged serve`` takes it).
"""
