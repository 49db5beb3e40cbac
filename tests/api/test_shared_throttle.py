"""Login throttling shared through the database: two control-plane replicas (two apps, each
with its own runtime directory, sandbox manager and process state) on one real PostgreSQL
count the same failed logins, so a guesser spreading attempts over replicas still meets the
limit once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from api_plane import Plane, running_replicas

from aamp.identity.throttle import DEFAULT_PER_ADDRESS, DEFAULT_PER_USER


@pytest.fixture
async def replicas(tmp_path: Path, postgres_server) -> AsyncIterator[tuple[Plane, Plane]]:  # type: ignore[no-untyped-def]
    async with running_replicas(tmp_path, postgres_server) as pair:
        yield pair


def _login(username: str, password: str) -> dict[str, str]:
    return {"username": username, "password": password}


async def _sign_in(client: httpx.AsyncClient, username: str, password: str) -> int:
    """One login attempt's status; a session it opened is dropped, so the next attempt comes
    without one (an unsafe request with a session cookie needs its CSRF token)."""
    status = (await client.post("/v1/session", json=_login(username, password))).status_code
    client.cookies.clear()
    return status


async def test_failed_logins_on_one_replica_count_on_the_other(
    replicas: tuple[Plane, Plane],
) -> None:
    a, b = replicas
    await a.user("olly", "operator", "olly-password-1")
    async with a.client() as on_a, b.client() as on_b:
        for i in range(DEFAULT_PER_USER):
            assert await _sign_in(on_a if i % 2 else on_b, "olly", "nope-nope") == 401
        for replica in (on_a, on_b):
            locked = await replica.post("/v1/session", json=_login("olly", "olly-password-1"))
            assert locked.status_code == 429, locked.text
            assert "too many failed logins for user 'olly'" in locked.json()["message"]


async def test_a_success_clears_the_user_count_everywhere_but_not_the_address_count(
    replicas: tuple[Plane, Plane],
) -> None:
    a, b = replicas
    await a.user("amy", "operator", "amy-password-1")
    async with a.client() as on_a, b.client() as on_b:
        for _ in range(DEFAULT_PER_USER - 1):
            assert await _sign_in(on_a, "amy", "x-x-x-x-x") == 401
        assert await _sign_in(on_b, "amy", "amy-password-1") == 200
        # The user's count starts again on both replicas after the success...
        for _ in range(DEFAULT_PER_USER - 1):
            assert await _sign_in(on_b, "amy", "x-x-x-x-x") == 401
        assert await _sign_in(on_a, "amy", "amy-password-1") == 200
        # ...while the client address keeps every failure: the rest of its budget, spent
        # over both replicas on names that do not exist, locks the address out.
        spent = 2 * (DEFAULT_PER_USER - 1)
        for i in range(DEFAULT_PER_ADDRESS - spent):
            assert await _sign_in(on_a if i % 2 else on_b, f"ghost{i}", "x-x-x-x-x") == 401
        locked = await on_a.post("/v1/session", json=_login("amy", "amy-password-1"))
        assert locked.status_code == 429
        assert "client address" in locked.json()["message"]


async def test_guesses_at_the_same_moment_on_both_replicas_meet_the_limit_exactly(
    replicas: tuple[Plane, Plane],
) -> None:
    a, b = replicas
    await a.user("gus", "operator", "gus-password-1")
    async with a.client() as on_a, b.client() as on_b:
        # Each attempt is counted in the transaction that checks the count, so of guesses
        # made at once over two replicas only the limit's worth is let through to a password
        # check; the rest are refused as throttled.
        statuses = await asyncio.gather(
            *(
                (on_a if i % 2 else on_b).post("/v1/session", json=_login("gus", f"guess-{i}"))
                for i in range(4 * DEFAULT_PER_USER)
            )
        )
    codes = sorted(r.status_code for r in statuses)
    assert codes == [401] * DEFAULT_PER_USER + [429] * (3 * DEFAULT_PER_USER), codes
