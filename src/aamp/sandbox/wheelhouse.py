"""The installation's offline wheelhouse: the only source of a policy's `packages:`.

`$AAMP_HOME/wheelhouse/` holds wheel files and `index.json`, which records each wheel's
name, version, SHA-256, size, and who added it when. Wheels come in two ways: `add` runs pip
(with the host's configured index) to download requirements and their dependencies as wheels
for the guest's Python (Debian bookworm's CPython 3.11 on x86_64, glibc 2.36), and
`add_files` takes wheels brought on media to an air-gapped site. Either way each file is
checked before it is kept: a well-formed wheel file name, a wheel the guest's Python can
install (`guest_can_use`), at most MAX_WHEEL_BYTES, and its hash recorded.

`pinned(packages)` turns a policy's `name==version` list into exactly those wheels, or raises
`WheelhouseError` naming each package or version the wheelhouse lacks, and each dependency
(Requires-Dist, markers evaluated for the guest) that is neither in the list nor among the
image's own Python distributions — a policy gets exactly what it names, so it must name all.
The derived image layer that installs them is `aamp.sandbox.images.ImageStore.with_packages`.
"""

from __future__ import annotations

import contextlib
import email.parser
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from aamp.config import Settings
from aamp.sandbox.image_recipes import GUEST_PYTHON_VERSION, guest_pip_target_args
from aamp.values import Shown

