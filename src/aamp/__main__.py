from aamp.cli import main

raise SystemExit(main())
