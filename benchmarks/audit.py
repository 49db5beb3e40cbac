"""Audit log figures: durable appends/s (group commit vs one transaction per record) and
`verify` time for 1,000,000 records. Prints a table, writes benchmarks/results/audit.json.

    python benchmarks/audit.py                    # SQLite
    python benchmarks/audit.py --postgres         # and a throwaway local PostgreSQL
    python benchmarks/audit.py --verify-records 100000 --quick

Every append counted here is durable when acknowledged (SQLite WAL + synchronous=FULL,
PostgreSQL synchronous_commit=on), with the production checkpointing: time-based checkpoints
(`--checkpoint-seconds`, default as in production) and a witness file. Figures are measured,
never asserted.

Each appender awaits its record before appending the next, so N appenders put at most N
records in one group commit: throughput grows with concurrency (a busy control plane has
API requests, exec records and egress ledgers of many sandboxes in flight at once) until
the commit's own cost per record dominates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, select

from aamp.audit import AuditLog, Batching, CheckpointSigner, WitnessFile, verify
from aamp.audit.checkpointer import DEFAULT_SECONDS
from aamp.audit.record import AuditRecord, make_event
from aamp.store import Store
from aamp.store.tables import AuditCheckpointRow, AuditRecordRow
from aamp.store.timestamps import now

# The throwaway PostgreSQL server is a test helper, kept with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pgtemp import TemporaryPostgres

RESULTS = Path(__file__).parent / "results" / "audit.json"


def _event_fields(i: int) -> dict[str, Any]:
    return {
        "actor": f"user:u{i % 50}",
        "action": "sandbox.exec",
        "resource": f"sandbox:sb-{i % 4096:012x}",
        "decision": "allow",
        "reason": "grant run on agent finance-reports",
        "request_id": f"req-{i}",
        "details": {"argv": ["python", "report.py"], "exit": 0, "ms": i % 1000},
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def group_commit(
    url: str, appenders: int, records: int, witness: Path, checkpoint_seconds: float
) -> dict[str, Any]:
    store = Store.from_url(url)
    # As in production: time-based checkpoints and a witness file (fsynced on each line).
    log = AuditLog(
        store,
        CheckpointSigner.generate(),
        batching=Batching(checkpoint_seconds=checkpoint_seconds),
        witness=WitnessFile(witness),
    )
    batch_ms: list[float] = []
    sizes: list[int] = []
    original = log._commit_batch

    def timed(events):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        out = original(events)
        batch_ms.append((time.perf_counter() - t) * 1000)
        sizes.append(len(events))
        return out

    log._commit_batch = timed  # type: ignore[method-assign]
    await log.start()

    async def worker(k: int) -> None:
        for i in range(k, records, appenders):
            await log.append(**_event_fields(i))

    started = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(appenders)))
    elapsed = time.perf_counter() - started
    await log.close()
    with store.engine.connect() as conn:
        checkpoints = conn.execute(select(func.count()).select_from(AuditCheckpointRow)).scalar()
    store.close()
    return {
        "appenders": appenders,
        "records": records,
        "records_per_s": records / elapsed,
        "batches": len(sizes),
        "mean_batch_size": statistics.fmean(sizes),
        "batch_commit_ms_p50": statistics.median(batch_ms),
        "batch_commit_ms_p95": _pct(batch_ms, 0.95),
        "checkpoints": checkpoints,
    }


def one_transaction_per_record(url: str, records: int) -> dict[str, Any]:
    """Baseline: each record its own durable transaction (what a naive log does)."""
    store = Store.from_url(url)
    table = AuditRecordRow.__table__
    prev = "0" * 64
    started = time.perf_counter()
    for i in range(records):
        rec = AuditRecord.chained(i + 1, now(), make_event(_event_fields(i)), prev)
        with store.write_connection() as conn:
            conn.execute(
                insert(table),
                {
                    "seq": rec.seq,
                    "time": rec.time,
                    "actor": rec.actor,
                    "action": rec.action,
                    "resource": rec.resource,
                    "decision": rec.decision,
                    "reason": rec.reason,
                    "request_id": rec.request_id,
                    "details": rec.details_json,
                    "prev_hash": rec.prev_hash,
                    "hash": rec.hash,
                },
            )
        prev = rec.hash
    elapsed = time.perf_counter() - started
    store.close()
    return {"records": records, "records_per_s": records / elapsed}


def verify_million(url: str, records: int) -> dict[str, Any]:
    store = Store.from_url(url)
    signer = CheckpointSigner.generate()
    log = AuditLog(store, signer)
    fill_started = time.perf_counter()
    batch = 5000
    for start in range(0, records, batch):
        log._commit_batch(
            [make_event(_event_fields(i)) for i in range(start, min(records, start + batch))]
        )
    fill = time.perf_counter() - fill_started
    report = verify(store, signer.trusted_keys())
    store.close()
    if not report.ok:
        raise SystemExit(f"verify failed on a clean chain: {report.summary()}")
    return {
        "records": report.records,
        "checkpoints": report.checkpoints,
        "verify_s": report.seconds,
        "verify_records_per_s": report.records / report.seconds,
        "fill_s": fill,
    }


def run_backend(name: str, new_url: Any, args: argparse.Namespace) -> dict[str, Any]:
    scale = 0.2 if args.quick else 1.0
    plan = {
        1: int(2000 * scale),
        10: int(10000 * scale),
        100: int(50000 * scale),
        1000: int(100000 * scale),
    }
    result: dict[str, Any] = {"group_commit": [], "baseline": None, "verify": None}
    with tempfile.TemporaryDirectory(prefix="aamp-bench-witness-") as witnesses:
        for appenders, n in plan.items():
            witness = Path(witnesses) / f"witness-{appenders}.jsonl"
            r = asyncio.run(group_commit(new_url(), appenders, n, witness, args.checkpoint_seconds))
            result["group_commit"].append(r)
            print(
                f"  [{name}] {appenders:>3} appenders: {r['records_per_s']:>9.0f} rec/s"
                f" ({r['checkpoints']} checkpoints)",
                flush=True,
            )
    result["baseline"] = one_transaction_per_record(new_url(), int(2000 * scale))
    print(f"  [{name}] baseline: {result['baseline']['records_per_s']:.0f} rec/s", flush=True)
    if args.verify_records:
        result["verify"] = verify_million(new_url(), args.verify_records)
        print(
            f"  [{name}] verify {args.verify_records}: {result['verify']['verify_s']:.2f}s",
            flush=True,
        )
    return result


def print_table(results: dict[str, Any]) -> None:
    print()
    print(f"{'backend':<11}{'mode':<28}{'records/s':>11}{'batch p50 ms':>14}{'batch p95 ms':>14}")
    for backend, res in results["backends"].items():
        for r in res["group_commit"]:
            mode = f"group commit, {r['appenders']} appenders"
            print(
                f"{backend:<11}{mode:<28}{r['records_per_s']:>11.0f}"
                f"{r['batch_commit_ms_p50']:>14.2f}{r['batch_commit_ms_p95']:>14.2f}"
            )
        b = res["baseline"]
        print(f"{backend:<11}{'1 transaction per record':<28}{b['records_per_s']:>11.0f}")
        v = res["verify"]
        if v:
            print(
                f"{backend:<11}{'verify ' + str(v['records']) + ' records':<28}"
                f"{v['verify_s']:>10.2f}s"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--postgres", action="store_true", help="also run on a local PostgreSQL")
    ap.add_argument("--verify-records", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="fewer appends (a smoke run)")
    ap.add_argument(
        "--checkpoint-seconds",
        type=float,
        default=DEFAULT_SECONDS,
        help="the time-based checkpoint interval (AAMP_AUDIT_CHECKPOINT_SECONDS)",
    )
    args = ap.parse_args()
    results: dict[str, Any] = {
        "python": sys.version.split()[0],
        "machine": platform.platform(),
        "backends": {},
    }
    with tempfile.TemporaryDirectory(prefix="aamp-bench-") as tmp:
        counter = iter(range(1_000_000))
        results["backends"]["sqlite"] = run_backend(
            "sqlite", lambda: f"sqlite:///{tmp}/bench-{next(counter)}.db", args
        )
    if args.postgres:
        with TemporaryPostgres() as pg:
            counter = iter(range(1_000_000))

            def pg_url() -> str:
                u = pg.create_database(f"bench_{next(counter)}")
                return u.render_as_string(hide_password=False)

            results["backends"]["postgresql"] = run_backend("postgresql", pg_url, args)
    print_table(results)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
