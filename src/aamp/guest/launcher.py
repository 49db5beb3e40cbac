#!/usr/bin/python3 -IS
"""The guest agent's entry point in every image (`/opt/aamp/agent`): the isolated interpreter,
the package from the image's `/opt/aamp/lib`, then `aamp.guest.agent.main`."""

import sys

sys.path.insert(0, "/opt/aamp/lib")
from aamp.guest.agent import main

raise SystemExit(main())
