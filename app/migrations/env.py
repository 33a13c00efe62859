"""Alembic environment: run by `app.store.migrate` (online, on the store's connection)
or by the `alembic` CLI with `-c app/alembic.ini` (URL from CKPTGUARD_DATABASE_URL)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from ckptguard.app.tables import metadata, ours

config = context.config


def _run(connection: sa.Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, include_name=ours,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
elif context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    from ckptguard.app.settings import Settings

    engine = sa.create_engine(Settings().resolved_database_url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
