"""`POST /v1/images/NAME/build` (`aamp image build`'s twin) and its live progress: only admins
start or follow a build (operators and builders get 403, each refusal on record with the
actor); a second build of an image while one runs is refused (409 naming the running build,
on record) and nothing is started; the progress arrives as server-sent events while the build
runs, a follower who comes late gets it from the first line, and the end is on record with the
hash built. The build waits on another builder's lock (`OtherBuild`), so no debootstrap runs."""

from __future__ import annotations

import asyncio
import json

from api_plane import plane_settings, running_plane
from other_build import OtherBuild


def _events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if "event" in fields:
            out.append((fields["event"], json.loads(fields["data"])))
    return out


async def _until(predicate, client, path: str, seconds: float = 30.0) -> dict:
    for _ in range(int(seconds / 0.1)):
        shown = (await client.get(path)).json()
        if predicate(shown):
            return shown
        await asyncio.sleep(0.1)
    raise AssertionError(f"{path} never reached the state: {shown}")


def _audit(plane, action: str) -> list[dict]:
    from sqlalchemy import text

    with plane.cp.store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT * FROM audit_records WHERE action = :a ORDER BY seq"), {"a": action}
        ).mappings()
        return [dict(r) for r in rows]


async def test_only_admins_build_images_and_follow_the_progress(tmp_path) -> None:
    async with running_plane(plane_settings(tmp_path)) as plane:
        tokens = [await plane.user("bea", "builder"), await plane.user("olga", "operator")]
        for token in tokens:
            async with plane.client(token) as c:
                r = await c.post("/v1/images/base/build", json={})
                assert r.status_code == 403, r.text
                assert (await c.get("/v1/images/base/build/events")).status_code == 403
        denied = [r for r in _audit(plane, "image.build") if r["decision"] == "deny"]
        assert {r["actor"] for r in denied} == {"user:bea", "user:olga"}
        assert not (plane.cp.settings.image_dir / "base").exists()  # nothing was started
        assert plane.cp.builds.last("base") is None


async def test_a_build_shows_its_progress_live_and_a_second_one_is_refused(tmp_path) -> None:
    settings = plane_settings(tmp_path)
    async with running_plane(settings) as plane:
        other = OtherBuild(settings, "base")
        try:
            async with plane.client(plane.admin_token, timeout=60) as c:
                unknown = await c.post("/v1/images/nosuch/build", json={})
                assert unknown.status_code == 404 and "base" in unknown.json()["message"]
                started = await c.post("/v1/images/base/build", json={})
                assert started.status_code == 202, started.text
                assert started.json()["state"] == "running"
                # The build is running (waiting for the other builder), and says so.
                shown = await _until(lambda b: b["lines"] >= 1, c, "/v1/images/base/build")
                assert shown["state"] == "running"
                again = await c.post("/v1/images/base/build", json={"force": True})
                assert again.status_code == 409, again.text
                message = again.json()["message"]
                assert "already being built (started by user:admin" in message
                assert "one build of an image at a time" in message
                refused = [r for r in _audit(plane, "image.build") if r["decision"] == "deny"]
                assert len(refused) == 1 and refused[0]["actor"] == "user:admin"
                assert "already being built" in refused[0]["reason"]
                # A follower who joins while it runs sees the lines so far, then the end once
                # the other build is done (httpx's ASGI transport gives the body at its end:
                # the browser test sees the lines arrive one by one).
                following = asyncio.create_task(c.get("/v1/images/base/build/events"))
                await asyncio.sleep(0.5)
                assert not following.done()  # the stream stays open while the build runs
                built = other.finish()
                events = _events((await following).text)
                assert "waiting for another build of 'base'" in events[0][1]["line"]
                finished = [d for e, d in events if e == "finished"]
                assert finished and finished[0]["state"] == "built"
                assert finished[0]["image"]["hash"] == other.hash
                late = await c.get("/v1/images/base/build/events")
                kinds = [e for e, _ in _events(late.text)]
                assert kinds[0] == "progress" and kinds[-1] == "finished"
                assert "up to date" in late.text
                assert [i["hash"] for i in (await c.get("/v1/images")).json()] == [other.hash]
            assert (built / "image.json").is_file()
        finally:
            other.release()
        ends = _audit(plane, "image.build_finished")
        assert len(ends) == 1 and ends[0]["decision"] == "allow"
        assert ends[0]["actor"] == "user:admin" and other.hash in ends[0]["details"]
