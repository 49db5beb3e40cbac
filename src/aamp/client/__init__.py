"""The Python client of the control plane's /v1 API; the CLI is built on it.

- `Client` — the API as calls (`call`, `stream`, and the sandbox routes), signed in with a
  bearer token; `Client.from_settings` finds the installation's address and the CLI's token.
- `ClientError` — every failure: the API's refusal (its `code`, `message`, HTTP `status`), or
  a control plane that cannot be reached, does not answer in time, or breaks off.
- `transport` — one keep-alive HTTP/1.1 connection on the standard library's `http.client`.

It imports nothing of the server side and no third-party package, so a CLI command starts in
tens of milliseconds (its modules write `TYPE_CHECKING = False` rather than import `typing`,
~15 ms, only to annotate; type checkers treat that name as typing's). It is the start of the
SDK (`from aamp import Client`), not yet exported from `aamp` itself.
"""

from aamp.client.api import Client, find_token
from aamp.client.transport import ClientError, Response

__all__ = ["Client", "ClientError", "Response", "find_token"]
