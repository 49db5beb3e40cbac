"""The Python SDK of the control plane's /v1 API (`from aamp import Client`); the CLI is
built on it — one client, not two.

- `Client` (`api.py`) — signed in with a bearer token (given, or as the CLI finds one:
  AAMP_TOKEN, the login profile, this host's installation): `client.sandboxes`
  (`sandboxes.py`: a `Sandbox` is a context manager that destroys it on exit, `exec` streams
  to callbacks, `files.write/read`, `screenshot` of a web page through the sandbox's
  egress), `client.agents` (`runs.py`: `run(...)` → a `Run` with
  resumable `events()` and checked `artifacts()`), and generic `call`/`stream` for any route.
- `AsyncClient` (`aio.py`) — the same for asyncio, on the same sync core run in threads.
- `ClientError` — every failure: the API's refusal (its `code`, `message`, HTTP `status`), or
  a control plane that cannot be reached, does not answer in time, or breaks off.
- `Profiles` (`profiles.py`) — the login profiles file `aamp login` writes (0600);
  `login`/`logout` (`login.py`) — a password for an API token, through the API alone.
- `transport` — one keep-alive HTTP/1.1 connection (`http1`: the wire format, on a socket).

It imports nothing of the server side and no third-party package, so a CLI command starts in
tens of milliseconds (its modules write `TYPE_CHECKING = False` rather than import `typing`,
~15 ms, only to annotate; type checkers treat that name as typing's), and names load on first
use (`aamp.surface`): the CLI never loads asyncio or the SDK's resource classes.
"""

from aamp.surface import surface

__all__, __getattr__ = surface(
    __name__,
    """
    api: Client find_credentials find_token
    aio: AsyncClient AsyncSandbox
    login: login logout
    profiles: Profiles
    runs: Artifact Event Run
    sandboxes: ExecResult Sandbox Screenshot
    http1: Head Headers
    transport: USE_CLIENT_DEFAULT ClientError Response Timeout UseClientDefault outgoing
        raise_refusal
    """,
)
