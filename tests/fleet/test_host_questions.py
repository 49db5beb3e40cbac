"""A sandbox host's `default: ask` questions in its outbox (`HostOutbox`, `LinkApprover`): a
question is handed only to the replica that named itself for that sandbox (every replica
collects from every host), follows the sandbox to another replica that names itself later
(a run taken over), and an answer that never comes is a denial (`expired`); a malformed
answer is a denial too. The replica's side, with a real run and a real host, is in
`test_remote_ask.py`."""

from __future__ import annotations

import asyncio

from aamp.fleet.host_outbox import HostOutbox, LinkApprover

SB = "sb-aaaaaaaaaaaa"


async def test_a_question_goes_only_to_the_replica_answering_for_its_sandbox() -> None:
    outbox = HostOutbox(redeliver=0.05)
    asked = asyncio.create_task(LinkApprover(outbox, SB, timeout=30)("shop.test", 80))
    await asyncio.sleep(0.01)
    assert await outbox.collect([], 0, replica="rep-a") == []  # nobody answers for it yet
    assert await outbox.collect([], 0) == []  # nor a collect naming no replica
    outbox.answer_for(SB, "rep-b")
    assert await outbox.collect([], 0, replica="rep-a") == []
    (item,) = await outbox.collect([], 0, replica="rep-b")
    assert (item["kind"], item["body"]) == ("approve", {"sandbox": SB, "host": "shop.test",
                                                        "port": 80})  # fmt: skip
    # rep-b dies before answering; the run is taken over by rep-a, which names itself.
    outbox.answer_for(SB, "rep-a")
    await asyncio.sleep(0.06)  # offered again once due
    assert await outbox.collect([], 0, replica="rep-b") == []
    (again,) = await outbox.collect([], 0, replica="rep-a")
    assert again["id"] == item["id"]
    assert outbox.answer(item["id"], {"status": "approved", "by": "user:ann", "note": None})
    answer = await asked
    assert (answer.status, answer.by) == ("approved", "user:ann")
    assert not outbox.answer(item["id"], {"status": "denied", "by": "user:bob"})  # once


async def test_no_answer_in_time_or_no_answer_at_all_is_a_denial() -> None:
    outbox = HostOutbox()
    outbox.answer_for(SB, "rep-a")
    expired = await LinkApprover(outbox, SB, timeout=0.1)("late.test", 80)
    assert (expired.status, expired.by) == ("expired", "nobody")
    asked = asyncio.create_task(LinkApprover(outbox, SB, timeout=30)("odd.test", 80))
    await asyncio.sleep(0.01)
    (item,) = await outbox.collect([], 0, replica="rep-a")
    assert outbox.answer(item["id"], {"status": "yes please"})
    odd = await asked
    assert odd.status == "denied" and "not one" in (odd.note or "")
    outbox.answer_for(SB, None)  # the sandbox went: nobody answers for it
    assert outbox.answerers == {}
