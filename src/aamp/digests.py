"""What a SHA-256 that names something looks like: 64 lowercase hex digits.

Images' builds, wheels and files held for remote sandboxes are all named by the SHA-256 of
their bytes, and each name arrives from outside (a directory listing, a replica over the
link, a request path) before it is used as a file name. One pattern for all of them, so a
name one package takes is one every other takes too. This module imports nothing of aamp.
"""

from __future__ import annotations

import re

SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")


def is_sha256(value: object) -> bool:
    """Whether `value` is a SHA-256 written as this product writes one."""
    return isinstance(value, str) and SHA256_RE.match(value) is not None
