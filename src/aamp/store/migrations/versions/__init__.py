"""The store's Alembic revisions: one file a step, chained by `down_revision`."""
