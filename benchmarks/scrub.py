"""Scrubber figures: throughput on a clean stream, and the cost per service request.

For three credentials — a bearer token; basic auth whose user and password are both secrets;
a header template with two secrets — the forms `secret_forms` derives (several dozen
needles each) are scrubbed from a clean stream (`--mib` MiB in `--piece`-byte pieces, as the
proxy reads them) of four kinds of body: JSON-like text, base64, hex, English words. Clean
means no form occurs: the common case, and the one that decides throughput. Per request:
reading the credential (`render`, forms included), building the `Scrubber`, scrubbing ten
response headers and a 2 KiB body. Best of `--runs`, since a shared machine only ever
makes a run slower. Prints a table and writes benchmarks/results/scrub.json.

    .venv/bin/python benchmarks/scrub.py [--mib 100] [--piece 262144] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import sys
import time
from pathlib import Path

MiB = 1024 * 1024
RESULTS = Path(__file__).parent / "results" / "scrub.json"
VALUES = {
    "tok": "bench-" + "5f0c3e9a1b7d24c68e0f3a9b",
    "user": "svc-" + "Q2hLm9xRt_7v",
    "pw": "Jx8+Lq2/Wm4zNc7vBt5yHk3r",
    "k1": "k1-" + "9e4f2a7c0b1d8e6f",
    "k2": "Zk3-Rv8_Tq1mWx5nLp7cYb2hJd9s",
}


class ValuesForBenchmark:
    """A `SecretReader` over fixed values (the vault's own cost is in benchmarks/egress.py)."""

    async def reveal(self, name: str, *, purpose: str) -> str:
        return VALUES[name]


def bodies(rng: random.Random) -> dict[str, bytes]:
    """One MiB of each kind of clean body."""
    text = bytes(
        rng.choice(b'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 {}":,.')
        for _ in range(MiB)
    )
    words = b" ".join(
        rng.choice([b"the", b"service", b"returned", b"an", b"answer", b"with", b"items", b"and"])
        for _ in range(MiB // 5)
    )[:MiB]
    return {
        "json-text": text,
        "base64": base64.b64encode(rng.randbytes(MiB))[:MiB],
        "hex": rng.randbytes(MiB // 2).hex().encode(),
        "words": words,
    }


def best(runs: int, fn) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--piece", type=int, default=256 * 1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from aamp.egress.scrub import Scrubber
    from aamp.egress.services import Basic, Bearer, Header, Service, render

    services = {
        "bearer": Service("a", "https://a.test", Bearer("tok")),
        "basic (user and password secret)": Service(
            "b", "https://b.test", Basic("pw", user_secret="user")
        ),
        "header (two secrets)": Service(
            "c", "https://c.test", Header("X-Key", "K {{secret:k1}}:{{secret:k2}}")
        ),
    }
    kinds = bodies(random.Random(7))
    headers = [b"application/json", b"Thu, 01 Dec 2026 09:00:00 GMT", b"nginx", b"no-cache"]
    headers += [b'W/"5f0c3e"', b"keep-alive", b"req-8f1e2a", b"1234", b"close", b"x"]
    line = b'{"id": 1, "name": "object", "items": [1, 2, 3], "note": "lorem ipsum"}\n'
    small = (line * 32)[:2048]
    reader = ValuesForBenchmark()
    results: dict = {"mib": args.mib, "piece": args.piece, "runs": args.runs, "credentials": {}}
    for label, service in services.items():
        credential = asyncio.run(render(service, reader, "benchmark"))
        entry: dict = {"needles": len(credential.scrub_forms), "throughput_mib_s": {}}
        for kind, block in kinds.items():
            pieces = [block[i : i + args.piece] for i in range(0, len(block), args.piece)]

            def stream(pieces=pieces, forms=credential.scrub_forms) -> None:
                scrubber = Scrubber(forms)
                for _ in range(args.mib):
                    for piece in pieces:
                        scrubber.feed_pieces(piece)
                assert scrubber.flush() is not None and scrubber.hits == 0

            entry["throughput_mib_s"][kind] = args.mib / best(args.runs, stream)

        async def per_request(service=service) -> None:
            for _ in range(200):
                cred = await render(service, reader, "benchmark")
                scrubber = Scrubber(cred.scrub_forms)
                for header in headers:
                    scrubber.scrub(header)
                scrubber.feed_pieces(small)
                scrubber.flush()

        entry["per_request_us"] = best(args.runs, lambda: asyncio.run(per_request())) / 200 * 1e6
        results["credentials"][label] = entry

    print(
        f"clean stream of {args.mib} MiB in {args.piece}-byte pieces (MiB/s, best of {args.runs})"
    )
    names = list(kinds)
    print(
        f"{'credential':34} {'needles':>7} " + " ".join(f"{n:>10}" for n in names) + "  per request"
    )
    for label, entry in results["credentials"].items():
        rates = " ".join(f"{entry['throughput_mib_s'][n]:>10.0f}" for n in names)
        print(f"{label:34} {entry['needles']:>7} {rates}  {entry['per_request_us']:>8.0f} us")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
