"""Code that runs inside the sandbox: the guest agent and the channel's framing.

Everything under `aamp.guest` is copied into every guest image (under `/opt/aamp/lib`) and run
by the guest's own `/usr/bin/python3` (Debian bookworm: Python 3.11) with `-I -S`. So it uses
the standard library only and never imports anything from `aamp` outside `aamp.guest`: the
host side (`aamp.sandbox.channel`) imports `aamp.guest.wire`, never the other way round. The
one exception is the browser driver (`browser_server` and the modules it imports), a process
of its own in the browser image, which also carries Playwright; the agent starts it
(`browser_relay`) and never imports it.
"""

# The host's side of the contract is the channel's framing, which both sides speak. Imported
# here so that the declared name resolves however the package is first imported (every guest
# process imports it anyway).
from aamp.guest import wire

__all__ = ["wire"]
