"""The web UI, served with the API on one port: `create_site(cp)` is the API under `/v1` and
the UI's pages under `/`, every response with a strict Content-Security-Policy.

The UI decides nothing: each page is a client of the API (`backend.py`), so the guard, the
one `allowed`, and the audit records are the API's own. Names load on first use.
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    site: CSP create_site site_of
    """,
)
