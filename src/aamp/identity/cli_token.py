"""The local CLI's API token, as the CLI reads it: `AAMP_TOKEN` if set, else the token file
`aamp up` keeps in `$AAMP_HOME/cli-token` (`bootstrap.ensure_cli_token`).

Standard library only, so a client that reads its token loads nothing of the server side.
"""

from __future__ import annotations

from pathlib import Path

TOKEN_ENV = "AAMP_TOKEN"


def read_token(path: Path, env: dict[str, str] | None = None) -> str | None:
    """The CLI's token: AAMP_TOKEN if set, else the token file's contents."""
    if env and env.get(TOKEN_ENV):
        return env[TOKEN_ENV].strip() or None
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
