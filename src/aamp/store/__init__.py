"""The control plane's database: SQLite under $AAMP_HOME by default, PostgreSQL by URL.

Usage::

    store = Store.open(settings)          # engine + migrations to head
    with store.session() as s: ...        # reads
    with store.write_session() as s: ...  # read-modify-write, committed on exit
    store.close()

Tables live in `aamp.store.tables` (one module per domain), migrations in
`aamp/store/migrations/versions/`.
"""

from aamp.store.store import Store, quick_read
from aamp.store.url import DATABASE_URL_ENV, DatabaseConfigError, database_url

__all__ = ["DATABASE_URL_ENV", "DatabaseConfigError", "Store", "database_url", "quick_read"]
