"""The store's schema migrations (Alembic): `env.py` runs them on the connection
`aamp.store.migrate` opens; `versions/` holds one file a step, in order."""
