"""`python -m aamp`: the `aamp` command (`aamp.cli.main`)."""

from aamp.cli import main

raise SystemExit(main())
