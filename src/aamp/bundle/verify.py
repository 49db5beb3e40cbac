"""Checking a bundle on the target: `python3 -m aamp.bundle.verify BUNDLE [--trust PUB]`
(what scripts/install --bundle runs before it installs anything), and `offline_status`, what
`aamp doctor` says about an offline installation (AAMP_BUNDLE).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from aamp.bundle import manifest
from aamp.bundle.create import host_packages, host_target
from aamp.config import Settings
from aamp.sandbox import recipe_names, resolve

# What `aamp doctor` last found intact in the bundle (manifest.verify's `seen`).
SEEN = "bundle-verified.json"


def _missing_host_packages(names: list[str]) -> list[str]:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\n", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    installed = {
        line.split()[0] for line in done.stdout.splitlines() if line.endswith(" installed")
    }
    return [n for n in names if n not in installed]


def offline_status(settings: Settings, built_images: set[str]) -> tuple[bool, list[str]]:
    """(complete, lines): whether this installation has everything it needs with no network
    — a bundle that verifies and was made for these image recipes, the host's packages
    installed — and, when not, which part is missing. Reads only."""
    if settings.bundle is None:
        return False, [
            "offline: no bundle (AAMP_BUNDLE unset): image builds and Firecracker use the "
            "network (pip's index, this host's apt sources)"
        ]
    lines: list[str] = []
    missing: list[str] = []
    try:
        # Each doctor hashes only what changed since the last one (the install hashes all).
        made = manifest.verify(settings.bundle, seen=settings.home / SEEN)
    except manifest.BundleRefused as exc:
        made = None
        missing.append(f"the bundle at {settings.bundle} fails verification: {exc.problems[0]}")
    if made is not None:
        lines.append(
            f"bundle {settings.bundle}: {len(made['files'])} files verified (aamp "
            f"{made.get('aamp', {}).get('version')}, made {made.get('created')})"
        )
        bundled = made.get("recipes", {})
        stale = [n for n in recipe_names() if bundled.get(n) != resolve(n).fingerprint()]
        if stale:
            missing.append(
                f"the bundle was made for other image recipes than {', '.join(stale)} of this "
                "version: make a bundle from this version (scripts/bundle)"
            )
    absent = _missing_host_packages(host_packages())
    if absent:
        missing.append(f"Debian packages not installed: {' '.join(absent)}")
    unbuilt = [n for n in recipe_names() if n not in built_images]
    if unbuilt:  # not missing: they build from the bundle, offline, when first asked for
        lines.append(f"images not built yet (they build from the bundle): {', '.join(unbuilt)}")
    if missing:
        return False, [*lines, *(f"offline: missing: {m}" for m in missing)]
    return True, [
        *lines,
        "offline-complete: the Debian packages, wheels, image recipes and Firecracker all come "
        "from the bundle; nothing needs the network",
    ]


def check_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aamp.bundle.verify", description=__doc__)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--trust", type=Path, metavar="PUBKEY", help="Ed25519 public key (PEM)")
    args = parser.parse_args(argv)
    try:
        made = manifest.verify(args.bundle, trust=args.trust, progress=print)
    except (manifest.BundleRefused, RuntimeError) as exc:
        print(f"scripts/install: {exc}", file=sys.stderr)
        print("scripts/install: nothing was installed", file=sys.stderr)
        return 1
    target = made.get("target", {})
    here = host_target().as_dict()
    wrong = [
        f"{k} {target.get(k)!r} (this host: {v!r})" for k, v in here.items() if target.get(k) != v
    ]
    if wrong:
        print(
            f"scripts/install: the bundle is for another target: {', '.join(wrong)}; make one "
            "with scripts/bundle --release/--arch/--python for this host",
            file=sys.stderr,
        )
        print("scripts/install: nothing was installed", file=sys.stderr)
        return 1
    print(
        f"bundle for Debian {target.get('debian')} {target.get('arch')}, "
        f"Python {target.get('python')}; aamp {made.get('aamp', {}).get('version')} "
        f"({made.get('aamp', {}).get('commit')})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(check_main())
