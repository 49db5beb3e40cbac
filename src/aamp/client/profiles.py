"""Login profiles: which control plane to talk to and the API token to talk with, one profile
per installation, in `$XDG_CONFIG_HOME/aamp/profiles.json` (default `~/.config/aamp`).

    {"default": "prod",
     "profiles": {"prod": {"url": "http://10.0.0.5:8700", "username": "bea",
                           "token": "aamp_…", "token_id": "tok-…"}}}

The file holds bearer tokens, so it is written 0600 in a 0700 directory, replaced atomically
(a crash leaves the old file or the new one, never half of one), and refused when it is
readable by anyone else or not owned by the user — as ssh treats its keys. Only `aamp login`
and `aamp logout` write it; the client reads it (`Client.from_profile`, and the CLI when no
AAMP_TOKEN is set).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from aamp.client.transport import ClientError

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.client
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

PROFILE_ENV = "AAMP_PROFILE"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
DEFAULT_NAME = "default"


def config_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "aamp"


def profiles_path(env: Mapping[str, str]) -> Path:
    return config_dir(env) / "profiles.json"


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ClientError(
            "invalid_request",
            f"profile {name!r}: a profile's name is 1-64 letters, digits, '.', '_' or '-'",
        )
    return name


class Profiles:
    """The profiles file as a value: read it, change it, `save` it."""

    def __init__(self, path: Path, data: dict[str, Any]):
        self.path = path
        self.default: str | None = data.get("default")
        self.profiles: dict[str, dict[str, Any]] = dict(data.get("profiles") or {})

    @classmethod
    def load(cls, env: Mapping[str, str]) -> Profiles:
        path = profiles_path(env)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return cls(path, {})
        except OSError as exc:
            raise ClientError("bad_profiles", f"cannot read {path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise ClientError(
                    "bad_profiles",
                    f"{path} holds API tokens but is readable by others or not yours "
                    f"(mode {stat.filemode(st.st_mode)}); run `chmod 600 {path}`",
                )
            raw = f.read()
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or not isinstance(data.get("profiles", {}), dict):
                raise ValueError("not an object with profiles")
        except ValueError as exc:
            raise ClientError("bad_profiles", f"{path} is not a profiles file: {exc}") from None
        return cls(path, data)

    def chosen(self, name: str | None) -> tuple[str, dict[str, Any]] | None:
        """The profile `name` (it must exist), else the default one, else None."""
        if name is not None:
            if name not in self.profiles:
                known = ", ".join(sorted(self.profiles)) or "none"
                raise ClientError(
                    "no_profile",
                    f"no profile {name!r} in {self.path} (profiles: {known}); "
                    f"run `aamp login --profile {name}`",
                )
            return name, self.profiles[name]
        if self.default in self.profiles:
            return self.default, self.profiles[self.default]
        return None

    def save(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path.parent, 0o700)
        body = json.dumps({"default": self.default, "profiles": self.profiles}, indent=2)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(body + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
