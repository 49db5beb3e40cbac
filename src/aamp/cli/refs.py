"""What a user types for an agent (its id or its name) → the agent's id; the one rule, which
the SDK holds (`client.agents.id_of`) and every command uses.

`ag-…` is an agent's id and only ever an id; anything else is a name. Either is matched
exactly against the agents the caller can see, and one that matches none is refused before
any other request. So an agent whose name looks like an id never stands in for the agent that
has that id (an agent named `ag-…` is reached by its id), and a wrong id is said as such,
whatever the route it was meant for would have answered.
"""

from __future__ import annotations

from aamp.client import ClientError

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from aamp.client import Client


def agent_id(client: Client, ref: str) -> str:
    try:
        return client.agents.id_of(ref)
    except ClientError as exc:
        if exc.code != "not_found":
            raise
        raise ValueError(exc.message) from None
