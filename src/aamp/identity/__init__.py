"""Identity and authorisation: users with one role, API tokens, UI sessions, per-agent grants.

- `model` — Role, Level, Actor, Resource, Decision (small frozen values);
- `authz.allowed(actor, action, resource)` — the one function that decides every request;
- `Directory` — users, tokens, sessions and grants on agents in the store;
- `LoginThrottle`, `bootstrap` — failed-login lockout; the first admin and the CLI token.
"""

from aamp.identity.authz import RULES, allowed
from aamp.identity.directory import Directory
from aamp.identity.errors import AuthenticationFailed, Throttled
from aamp.identity.model import Actor, Decision, Level, Resource, Role
from aamp.identity.throttle import LoginThrottle

__all__ = [
    "RULES",
    "Actor",
    "AuthenticationFailed",
    "Decision",
    "Directory",
    "Level",
    "LoginThrottle",
    "Resource",
    "Role",
    "Throttled",
    "allowed",
]