MAX_WHEEL_BYTES = 500_000_000
# A wheel's file name as this product takes one from outside (unanchored: each use anchors it).
WHEEL_FILENAME = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,250}\.whl"
MAX_METADATA_BYTES = 5_000_000
INDEX = "index.json"
_GUEST_GLIBC_MINOR = 36  # bookworm's glibc 2.36
_PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(_GUEST_GLIBC_MINOR, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
_PYTHON = tuple(int(p) for p in GUEST_PYTHON_VERSION.split("."))
GUEST_TAGS: frozenset[Tag] = frozenset(
    [
        *cpython_tags(_PYTHON, platforms=_PLATFORMS),
        *compatible_tags(_PYTHON, f"cp{_PYTHON[0]}{_PYTHON[1]}", _PLATFORMS),
    ]
)
# The guest's marker environment: the one pip inside the guest would evaluate.
GUEST_MARKERS = {
    **default_environment(),
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "python_version": GUEST_PYTHON_VERSION,
    "python_full_version": GUEST_PYTHON_VERSION + ".2",
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "extra": "",
}


class WheelhouseError(ValueError):
    """A wheel that cannot be kept, or packages the wheelhouse cannot provide; the message
    names each one."""


@dataclass(frozen=True)
class Wheel(Shown):
    filename: str
    name: str  # canonical (PEP 503) name
    version: str
    sha256: str
    size: int
    added_at: str
    added_by: str


def guest_can_use(filename: str) -> str | None:
    """None if the guest's Python can install this wheel, else why not."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        return f"{filename}: not a wheel file name ({exc})"
    if tags.isdisjoint(GUEST_TAGS):
        shown = ", ".join(sorted(str(t) for t in tags)[:4])
        return (
            f"{filename}: the guest's Python (CPython {GUEST_PYTHON_VERSION}, Linux x86_64, "
            f"glibc 2.{_GUEST_GLIBC_MINOR}) cannot use a wheel tagged {shown}"
        )
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def requirements_of(path: Path) -> list[Requirement]:
    """The wheel's Requires-Dist that apply in the guest (no extras asked for)."""
    with zipfile.ZipFile(path) as archive:
        metadata = [
            i for i in archive.infolist() if i.filename.count("/") == 1
            and i.filename.endswith(".dist-info/METADATA")
        ]  # fmt: skip
        if len(metadata) != 1 or metadata[0].file_size > MAX_METADATA_BYTES:
            raise WheelhouseError(f"{path.name}: no readable .dist-info/METADATA")
        text = archive.read(metadata[0]).decode("utf-8", "replace")
    message = email.parser.Parser().parsestr(text, headersonly=True)
    found = []
    for line in message.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            raise WheelhouseError(f"{path.name}: bad Requires-Dist {line!r}") from None
        if req.marker is None or req.marker.evaluate(GUEST_MARKERS):
            found.append(req)
    return found


class Wheelhouse:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = settings.home / "wheelhouse"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, object]]]:
        """The index, under an exclusive lock; written back (atomically) when the block ends."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            index = self._read()
            before = json.dumps(index, sort_keys=True)
            yield index
            if json.dumps(index, sort_keys=True) != before:
                tmp = self.root / f".{INDEX}.tmp"
                tmp.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, self.root / INDEX)
        finally:
            os.close(fd)

    def _read(self) -> dict[str, dict[str, object]]:
        try:
            data = json.loads((self.root / INDEX).read_text())
        except FileNotFoundError:
            return {}
        return data if isinstance(data, dict) else {}

    def list(self) -> list[Wheel]:
        return sorted(
            (Wheel(**entry) for entry in self._read().values()),  # type: ignore[arg-type]
            key=lambda w: (w.name, w.version, w.filename),
        )

    def path(self, wheel: Wheel) -> Path:
        return self.root / wheel.filename

    # ---- adding and removing

    def add_files(self, paths: Iterable[Path], *, by: str) -> list[Wheel]:
        """Keep these wheel files (each checked, hashed); all or none. A file already kept
        with the same hash is a no-op; with another hash it is refused."""
        paths = list(paths)
        problems = []
        for path in paths:
            why = guest_can_use(path.name)
            if why is None and (not path.is_file() or path.stat().st_size > MAX_WHEEL_BYTES):
                why = f"{path.name}: not a file of at most {MAX_WHEEL_BYTES} bytes"
            if why is None:
                try:
                    requirements_of(path)
                except (zipfile.BadZipFile, WheelhouseError) as exc:
                    why = f"{path.name}: not a readable wheel ({exc})"
            if why:
                problems.append(why)
        if problems:
            raise WheelhouseError("refused: " + "; ".join(problems))
        added = []
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        with self._locked() as index:
            for path in paths:
                digest = _sha256(path)
                known = index.get(path.name)
                if known is not None:
                    if known["sha256"] != digest:
                        raise WheelhouseError(
                            f"refused: {path.name} is already in the wheelhouse with another "
                            f"SHA-256 ({known['sha256']}); remove it first"
                        )
                    added.append(Wheel(**known))  # type: ignore[arg-type]
                    continue
                name, version, _, _ = parse_wheel_filename(path.name)
                tmp = self.root / f".{path.name}.tmp"
                shutil.copyfile(path, tmp)
                if _sha256(tmp) != digest:
                    tmp.unlink()
                    raise WheelhouseError(f"{path.name} changed while it was copied")
                os.replace(tmp, self.root / path.name)
                size = (self.root / path.name).stat().st_size
                wheel = Wheel(path.name, str(name), str(version), digest, size, stamp, by)
                index[path.name] = wheel.to_dict()
                added.append(wheel)
        return added

    def add(self, requirements: Sequence[str], *, by: str) -> list[Wheel]:
        """Download `requirements` and their dependencies as wheels for the guest (pip, with
        this host's configured index), then keep them like `add_files`."""
        for text in requirements:
            try:
                req = Requirement(text)
            except InvalidRequirement as exc:
                raise WheelhouseError(f"{text!r} is not a requirement: {exc}") from None
            if text.startswith("-"):
                raise WheelhouseError(f"{text!r} is not a requirement")
            if req.url:  # the host would fetch it from anywhere, not from the index
                raise WheelhouseError(f"{text!r}: a URL requirement is refused; use the index")
        with tempfile.TemporaryDirectory(prefix="aamp-wheels-") as tmp:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", *guest_pip_target_args(),
                 "--progress-bar=off", "--disable-pip-version-check", f"--dest={tmp}",
                 "--", *requirements],
                capture_output=True,
                timeout=1800,
                check=False,
            )  # fmt: skip
            if done.returncode != 0:
                tail = (done.stdout + done.stderr).decode("utf-8", "replace").strip()[-1500:]
                raise WheelhouseError(f"pip download failed:\n{tail}")
            return self.add_files(sorted(Path(tmp).glob("*.whl")), by=by)

    def remove(self, name: str, version: str | None = None) -> list[Wheel]:
        """Remove every wheel of `name` (of `version`, if given); the removed ones."""
        wanted = canonicalize_name(name)
        with self._locked() as index:
            gone = [
                Wheel(**e)  # type: ignore[arg-type]
                for e in index.values()
                if e["name"] == wanted and (version is None or e["version"] == version)
            ]
            if not gone:
                what = f"{name}=={version}" if version else name
                raise WheelhouseError(f"{what} is not in the wheelhouse")
            for wheel in gone:
                del index[wheel.filename]
                (self.root / wheel.filename).unlink(missing_ok=True)
        return gone

    # ---- what a policy gets

    def pinned(self, packages: Sequence[str], provided: Iterable[str] = ()) -> list[Wheel]:
        """Exactly the wheels of `packages` (`name==version` each), or WheelhouseError naming
        every one missing and every dependency neither listed nor in `provided` (the
        distributions the image already has)."""
        chosen, problems = self._chosen(packages)
        problems += dependency_problems(
            packages, [(self.path(w), f"{w.name}=={w.version}") for w in chosen], provided
        )
        if problems:
            raise WheelhouseError("packages: " + "; ".join(problems))
        return chosen

    def chosen(self, packages: Sequence[str]) -> list[Wheel]:
        """The wheel of each of `packages`, or WheelhouseError naming every one missing; their
        dependencies are checked where the image is (`dependency_problems`): a replica that
        sends them to a sandbox host on another machine may not have the image built."""
        chosen, problems = self._chosen(packages)
        if problems:
            raise WheelhouseError("packages: " + "; ".join(problems))
        return chosen

    def _chosen(self, packages: Sequence[str]) -> tuple[list[Wheel], list[str]]:
        wheels = self.list()
        chosen: list[Wheel] = []
        problems: list[str] = []
        for text in packages:
            name, _, version = text.partition("==")
            key = canonicalize_name(name)
            same = [w for w in wheels if w.name == key]
            match = [w for w in same if w.version == version]
            if not match:
                have = ", ".join(sorted({w.version for w in same})) or "none"
                problems.append(
                    f"{text} is not in the wheelhouse (versions there: {have}); "
                    f"an admin adds it with: aamp wheelhouse add {text}"
                )
                continue
            usable = [w for w in match if guest_can_use(w.filename) is None]
            if not usable:
                problems.append(f"{text}: no wheel the guest's Python can use")
                continue
            chosen.append(usable[0])
        return chosen, problems


def dependency_problems(
    packages: Sequence[str], wheels: Sequence[tuple[Path, str]], provided: Iterable[str]
) -> list[str]:
    """Each dependency of `wheels` ((file, `name==version`) each) that is neither among
    `packages` (at a version it accepts) nor in `provided` (the image's own distributions)."""
    listed = {canonicalize_name(p.partition("==")[0]): p.partition("==")[2] for p in packages}
    have = {canonicalize_name(p) for p in provided}
    problems = []
    for path, shown in wheels:
        for req in requirements_of(path):
            dep = canonicalize_name(req.name)
            if dep in have:
                continue
            if dep not in listed:
                problems.append(f"{shown} needs {req}; list it too")
            elif not req.specifier.contains(listed[dep], prereleases=True):
                problems.append(f"{shown} needs {req}, not {dep}=={listed[dep]}")
    return problems
