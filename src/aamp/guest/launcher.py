#!/usr/bin/python3 -IS
import sys

sys.path.insert(0, "/opt/aamp/lib")
from aamp.guest.agent import main

raise SystemExit(main())
