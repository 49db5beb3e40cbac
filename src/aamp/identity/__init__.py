"""Identity and authorisation: users with one role, API tokens, UI sessions, per-agent grants.

- `model` — Role, Level, Actor, Resource, Decision (small frozen values);
- `authz.allowed(actor, action, resource)` — the one function that decides every request;
- `Directory` — users, tokens, sessions and grants on agents in the store;
- `LoginThrottle`, `bootstrap` — failed-login lockout; the first admin and the CLI token.

Names load on first use (`aamp.surface`), so deciding (`allowed` on an `Actor`) loads no
database. The CLI reads its token itself (`aamp.client`) and loads nothing of identity.
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    authz: PUBLIC_ACTIONS RULES allowed
    bootstrap: ensure_cli_token ensure_first_admin
    credentials: digest generate_password same
    directory: SESSION_HOURS USERNAME_RE Directory GrantInfo TokenInfo UserInfo
    errors: AuthenticationFailed Throttled
    model: ANONYMOUS Actor AgentAccess Decision Level Resource Role
    throttle: LoginThrottle
    """,
)
