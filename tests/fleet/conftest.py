"""Every test here runs on both backends: a SQLite file and a real PostgreSQL server."""

from db_fixtures import settings, store  # noqa: F401  (fixtures)
