"""The `aamp` command (`main`; the console script `aamp = aamp.cli:main`).

- `dispatch` — `main` and the one table of commands;
- `sandbox`, `identity` (user, token, grant, secret), `catalog` (policy, service,
  model-endpoint), `agents` (agent, approval), `runs` (run) — commands over the API, each
  given a signed-in `aamp.client.Client`; `refs` — the one rule for what names an agent;
  `download` — a run's artifacts saved into a directory, checked; `output` — tables and
  sizes; `parsing` — a command's actions and their words; `command` — exit codes, errors;
- `local` — `up`, `doctor`, `model`, `image`, `audit`: the commands that act on this host
  directly, and the only module that imports the server side (inside those commands only).

Start-up is most of what a command costs, so the modules a command loads are kept to the
standard library, the client and the settings (a test holds every API command to that): the
client speaks HTTP/1.1 itself (`aamp.client.http1`: no HTTP package, not even `http.client`);
only the typed command's parser is built; YAML is loaded only by the commands that read a
YAML file; and these modules write `TYPE_CHECKING = False` rather than import `typing`
(~15 ms) only to annotate. Type checkers treat that name as they treat typing's.
"""

from aamp.cli.dispatch import main

__all__ = ["main"]
