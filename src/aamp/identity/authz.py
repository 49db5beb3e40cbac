"""`allowed(actor, action, resource)`: the one function that decides every request.

Every API route names an action and how to find its resource; the API's single guard
dependency calls this function and records the `Decision` (allowed or not, the reason, and
the grant that allowed it) in the audit log. Nothing else decides access: every fact a refusal
depends on (an inline policy, what is granted to the agent, whether a version is published)
arrives in the `Resource`, so the recorded decision is the final one and no route refuses on
its own afterwards. An action missing from `RULES` is denied, so a new route without a rule
is refused, not let through.

The rules, in words:

- public actions (health, logging in) are open to anyone; every other action needs a signed-in
  user (reading the OpenAPI document too), and an admin may do all of them — except change
  their own role or status, or grant themselves access (nobody can);
- users read themselves and change their own password; tokens are their owner's (or an admin's);
- builders read policies, services and secret metadata (never values), and create agents (they
  own what they create, which counts as `edit`); admins and builders make, fill, change and
  remove knowledge bases;
- on an agent: `view` reads it and the resources it is granted; `run` makes sandboxes for it;
  `edit` shares it with grants. Operators never get more than `run`, whatever a grant says;
- a non-admin makes a sandbox only for an agent they can `run`, from a named policy; only
  admins give a policy inline or make a sandbox without one. They see and use only sandboxes
  they created, and only while they can still run its agent;
- an agent uses only what an admin granted it: a sandbox made for an agent (by anyone, admins
  included) and every run of it need the policy, its image and each of its services granted
  to that agent, and a run also its model endpoint — confirmed by an admin — and each
  knowledge base it searches;
- agent versions: `view` reads the published ones; `edit` also reads and saves the draft,
  publishes it, and test-runs it (the draft, or any unpublished number); `run` starts runs of
  published versions, by number or `latest`; what a run's input files may be (its policy's
  `data.inbound`, for a check before upload) is read by exactly those who may start it;
- a run is seen, followed, cancelled and its artifacts downloaded by its owner (while they can
  still `run` its agent), by users with `edit` on its agent, and by admins — so operators never
  see each other's runs;
- a run's approval request is answered by whoever watches the run for its owner: the run's
  owner while they can still `run` its agent (the person who gave the task decides what it
  may send out, in the live view), users with `edit` on its agent, and admins — never by
  another operator, who cannot see the run;
- the audit log, users, roles, policies, services, model endpoints, secrets and agent
  resources are changed by admins only (builders read model endpoints like services); only
  admins read the audit log.
"""

from __future__ import annotations

from collections.abc import Callable

from aamp.identity.model import ROLE_CEILING, Actor, Decision, Level, Resource, Role

Rule = Callable[[Actor, Resource], Decision]


def _allow(reason: str, grant_id: int | None = None) -> Decision:
    return Decision(True, reason, grant_id)


def _deny(reason: str) -> Decision:
    return Decision(False, reason)


def _public(_: Actor, __: Resource) -> Decision:
    return _allow("public route")


def _signed_in(actor: Actor, _: Resource) -> Decision:
    return _allow(f"signed in as {actor.role}")


def _roles(*roles: Role) -> Rule:
    names = " or ".join(r.value for r in roles)

    def rule(actor: Actor, _: Resource) -> Decision:
        if actor.role in roles:
            return _allow(f"role {actor.role} may do this")
        return _deny(f"only {names} may do this; {actor.audit_name} is {actor.role}")

    return rule


def _admin_only(actor: Actor, resource: Resource) -> Decision:
    return _roles(Role.ADMIN)(actor, resource)


def _self_or_admin(actor: Actor, resource: Resource) -> Decision:
    if resource.subject_user == actor.username:
        return _allow("acting on themselves")
    if actor.role is Role.ADMIN:
        return _allow("role admin may do this")
    return _deny("only the user themselves or an admin may do this")


def _change_user(actor: Actor, resource: Resource) -> Decision:
    if resource.subject_user == actor.username:
        return _deny("nobody changes their own role or status")
    return _admin_only(actor, resource)


def _owner_or_admin(actor: Actor, resource: Resource) -> Decision:
    if actor.role is Role.ADMIN:
        return _allow("role admin may do this")
    if resource.owner is not None and resource.owner == actor.username:
        return _allow(f"{actor.audit_name} owns {resource}")
    return _deny(f"{resource} is not {actor.audit_name}'s")


