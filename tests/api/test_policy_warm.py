"""A policy's `warm:` through the API: the stored policies' counts are kept within
AAMP_WARM_POOL_MAX (a write beyond it refused naming `warm`, nothing stored), the manager's
pool targets follow writes and deletes, and a control plane whose stored policies ask for
more than a lowered bound refuses to start, naming them (the plane boots nothing: targets
are what is checked here; tests/runs/test_run_warm.py fills real pools)."""

from __future__ import annotations

from pathlib import Path

import pytest
from api_plane import plane_settings, running_plane  # tests/api/conftest.py

from aamp.policy import Resources
from aamp.sandbox import WarmTotalExceeded
from aamp.sandbox.warm_pool import boot_key


def policy(name: str, warm: int, pids: int) -> dict[str, object]:
    return {"name": name, "image": "base", "resources": {"pids": pids}, "warm": warm}


async def test_warm_counts_are_bounded_and_followed(tmp_path: Path) -> None:
    settings = plane_settings(tmp_path, AAMP_WARM_POOL_MAX="5")
    async with running_plane(settings) as plane:
        targets = plane.cp.manager.pool_targets
        key = boot_key(plane.cp.manager.default_driver, "base", Resources(pids=100))
        async with plane.client(plane.admin_token) as admin:
            for name, warm in (("a", 2), ("b", 3)):
                r = await admin.put(f"/v1/policies/{name}", json=policy(name, warm, 100))
                assert r.status_code == 200, r.text
                assert r.json()["warm"] == warm
            assert targets.target(key) == 5  # one boot key: one pool, the counts added
            over = await admin.put("/v1/policies/c", json=policy("c", 1, 200))
            assert over.status_code == 400, over.text
            assert over.json()["message"] == (
                "invalid policy:\n  warm: 6 sandboxes would be kept warm (policy a 2, "
                "policy b 3, policy c 1), over AAMP_WARM_POOL_MAX (5); lower a policy's warm "
                "or raise AAMP_WARM_POOL_MAX"
            )
            assert (await admin.get("/v1/policies/c")).status_code == 404
            # Lowering one makes room; a policy rewritten elsewhere leaves the old pool.
            r = await admin.put("/v1/policies/b", json=policy("b", 2, 300))
            assert r.status_code == 200, r.text
            assert targets.target(key) == 2
            assert targets.target(boot_key(key.driver, "base", Resources(pids=300))) == 2
            r = await admin.put("/v1/policies/c", json=policy("c", 1, 200))
            assert r.status_code == 200, r.text
            assert (await admin.delete("/v1/policies/a")).status_code == 204
            assert targets.target(key) == 0
            bad = await admin.put("/v1/policies/d", json=policy("d", -1, 100))
            assert bad.status_code == 400
            assert "warm: must be between 0 and 32, got -1" in bad.json()["message"]

    lowered = plane_settings(tmp_path, AAMP_WARM_POOL_MAX="2")
    with pytest.raises(WarmTotalExceeded, match=r"\(policy b 2, policy c 1\), over"):
        async with running_plane(lowered):
            pass
