"""Run history in the UI: newest first, by pages that continue after the last run shown
(keyset, not an offset), filtered by agent and status in the store, and only one's own."""

from __future__ import annotations

import re

from web_helpers import Site

from aamp.runs import RunStore


async def test_run_history_pages_and_filters_and_shows_only_ones_own(site: Site) -> None:
    cp = site.plane.cp
    await site.plane.user("olga", "operator", "olga-password-1")
    await site.plane.user("carl", "operator", "carl-password-1")
    async with site.plane.client(site.plane.admin_token) as api:
        agents = [(await api.post("/v1/agents", json={"name": n})).json()["id"] for n in "ab"]
        for agent in agents:
            for user in ("olga", "carl"):
                r = await api.post(
                    f"/v1/agents/{agent}/grants", json={"user": user, "level": "run"}
                )
                assert r.status_code == 201, r.text
    store = RunStore(cp.store)
    mine = [store.create(agents[i % 2], 1, "olga", f"task {i}").id for i in range(30)]
    theirs = [store.create(agents[0], 1, "carl", "not yours").id for _ in range(3)]
    store.update(mine[0], status="running")
    olga = await site.signed_in("olga", "olga-password-1")

    def ids(html: str) -> list[str]:
        return re.findall(r'<td><a href="/runs/(run-[0-9a-f]+)">', html)

    first = (await olga.get("/runs")).text
    more = re.search(r'href="(/runs\?[^"]*before=[^"]+)"', first).group(1).replace("&amp;", "&")
    second = (await olga.get(more)).text
    shown = ids(first) + ids(second)
    assert len(ids(first)) == 25 and sorted(shown) == sorted(mine)
    assert not set(shown) & set(theirs)
    assert "before=" not in second.split("</table>")[1]  # the last page has no "older"
    by_agent = ids((await olga.get(f"/runs?agent={agents[1]}")).text)
    assert sorted(by_agent) == sorted(mine[1::2])
    assert ids((await olga.get("/runs?status=running")).text) == [mine[0]]
