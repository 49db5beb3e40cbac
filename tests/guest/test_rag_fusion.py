"""The hybrid fusion of the knowledge-base search (`aamp.guest.rag_search.fuse`), on the host:
it needs none of the rag image's packages. Its standardisation is done in floats; it must
rank as the exact one (`statistics`) does, and say 0 where the scores do not spread."""

from __future__ import annotations

import random
from statistics import fmean, pstdev

import pytest

from aamp.guest.rag_search import fuse


def _exact(similarity: dict[int, float], lexical: dict[int, float]) -> dict[int, float]:
    """The fusion's definition, with `statistics`' correctly rounded mean and deviation."""

    def z(scores: dict[int, float]) -> dict[int, float]:
        values = list(scores.values())
        spread = pstdev(values) if len(values) > 1 else 0.0
        if spread == 0:
            return dict.fromkeys(scores, 0.0)
        mean = fmean(values)
        return {i: (v - mean) / spread for i, v in scores.items()}

    vector = z(similarity)
    bm25 = z({i: lexical.get(i, 0.0) for i in similarity})
    return {i: vector[i] + bm25[i] for i in similarity}


@pytest.mark.parametrize("seed", range(20))
def test_fusion_in_floats_ranks_as_the_exact_definition(seed: int) -> None:
    rng = random.Random(seed)
    ids = rng.sample(range(10_000), rng.randint(2, 100))
    similarity = {i: rng.uniform(-0.2, 0.95) for i in ids}
    # BM25 matches some candidates only (the others score 0), a few far ahead of the rest.
    lexical = {i: rng.expovariate(0.3) for i in ids if rng.random() < 0.6}
    fused = fuse(similarity, lexical)
    exact = _exact(similarity, lexical)
    assert [i for i, _ in fused] == sorted(exact, key=lambda i: -exact[i])
    for i, score in fused:
        assert score == pytest.approx(exact[i], abs=1e-9)


def test_scores_that_do_not_spread_contribute_nothing() -> None:
    assert fuse({7: 0.5}, {7: 3.0}) == [(7, 0.0)]
    fused = dict(fuse({1: 0.4, 2: 0.4, 3: 0.4}, {2: 5.0}))
    assert fused[2] > fused[1] == fused[3]
    assert fuse({}, {}) == []
    # Identical scores computed in floats: no spread from rounding noise alone.
    assert dict(fuse({1: 0.1, 2: 0.1, 3: 0.1}, {1: 0.3, 2: 0.3, 3: 0.3})) == {1: 0, 2: 0, 3: 0}