def _level(actor: Actor, agent: str | None, needed: Level) -> Decision:
    """Does the actor hold `needed` on `agent` (admins hold everything)?"""
    if actor.role is Role.ADMIN:
        return _allow("role admin may do this")
    access = actor.agents.get(agent) if agent else None
    if access is None:
        return _deny(f"{actor.audit_name} has no grant on agent:{agent}")
    assert actor.role is not None
    ceiling = ROLE_CEILING[actor.role]
    effective = access.level if ceiling.implies(access.level) else ceiling
    if effective.implies(needed):
        return _allow(f"{access.source} gives {access.level} on agent:{agent}", access.grant_id)
    capped = f" (capped at {ceiling} for role {actor.role})" if effective != access.level else ""
    return _deny(
        f"{access.source} gives {access.level}{capped} on agent:{agent}; {needed} is needed"
    )


def _on_agent(needed: Level) -> Rule:
    def rule(actor: Actor, resource: Resource) -> Decision:
        return _level(actor, resource.agent, needed)

    return rule


def _grant_create(actor: Actor, resource: Resource) -> Decision:
    if resource.subject_user is not None and resource.subject_user == actor.username:
        return _deny("nobody grants themselves access")
    if resource.subject_role is not None and resource.subject_role == actor.role:
        return _deny("nobody grants access to their own role (it includes themselves)")
    return _level(actor, resource.agent, Level.EDIT)


def _only_granted(resource: Resource, decision: Decision) -> Decision:
    """`decision`, unless the request would make the agent use something not granted to it —
    which no role overrides: an agent uses only what an admin granted it."""
    missing = resource.ungranted
    if not missing:
        return decision
    agent = resource.agent
    if len(missing) == 1:
        return _deny(
            f"{missing[0]} is not granted to agent:{agent}; an admin grants it with "
            f"`aamp grant attach {agent} {missing[0].replace(':', ' ', 1)}`"
        )
    return _deny(
        f"{', '.join(missing)} are not granted to agent:{agent}; an admin grants each with "
        f"`aamp grant attach {agent} KIND NAME`"
    )


def _published_only(actor: Actor, resource: Resource, decision: Decision, verb: str) -> Decision:
    """Below `edit`, only published versions are used (by number or `latest`)."""
    if resource.unpublished is None:
        return decision
    editor = _level(actor, resource.agent, Level.EDIT)
    if editor.allowed:
        return editor
    asked = "the draft" if resource.unpublished == "draft" else f"version {resource.unpublished}"
    return _deny(
        f"{asked} of agent:{resource.agent} is not a published version; below edit only "
        f"published versions {verb}, by number or latest ({editor.reason})"
    )


def _sandbox_create(actor: Actor, resource: Resource) -> Decision:
    if actor.role is Role.ADMIN:
        decision = _allow("role admin may do this")
    elif resource.admin_only is not None:
        return _deny(resource.admin_only)
    else:
        decision = _level(actor, resource.agent, Level.RUN)
        if not decision.allowed:
            return decision
    return _only_granted(resource, decision)


def _run_create(actor: Actor, resource: Resource) -> Decision:
    decision = _level(actor, resource.agent, Level.RUN)
    if not decision.allowed:
        return decision
    decision = _only_granted(resource, _published_only(actor, resource, decision, "run"))
    if decision.allowed and resource.unconfirmed is not None:
        name = resource.unconfirmed
        return _deny(
            f"model endpoint {name} is not confirmed: migration 0005 made it from the agent's "
            f"former inline base_url and api_key_secret; an admin checks its URL and secret "
            f"(`aamp model-endpoint show {name}`) and confirms it with "
            f"`aamp model-endpoint confirm {name}`"
        )
    return decision


def _version_read(actor: Actor, resource: Resource) -> Decision:
    decision = _level(actor, resource.agent, Level.VIEW)
    if not decision.allowed:
        return decision
    return _published_only(actor, resource, decision, "are read")


def _sandbox_use(actor: Actor, resource: Resource) -> Decision:
    if actor.role is Role.ADMIN:
        return _allow("role admin may do this")
    if resource.owner is None or resource.owner != actor.username:
        return _deny(f"{resource} is not {actor.audit_name}'s")
    return _level(actor, resource.agent, Level.RUN)


def _sandbox_file(actor: Actor, resource: Resource) -> Decision:
    """A file into or out of a sandbox: its user, within the data rules of the policy it was
    made from — which no role overrides."""
    decision = _sandbox_use(actor, resource)
    if decision.allowed and resource.data_refused is not None:
        return _deny(resource.data_refused)
    return decision


def _run_access(actor: Actor, resource: Resource) -> Decision:
    if actor.role is Role.ADMIN:
        return _allow("role admin may do this")
    editor = _level(actor, resource.agent, Level.EDIT)
    if editor.allowed:
        return _allow(f"{editor.reason}, which sees every run of it", editor.grant_id)
    if resource.owner is None or resource.owner != actor.username:
        return _deny(
            f"{resource} is not {actor.audit_name}'s; only its owner, editors of its agent "
            "and admins see it"
        )
    return _level(actor, resource.agent, Level.RUN)


