"""`aamp doctor`: what works on this host for running sandboxes, and why not, in plain words."""

from __future__ import annotations

import shutil

from aamp.bundle import offline_status
from aamp.config import Settings
from aamp.sandbox.drivers import probe_all


def report(settings: Settings) -> tuple[str, bool]:
    lines = [f"aamp home: {settings.home}", f"runtime dir: {settings.runtime_dir}", ""]
    statuses = probe_all(settings)
    for status in statuses:
        mark = "ok  " if status.usable else "no  "
        lines.append(f"{mark}{status.name}: {status.reason}")
    lines.append("")
    for tool, package in (("debootstrap", "debootstrap"), ("mkfs.ext4", "e2fsprogs")):
        found = shutil.which(tool)
        lines.append(
            f"{'ok  ' if found else 'no  '}{tool}: "
            + (found if found else f"missing; install the Debian package `{package}`")
        )
    built_names: set[str] = set()
    try:
        from aamp.sandbox.images import ImageStore

        built = ImageStore(settings).list()
        built_names = {i.name for i in built}
        names = ", ".join(f"{i.name} ({i.content_hash[:12]})" for i in built) or "none yet"
        lines.append(f"images built: {names}")
    except Exception as exc:  # the doctor reports, it never fails on a broken store
        lines.append(f"images: cannot read the image store: {exc}")
    lines += offline_status(settings, built_names)[1]
    usable = [s.name for s in statuses if s.usable]
    lines.append("")
    lines.append(
        f"sandboxes can run here with: {', '.join(usable)}"
        if usable
        else "no isolation driver works on this host"
    )
    return "\n".join(lines), bool(usable)
