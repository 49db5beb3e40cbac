"""`scripts/install --bundle`'s wheelhouse step: the site's wheelhouse packages a bundle carries
(`wheels/wheelhouse/`, made by `scripts/bundle --wheelhouse FILE`) added to this
installation's offline wheelhouse (`$AAMP_HOME/wheelhouse`, `aamp.sandbox.wheelhouse`).

Each wheel is copied out of the bundle and checked against the manifest as it is copied (its
signature too, with `--trust`), so what enters the wheelhouse is what the manifest lists even
if the bundle changed after the install's first check; then the wheelhouse's own checks apply
(a wheel the guest can use, its hash recorded, a name already kept with other bytes refused).
Runs in the installation's venv (the wheelhouse reads wheels with `packaging`).

    python -m aamp.bundle.wheelhouse BUNDLE [--trust PUBKEY]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from aamp.bundle import manifest
from aamp.bundle.create import WHEELHOUSE_PART
from aamp.config import Settings
from aamp.sandbox.wheelhouse import Wheel, Wheelhouse, WheelhouseError


def add_bundled(bundle: Path, settings: Settings, trust: Path | None = None) -> list[Wheel]:
    """Add the bundle's wheelhouse wheels to the installation's wheelhouse (all or none);
    the wheels added, [] when the bundle carries none."""
    made = manifest.load(bundle)
    with tempfile.TemporaryDirectory(prefix="aamp-bundle-wheels-") as tmp:
        copies = manifest.copy_verified(bundle, WHEELHOUSE_PART, Path(tmp), trust=trust)
        if not copies:
            return []
        by = f"scripts/install --bundle (made {made.get('created')})"
        # A first install makes $AAMP_HOME here, before `aamp up` would: as private as it would.
        settings.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        return Wheelhouse(settings).add_files(copies, by=by)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aamp.bundle.wheelhouse", description=__doc__)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--trust", type=Path, metavar="PUBKEY", help="Ed25519 public key (PEM)")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    try:
        added = add_bundled(args.bundle, settings, trust=args.trust)
    except (manifest.BundleRefused, WheelhouseError, RuntimeError) as exc:
        print(f"scripts/install: {exc}", file=sys.stderr)
        print("scripts/install: no wheel was added to the wheelhouse", file=sys.stderr)
        return 1
    if not added:
        print("the bundle carries no wheelhouse packages")
    for wheel in added:
        print(f"  {wheel.name}=={wheel.version}  {wheel.sha256[:16]}  {wheel.filename}")
    print(f"wheelhouse {settings.home / 'wheelhouse'}: {len(added)} wheels from the bundle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