def _approval_decide(actor: Actor, resource: Resource) -> Decision:
    """An approval is answered by those who see its run (`owner` is the run's owner)."""
    decision = _run_access(actor, resource)
    if decision.allowed:
        return decision
    return _deny(
        f"only the run's owner while they hold run on agent:{resource.agent}, editors of the "
        f"agent and admins answer {resource} ({decision.reason})"
    )


_staff = _roles(Role.ADMIN, Role.BUILDER)

RULES: dict[str, Rule] = {
    # open
    "health.read": _public,
    "session.create": _public,
    # a sandbox host's own calls: its token is checked by the route (aamp.fleet), as a
    # password is by session.create
    "host.register": _public,
    "host.heartbeat": _public,
    # any signed-in user (lists are filtered item by item with the item's own action)
    "session.delete": _signed_in,
    "me.read": _signed_in,
    "api.schema": _signed_in,
    "token.list": _signed_in,
    "token.create": _signed_in,
    "agent.list": _signed_in,
    "image.list": _signed_in,
    "sandbox.list": _signed_in,
    "token.revoke": _owner_or_admin,
    "token.create_for": _admin_only,
    "image.build": _admin_only,
    "image.build_read": _admin_only,
    # users
    "user.list": _admin_only,
    "user.create": _admin_only,
    "user.read": _self_or_admin,
    "user.password": _self_or_admin,
    "user.update": _change_user,
    # agents and grants
    "agent.create": _staff,
    "agent.view": _on_agent(Level.VIEW),
    "agent.delete": _on_agent(Level.EDIT),
    "grant.list": _on_agent(Level.EDIT),
    "grant.create": _grant_create,
    "grant.delete": _on_agent(Level.EDIT),
    "agent_resource.list": _on_agent(Level.VIEW),
    "agent_resource.grant": _admin_only,
    "agent_resource.revoke": _admin_only,
    # agent versions, runs, approvals
    "agent_version.list": _on_agent(Level.VIEW),
    "agent_version.read": _version_read,
    "agent_version.edit": _on_agent(Level.EDIT),
    "agent_version.publish": _on_agent(Level.EDIT),
    "run.create": _run_create,
    "run.inbound": _run_create,  # what a run's inputs may be, to whoever may start it
    "run.list": _signed_in,
    "run.view": _run_access,
    "run.cancel": _run_access,
    "run.artifact": _run_access,
    "approval.list": _signed_in,
    "approval.decide": _approval_decide,
    # catalogue
    "policy.list": _staff,
    "policy.read": _staff,
    "policy.write": _admin_only,
    "policy.delete": _admin_only,
    "service.list": _staff,
    "service.read": _staff,
    "service.write": _admin_only,
    "service.delete": _admin_only,
    "model_endpoint.list": _staff,
    "model_endpoint.read": _staff,
    "model_endpoint.write": _admin_only,
    "model_endpoint.delete": _admin_only,
    "model_endpoint.confirm": _admin_only,
    "secret.list": _staff,
    "secret.read": _staff,
    "secret.write": _admin_only,
    "secret.delete": _admin_only,
    "vault.rotate": _admin_only,
    "audit.read": _admin_only,
    "host.list": _admin_only,
    "host.add": _admin_only,
    "host.drain": _admin_only,
    "host.remove": _admin_only,
    "knowledge_base.list": _staff,
    "knowledge_base.read": _staff,
    "knowledge_base.create": _staff,
    "knowledge_base.change": _staff,
    "knowledge_base.delete": _staff,
    "wheelhouse.list": _staff,
    "wheelhouse.add": _admin_only,
    "wheelhouse.remove": _admin_only,
    # sandboxes
    "sandbox.create": _sandbox_create,
    "sandbox.view": _sandbox_use,
    "sandbox.exec": _sandbox_use,
    "sandbox.file_in": _sandbox_file,
    "sandbox.file_out": _sandbox_file,
    "sandbox.browser": _sandbox_use,
    "sandbox.destroy": _sandbox_use,
}

PUBLIC_ACTIONS = frozenset(a for a, r in RULES.items() if r is _public)


def allowed(actor: Actor, action: str, resource: Resource) -> Decision:
    """Decide one action on one resource; the reason says which rule (and grant) decided."""
    rule = RULES.get(action)
    if rule is None:
        return _deny(f"no authorisation rule for action {action!r}")
    if rule is not _public and not actor.authenticated:
        return _deny("not signed in")
    return rule(actor, resource)
