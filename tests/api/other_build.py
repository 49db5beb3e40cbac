"""`OtherBuild`: another builder of an image in the same image directory (as `aamp image build`
in another process is), holding the image's build lock, so a build the API starts waits for it
— and says so, live — until it `finish`es: it leaves a finished image where the builder's own
cache check finds it (the files `ImageStore` reads: image.json, rootfs/, rootfs.ext4) and
releases the lock. No debootstrap runs, so a test sees a build in progress for as long as it
needs and its end in a moment."""

from __future__ import annotations

import fcntl
import json
import os
from datetime import UTC, datetime
from pathlib import Path

from aamp.config import Settings
from aamp.egress.ca import ca_cert_path
from aamp.sandbox.images import ImageStore


class OtherBuild:
    def __init__(self, settings: Settings, name: str) -> None:
        self.name = name
        self.hash = ImageStore(settings).content_hash(name, ca_cert=ca_cert_path(settings))
        self.directory = settings.image_dir / name
        self.directory.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def finish(self) -> Path:
        built = self.directory / self.hash
        (built / "rootfs").mkdir(parents=True)
        (built / "rootfs.ext4").write_bytes(b"\0" * 4096)
        meta = {
            "name": self.name,
            "content_hash": self.hash,
            "size_bytes": 1 << 20,
            "ext4_bytes": 4096,
            "built_at": datetime.now(UTC).isoformat(),
            "build_seconds": 1.0,
        }
        (built / "image.json").write_text(json.dumps(meta))
        self.release()
        return built

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
