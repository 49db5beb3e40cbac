"""The agent's command line: its few options, read by hand (argparse would cost start-up time
in the guest, see `aamp.guest.agent`)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time
if TYPE_CHECKING:
    from typing import Any

DEFAULT_WORKSPACE = "/workspace"
USAGE = (
    "usage: aamp-agent --connect unix:/path|vsock:CID:PORT [--egress ENDPOINT] "
    "[--workspace DIR] [--retry-seconds N] [--init] [--hostname NAME] "
    "[--handoff-fd FD] [--forwarder-fd FD]"
)


class UsageError(ValueError):
    pass


def parse_args(argv: list[str]) -> dict[str, Any]:
    """The options as a dict; `UsageError` (a `ValueError`) names what is wrong."""
    opts: dict[str, Any] = {
        "connect": None,
        "egress": None,
        "workspace": DEFAULT_WORKSPACE,
        "retry_seconds": 10.0,
        "init": False,
        "hostname": "sandbox",
        # Set by the first stage (`first_stage.c`): where it hands over the requests it does
        # not serve itself, and the egress forwarder's socket it already bound.
        "handoff_fd": None,
        "forwarder_fd": None,
    }
    takes_value = {
        "--connect",
        "--egress",
        "--workspace",
        "--retry-seconds",
        "--hostname",
        "--handoff-fd",
        "--forwarder-fd",
    }
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=")
        if name == "--init" and not eq:
            opts["init"] = True
        elif name in takes_value:
            if eq:
                value = inline
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise UsageError(f"{name} needs a value")
            key = name[2:].replace("-", "_")
            if key == "retry_seconds":
                try:
                    value = float(value)
                except ValueError:
                    raise UsageError(f"--retry-seconds must be a number, got {value!r}") from None
            elif key in ("handoff_fd", "forwarder_fd"):
                if not value.isdigit():
                    raise UsageError(f"{name} must be a file descriptor number, got {value!r}")
                value = int(value)
            opts[key] = value
        else:
            raise UsageError(f"unknown argument {arg!r}")
        i += 1
    if not opts["connect"]:
        raise UsageError("--connect is required")
    return opts
