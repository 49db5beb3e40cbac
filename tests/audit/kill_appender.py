"""Child process for the kill -9 test: many concurrent appends, each ack printed at once.

Usage: python kill_appender.py DATABASE_URL HOME COUNT
Prints "<seq> <request_id>" the moment `append` returns (i.e. after the commit), flushed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aamp.audit import AuditLog
from aamp.config import Settings
from aamp.store import Store


async def main(url: str, home: Path, count: int) -> None:
    settings = Settings(
        home=home, runtime_dir=home / "run", image_dir=home / "img", env={"AAMP_DATABASE_URL": url}
    )
    store = Store.open(settings)
    # Small batches so that the kill lands while most appends are still in flight.
    log = AuditLog.open(settings, store, checkpoint_every=100, max_batch=32)
    await log.start()
    print("ready", flush=True)

    async def one(i: int) -> None:
        await asyncio.sleep((i % 50) / 1000)  # requests arrive over ~50 ms
        rec = await log.append(
            actor="user:load",
            action="api.request",
            resource=f"req:{i}",
            decision="allow",
            request_id=f"kill-{i}",
            details={"i": i},
        )
        sys.stdout.write(f"{rec.seq} {rec.request_id}\n")
        sys.stdout.flush()

    await asyncio.gather(*(one(i) for i in range(count)))
    await asyncio.sleep(3600)  # wait to be killed; never close cleanly


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))
