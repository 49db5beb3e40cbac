"""How an `aamp` command fails, and its exit codes."""

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_TIMED_OUT = 124
EXIT_INTERRUPTED = 130


class CommandError(Exception):
    """A command that cannot do what was asked; `main` prints `aamp: MESSAGE` and exits 1."""
