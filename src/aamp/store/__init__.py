"""The control plane's database: SQLite under $AAMP_HOME by default, PostgreSQL by URL.

Usage::

    store = Store.open(settings)          # engine + migrations to head
    with store.session() as s: ...        # reads
    with store.write_session() as s: ...  # read-modify-write, committed on exit
    store.close()

Tables live in `aamp.store.tables` (one module per domain; its own surface), migrations in
`aamp/store/migrations/versions/`. Also here: key files (`keyfiles.py`), timestamps as
stored (`timestamps.py`), read plans (`store.read_plan`).
"""

from aamp.store.keyfiles import (
    KeyFileError,
    fsync_dir,
    read_key_file,
    read_or_create_key_file,
    replace_key_file,
)
from aamp.store.rows import added, existing, locked, locked_or_new, value_of, values_where
from aamp.store.store import ReadPlan, Store, quick_read, read_plan
from aamp.store.timestamps import format_time, is_time, now, parse_time, time_at
from aamp.store.url import DATABASE_URL_ENV, DatabaseConfigError, database_url

__all__ = [
    "DATABASE_URL_ENV",
    "DatabaseConfigError",
    "KeyFileError",
    "ReadPlan",
    "Store",
    "added",
    "database_url",
    "existing",
    "format_time",
    "fsync_dir",
    "is_time",
    "locked",
    "locked_or_new",
    "now",
    "parse_time",
    "quick_read",
    "read_key_file",
    "read_or_create_key_file",
    "read_plan",
    "replace_key_file",
    "time_at",
    "value_of",
    "values_where",
]
