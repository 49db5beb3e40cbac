"""Offline bundles: everything an installation with no network needs (`create.py`), the
Debian repository inside one (`debian.py`), and the manifest every consumer verifies first
(`manifest.py`). Standard library only: it runs before anything is installed.
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    create: create main
    manifest: BundleRefused verify
    verify: check_main offline_status
    """,
)
