"""Where lifecycle and egress events go without an audit log (tests, tools, a sandbox host on
another machine): the process log.
"""

from __future__ import annotations

import logging
from typing import Unpack

from aamp.audit import EventFields
from aamp.egress.ledger import EgressEvent

log = logging.getLogger("aamp.sandbox")


class LogRecorder:
    """Writes lifecycle events to the process log; for use without an audit log (tests, tools).
    Has the signature of `aamp.audit.AuditSink.record`, which the control plane passes in."""

    async def record(self, **event: Unpack[EventFields]) -> None:
        fields = ("actor", "action", "resource", "decision", "reason", "details")
        log.info("%s %s %s %s %s %s", *(event.get(name) for name in fields))


class LogEgressSink:
    """Writes egress ledger events to the process log; for use without an audit log."""

    async def record(self, event: EgressEvent) -> None:
        log.info("egress %s", event.to_json())
