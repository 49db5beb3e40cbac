"""`allowed()` on its own: decisions carry the reason and the grant that allowed them."""

from __future__ import annotations

from types import MappingProxyType

from aamp.identity import Actor, Level, Resource, Role, allowed
from aamp.identity.model import AgentAccess


def actor(role: Role, **agents: AgentAccess) -> Actor:
    return Actor("u", role, user_id=1, via="token", agents=MappingProxyType(agents))


def test_grant_levels_imply_each_other_and_name_the_grant() -> None:
    a = actor(Role.BUILDER, ag1=AgentAccess(Level.RUN, "grant #7 to user u", 7))
    run = allowed(a, "sandbox.create", Resource("sandbox", agent="ag1", granted_to_agent=True))
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
    d = allowed(a, "sandbox.create", Resource("sandbox", agent="ag1", granted_to_agent=False))
    assert not d.allowed and "not granted" in d.reason
