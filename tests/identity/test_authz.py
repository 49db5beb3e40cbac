"""`allowed()` on its own: decisions carry the reason and the grant that allowed them."""

from __future__ import annotations

from types import MappingProxyType

from aamp.identity import Actor, Level, Resource, Role, allowed
from aamp.identity.model import AgentAccess


def actor(role: Role, **agents: AgentAccess) -> Actor:
    return Actor("u", role, user_id=1, via="token", agents=MappingProxyType(agents))


def test_grant_levels_imply_each_other_and_name_the_grant() -> None:
    a = actor(Role.BUILDER, ag1=AgentAccess(Level.RUN, "grant #7 to user u", 7))
    run = allowed(a, "sandbox.create", Resource("sandbox", agent="ag1"))
    assert run.allowed and run.grant_id == 7 and "grant #7" in run.reason
    assert allowed(a, "agent.view", Resource("agent", "ag1", agent="ag1")).allowed
    edit = allowed(a, "grant.list", Resource("agent", "ag1", agent="ag1"))
    assert not edit.allowed and "edit is needed" in edit.reason


def test_operators_are_capped_at_run() -> None:
    a = actor(Role.OPERATOR, ag1=AgentAccess(Level.EDIT, "grant #1 to role operator", 1))
    d = allowed(a, "grant.create", Resource("agent", "ag1", agent="ag1", subject_user="x"))
    assert not d.allowed and "capped at run" in d.reason


def test_unknown_actions_and_anonymous_are_denied() -> None:
    assert not allowed(actor(Role.ADMIN), "no.such.action", Resource("x")).allowed
    assert not allowed(Actor.anonymous(), "me.read", Resource("me")).allowed
    assert allowed(Actor.anonymous(), "health.read", Resource("health")).allowed


def test_sandbox_from_a_policy_not_granted_to_the_agent_is_denied() -> None:
    a = actor(Role.OPERATOR, ag1=AgentAccess(Level.RUN, "grant #2", 2))
    d = allowed(a, "sandbox.create", Resource("sandbox", agent="ag1", ungranted=("policy:p",)))
    assert not d.allowed and "not granted" in d.reason


def test_an_agent_uses_only_what_is_granted_to_it_whoever_asks() -> None:
    resource = Resource("sandbox", agent="ag1", ungranted=("image:browser", "service:crm"))
    for who in (actor(Role.ADMIN), actor(Role.OPERATOR, ag1=AgentAccess(Level.RUN, "g", 2))):
        d = allowed(who, "sandbox.create", resource)
        assert not d.allowed
        assert "image:browser, service:crm are not granted to agent:ag1" in d.reason
    one = allowed(
        actor(Role.ADMIN), "run.create", Resource("agent", agent="ag1", ungranted=("policy:p",))
    )
    assert not one.allowed and "aamp grant attach ag1 policy p" in one.reason


def test_only_admins_give_a_policy_inline() -> None:
    why = "policy_document: only admins give a policy inline"
    resource = Resource("sandbox", agent="ag1", admin_only=why)
    runner = actor(Role.BUILDER, ag1=AgentAccess(Level.EDIT, "owner of agent:ag1"))
    assert allowed(runner, "sandbox.create", resource).reason == why
    assert not allowed(runner, "sandbox.create", resource).allowed
    assert allowed(actor(Role.ADMIN), "sandbox.create", resource).allowed


def test_below_edit_only_published_versions_run_or_are_read() -> None:
    runner = actor(Role.OPERATOR, ag1=AgentAccess(Level.RUN, "grant #3 to user u", 3))
    editor = actor(Role.BUILDER, ag1=AgentAccess(Level.EDIT, "grant #4 to user u", 4))
    for unpublished in ("draft", "5"):
        asked = Resource("agent", "ag1", agent="ag1", unpublished=unpublished)
        refused = allowed(runner, "run.create", asked)
        assert not refused.allowed and "is not a published version" in refused.reason
        assert "edit is needed" in refused.reason
        assert not allowed(runner, "agent_version.read", asked).allowed
        assert allowed(editor, "run.create", asked).grant_id == 4
        assert allowed(editor, "agent_version.read", asked).allowed
    published = Resource("agent", "ag1", agent="ag1")
    assert allowed(runner, "run.create", published).grant_id == 3
    assert (
        "version 5 of agent:ag1"
        in allowed(
            runner, "run.create", Resource("agent", "ag1", agent="ag1", unpublished="5")
        ).reason
    )
